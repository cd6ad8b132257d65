"""Helpers every family shares (task_families/base.py): reading a response, naming a list, clamping."""

from __future__ import annotations

from task_families import FAMILY_NAMES, get_family
from task_families.base import and_list, answer_text, strip_think


def test_strip_think():
    assert strip_think("<think>a</think>b<think>c</think>Answer: 1") == "Answer: 1"
    assert strip_think("no open</think>Answer: 5") == "Answer: 5"
    assert strip_think("Answer: 5<think>unfinished 9") == "Answer: 5"
    assert strip_think(None) == ""


def test_answer_text():
    assert answer_text("answer: x\nANSWER:  p12 \nmore") == "p12"
    assert answer_text("<think>Answer: 1</think>no answer here") is None
    assert answer_text("Answer:") == ""
    assert answer_text(None) is None


def test_and_list():
    assert [and_list(x) for x in (["a"], ["a", "b"], ["a", "b", "c"])] == ["a", "a and b", "a, b and c"]


def test_generate_clamps_difficulty_for_every_family():
    for name in FAMILY_NAMES:
        fam = get_family(name)
        assert [i.model_dump() for i in fam.generate(3, 4, difficulty=7)] == \
            [i.model_dump() for i in fam.generate(3, 4, difficulty=1.0)]
        assert fam.generate(3, 1, difficulty=-2)[0].difficulty == 0.0
