"""The per-flaw calibration of the local models (fast: scripted logits, no training)."""

from __future__ import annotations

import pytest
import torch

from cpu.tiny_models import corpus as C
from cpu.tiny_models.tokenizer import ChatTokenizer
from research.flaw_calibration import decision_points, flaw_calibration, format_table
from task_families import FAMILY_NAMES, get_family
from task_families.teacher import get_teacher
from tests.fakes.scripted_lm import FixedLM, PeekingLM


@pytest.fixture(scope="module")
def tok() -> ChatTokenizer:
    return ChatTokenizer(C.train_corpus_tokenizer(C.build_corpus(40).texts(), 1024))


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_every_visible_flaw_has_decision_points_the_model_writes(family: str, tok: ChatTokenizer) -> None:
    seen: set[str] = set()
    n = 300 if family == "calendar" else 80  # a 90-minute meeting whose answer the flaw changes is rare
    for j, inst in enumerate(get_family(family).generate(5, n)):
        ids, decisions = decision_points(family, inst, tok, seed=j)
        for d in decisions:
            assert 0 < d.position < len(ids) and ids[d.position] == d.clean_token != d.flaw_token
            seen.add(d.key)
    visible = {f.key for f in get_teacher(family).flaws if f.rate > 0.5}
    assert visible <= seen, f"{family}: no decision point found for {sorted(visible - seen)}"


def test_a_model_on_the_clean_path_never_shows_a_flaw(tok: ChatTokenizer) -> None:
    stats = flaw_calibration(PeekingLM(tok.vocab_size), tok, "triage", n=40)
    counted = [s for s in stats.values() if s.contexts]
    assert len(counted) >= 3
    for s in counted:
        assert s.clean == 1.0 and s.shows == 0.0 and s.p < 1e-6 and s.leave < 1e-4, s


def test_the_calibration_reads_the_choice_at_the_decision_token(tok: ChatTokenizer) -> None:
    answer, left = tok.tok.token_to_id("Answer"), tok.tok.token_to_id("left")
    assert answer is not None and left is not None
    stats = flaw_calibration(FixedLM(tok.vocab_size, {answer: 5.0, left: 3.0}), tok, "arithmetic", n=60)
    early = stats["early:big"]  # clean "left: ..." vs flawed "Answer: <current value>"
    assert early.contexts > 5
    assert early.shows == 1.0 and early.clean == 0.0
    assert early.p == pytest.approx(torch.sigmoid(torch.tensor(2.0)).item(), abs=1e-4)
    mental = stats["mental:mul_big"]  # a tool call vs a guessed number: neither token is favoured
    assert mental.contexts > 0 and mental.shows == 0.0 and mental.clean == 0.0
    assert "early:big" in format_table("arithmetic", stats)
