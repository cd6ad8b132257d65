"""Text shown to a person: clipped at a boundary with a marker; surrogate scores labelled."""

from __future__ import annotations

import pytest

from ait_env.observe.display import clip, status_label


def test_text_within_the_limit_is_unchanged() -> None:
    assert clip("short text", 800) == "short text"
    assert clip("x" * 800, 800) == "x" * 800


def test_clip_cuts_at_a_line_break_and_says_how_much_is_left_out() -> None:
    text = "[job]\nbase_model = \"ait-tiny-m\"\n[prime_rl]\nlearning_rate = 3e-6\n" + "a" * 100
    out = clip(text, 60)
    head, marker = out.rsplit("\n", 1)
    assert text.startswith(head) and head.endswith("[prime_rl]")
    assert marker == f"… [cut: {len(text) - len(head):,} more characters]"


def test_clip_cuts_between_words_when_there_is_no_line_break() -> None:
    text = " ".join(f"word{i}" for i in range(400))
    out = clip(text, 100)
    head = out.split(" … [cut: ")[0]
    assert len(head) <= 100 and text.startswith(head + " ")  # a whole word ends the head
    assert out.endswith(f"{len(text) - len(head):,} more characters]")


def test_clip_cuts_a_single_long_word_at_the_limit() -> None:
    out = clip("x" * 5000, 100)
    assert out == "x" * 100 + " … [cut: 4,900 more characters]"
    with pytest.raises(ValueError, match="positive limit"):
        clip("text", 0)


def test_a_surrogate_score_is_never_shown_bare() -> None:
    surrogate = status_label("scored", "stub", True)
    assert surrogate == "scored (SURROGATE: stub backend's formula, nothing trained)"
    assert status_label("scored", "local", False) == "scored"
    assert status_label("invalid", "stub", True) == "invalid"


def test_progress_bars_are_off_when_the_output_is_not_a_terminal() -> None:
    import io

    from ait_env.observe.display import no_bars_unless_terminal

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    env: dict[str, str] = {}
    assert no_bars_unless_terminal(io.StringIO(), env) is True
    assert env == {"TQDM_DISABLE": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}
    mine = {"TQDM_DISABLE": "0"}
    no_bars_unless_terminal(io.StringIO(), mine)
    assert mine["TQDM_DISABLE"] == "0"  # what the user set stays
    tty: dict[str, str] = {}
    assert no_bars_unless_terminal(Tty(), tty) is False and tty == {}


def test_the_local_trainer_logs_plain_progress_lines_off_a_terminal() -> None:
    import io
    from types import SimpleNamespace

    from cpu.executor import _is_terminal, progress_line

    assert not _is_terminal(io.StringIO()) and not _is_terminal(object())
    line = progress_line("units", SimpleNamespace(step=10, reward_mean=0.4234, eval_score=0.5, seconds=2.04), 50)
    assert line == "GRPO units: step 10/50, reward 0.42, eval 0.50 (2.0 s/step)" and "\r" not in line
