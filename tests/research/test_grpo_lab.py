"""The recipe lab's calendar reward terms (``research/grpo_lab.py``), on the teacher's transcripts."""

from __future__ import annotations

import copy

import pytest

from cpu.tiny_models.quick_eval import Conversation
from research import grpo_lab as lab
from task_families import get_family
from task_families.teacher import teacher_completion


def _convs(mode: str, n: int = 30) -> list[Conversation]:
    insts = get_family("calendar").generate(777, n)
    return [Conversation(instance=i, messages=teacher_completion("calendar", i, mode=mode, seed=j)[0])
            for j, i in enumerate(insts)]


def test_clean_teacher_scratchpads_are_all_right() -> None:
    convs = _convs("clean")
    assert all(lab.scratchpad_accuracy(c) == 1.0 for c in convs)
    assert all(lab.looked_up_everyone(c) for c in convs)


def test_a_wrong_mark_or_listing_costs_exactly_its_line() -> None:
    c = _convs("clean", 1)[0]
    lines = sum(len(m["content"].splitlines()) for m in c.messages if m["role"] == "assistant")
    checked = sum(1 for m in c.messages if m["role"] == "assistant"
                  for ln in m["content"].splitlines() if not ln.startswith(("left", "Answer")))
    assert 0 < checked < lines
    bad = copy.deepcopy(c)
    last = bad.messages[-1]
    last["content"] = last["content"].replace("x", ".", 1)   # one mark of one line
    assert lab.scratchpad_accuracy(bad) == pytest.approx(1 - 1 / checked)
    bad2 = copy.deepcopy(c)
    m = next(m for m in bad2.messages[1:] if m["role"] == "assistant")
    m["content"] = "09 09h\n" + m["content"].split("\n", 1)[1]   # a listing that is not the tool result's
    assert lab.scratchpad_accuracy(bad2) < 1.0


def test_habits_are_told_apart_from_scratchpad_errors() -> None:
    """Forgetting the last person leaves a consistent scratchpad (the union of who was looked up): only
    ``looked_up_everyone`` sees it. Ignoring the meeting length stops the walk early: a wrong line."""
    walked_short = 0
    for j, inst in enumerate(get_family("calendar").generate(778, 30)):
        decisions: list[str] = []
        msgs, used = teacher_completion("calendar", inst, mode="clean", seed=j, force=0, decisions=decisions)
        assert used == [f"forget_last:k{len(inst.info['people'])}"]
        forgot = Conversation(instance=inst, messages=msgs)
        assert not lab.looked_up_everyone(forgot) and lab.scratchpad_accuracy(forgot) == 1.0
        k = next((i for i, d in enumerate(decisions) if d.startswith("ignore_length")), None)
        if k is None:
            continue
        msgs, _ = teacher_completion("calendar", inst, mode="clean", seed=j, force=k)
        early = Conversation(instance=inst, messages=msgs)
        clean = teacher_completion("calendar", inst, mode="clean", seed=j)[0]
        want_right = msgs[-1]["content"] == clean[-1]["content"]
        assert lab.looked_up_everyone(early) and (lab.scratchpad_accuracy(early) < 1.0) != want_right
        walked_short += not want_right
    assert walked_short > 0


def test_the_training_pool_narrows_by_size_and_meeting_length() -> None:
    every = lab._pool("calendar", 0, 0)
    short = lab._pool("calendar", 0, 2, max_people=3)
    long = lab._pool("calendar", 0, 2, max_people=3, min_minutes=60)
    assert short and long and len(long) < len(short) < len(every)
    assert {len(i.info["people"]) for i in short} == {2, 3}
    assert all(i.info["minutes"] >= 60 for i in long) and {30, 60, 90} <= {i.info["minutes"] for i in short}
    assert [i.question for i in long] == [i.question for i in short if i.info["minutes"] >= 60]
