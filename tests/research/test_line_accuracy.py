"""The teacher-forced line accuracy of the local models (fast: scripted logits, no training)."""

from __future__ import annotations

import re

import pytest

from cpu.tiny_models import corpus as C
from cpu.tiny_models.tokenizer import ChatTokenizer
from research.line_accuracy import (SKILL_SEED, format_table, line_accuracy, line_spans, score_lines,
                                    transcripts)
from task_families import get_family
from task_families.teacher import teacher_completion
from tests.fakes.scripted_lm import PeekingLM


@pytest.fixture(scope="module")
def tok() -> ChatTokenizer:
    return ChatTokenizer(C.train_corpus_tokenizer(C.build_corpus(40).texts(), 1024))


def _lines(family: str, n: int) -> list[str]:
    fam = get_family(family)
    out = []
    for j, inst in enumerate(fam.generate(SKILL_SEED, n)):
        comp, _ = teacher_completion(family, inst, mode="clean", seed=f"skill:{j}")
        text, spans = C.assistant_spans(fam.eval_messages(inst) + comp, fam.tool_schemas())
        out += [text[a:b] for _, a, b in line_spans(text, spans)]
    return out


def test_lines_are_named_by_their_first_word_and_a_call_is_one_line() -> None:
    fam = get_family("arithmetic")
    inst = fam.generate(3, 1)[0]
    comp, _ = teacher_completion("arithmetic", inst, mode="clean")
    text, spans = C.assistant_spans(fam.eval_messages(inst) + comp, fam.tool_schemas())
    lines = line_spans(text, spans)
    kinds = [k for k, _, _ in lines]
    assert kinds[0] == "left:" and kinds[1] == "<tool_call>" and kinds[-1] == "Answer:"
    for k, a, b in lines:
        if k == "<tool_call>":
            assert text[a:b].startswith("<tool_call>") and text[a:b].endswith("</tool_call>")
        assert all(a >= s and b <= e for s, e in spans if s <= a < e)


def test_a_perfect_model_gets_every_line_right(tok: ChatTokenizer) -> None:
    acc = line_accuracy(PeekingLM(tok.vocab_size), tok, "calendar", n=20)
    assert {"busy: first", "busy: later", "Answer: first", "<tool_call> first"} <= set(acc)
    assert all(r == t > 0 for r, t in acc.values()), acc


def test_a_line_is_wrong_exactly_when_one_of_its_tokens_is(tok: ChatTokenizer) -> None:
    digits = {tok.tok.token_to_id(str(d)) for d in range(10)}
    acc = line_accuracy(PeekingLM(tok.vocab_size, blind=digits), tok, "arithmetic", n=30)
    lines = _lines("arithmetic", 30)
    assert sum(t for _, t in acc.values()) == len(lines)
    assert sum(r for r, _ in acc.values()) == sum(not re.search(r"\d", s) for s in lines)
    assert 0 < acc["left: later"][0] < acc["left: later"][1]  # "left: none" has no digit, "left: *7" has
    assert "left: later" in format_table("arithmetic", acc)


def test_a_line_margin_is_its_weakest_token(tok: ChatTokenizer) -> None:
    digits = {tok.tok.token_to_id(str(d)) for d in range(10)}
    items = transcripts(tok, "arithmetic", n=5)
    lines = [r for t in score_lines(PeekingLM(tok.vocab_size, blind=digits), items) for r in t]
    assert lines and all(r.margin == (20.0 if r.right else -20.0) for r in lines)
    assert {r.right for r in lines} == {True, False}
