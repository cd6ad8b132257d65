"""The calendar error census (``research/calendar_errors.py``) on the teacher's own transcripts: each
flaw the teacher takes lands in its bucket."""

from __future__ import annotations

import pytest

from ait_env.hidden.evaluation import final_text
from cpu.tiny_models.quick_eval import Conversation
from research import calendar_errors as ce
from task_families import get_family
from task_families.teacher import final_content, teacher_completion

FAM = get_family("calendar")


def _conv(inst, flaw: str | None, seed: int) -> tuple[Conversation, list[str]]:
    """The clean teacher, or the teacher taking exactly ``flaw`` (the first decision of that name)."""
    decisions: list[str] = []
    teacher_completion("calendar", inst, mode="clean", seed=seed, decisions=decisions)
    force = decisions.index(flaw) if flaw else None
    comp, used = teacher_completion("calendar", inst, mode="clean", seed=seed, force=force)
    text = final_text(final_content(comp))
    conv = Conversation(instance=inst, messages=comp, final_text=text, score=FAM.check(inst, text))
    return conv, used


def test_the_clean_teacher_is_always_right() -> None:
    convs = [_conv(inst, None, j)[0] for j, inst in enumerate(FAM.generate(11, 40))]
    buckets, by = ce.census(convs)
    assert buckets == {"right": 40}
    assert sum(t for _, t in by.values()) == 40 and all(r == t for r, t in by.values())


@pytest.mark.parametrize("flaw, bucket", [
    ("forget_last:k4", "forgot, slot without them"),
    ("forget_last:k5", "forgot, slot without them"),
    ("ignore_length:60", "ignored length"),
    ("ignore_length:90", "ignored length"),
    ("format:pm", "pm"),
    ("format:label:30", "label"),
])
def test_each_habit_lands_in_its_bucket(flaw: str, bucket: str) -> None:
    seen = 0
    for j, inst in enumerate(FAM.generate(12, 600)):
        decisions: list[str] = []
        teacher_completion("calendar", inst, mode="clean", seed=j, decisions=decisions)
        if flaw not in decisions:
            continue
        conv, used = _conv(inst, flaw, j)
        assert used == [flaw]
        if conv.score < 1.0:  # the habit did not happen to give the right slot
            assert ce.classify(conv) == bucket, (inst.question, conv.final_text)
            seen += 1
    assert seen >= 3


def test_a_wrong_time_after_a_full_lookup_is_a_slip() -> None:
    inst = next(i for i in FAM.generate(13, 50) if i.info["minutes"] == 30 and i.answer != "16:30")
    conv, _ = _conv(inst, None, 0)
    h, m = map(int, inst.answer.split(":"))
    wrong = f"{h + (m + 30) // 60:02d}:{(m + 30) % 60:02d}"
    conv.final_text = f"Answer: {wrong}"
    conv.score = FAM.check(inst, conv.final_text)
    assert conv.score == 0.0 and ce.classify(conv) == "slip"
    conv.final_text = "Answer: soon"
    assert ce.classify(conv) == "no time"


def test_the_forced_first_line_lists_everyone_still_to_look_up() -> None:
    """``--force-lookup`` starts the first reply with the meeting length and every person after the first
    (nobody forgotten), even where the sampling teacher would forget the last one."""
    seen_forgetting = 0
    for j, inst in enumerate(FAM.generate(14, 40)):
        line = ce.full_lookup_line(inst)
        head, names = line.split(":")
        assert head == f"left {inst.info['minutes']}" and line.endswith("\n")
        assert names.split() == (inst.info["people"][1:] or ["none"])
        _, used = teacher_completion("calendar", inst, mode="sample", seed=j)
        seen_forgetting += any(u.startswith("forget_last") for u in used)
    assert seen_forgetting  # the habit the forced line switches off does occur on these questions
