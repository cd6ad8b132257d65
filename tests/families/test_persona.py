"""Tools of the persona family: a pure, hash-defined people directory."""

from __future__ import annotations

import hashlib

from task_families.persona import tools
from task_families.persona.family import FAMILY
from task_families.persona.tools import lookup


def test_lookup_is_deterministic_and_case_insensitive():
    for pid in ("p1", "p17", "p500", "p4999"):
        for field in tools.FIELDS:
            assert lookup(pid, field) == lookup(pid, field) == lookup(pid.upper(), f" {field.upper()} ")


def test_hand_checked_example():
    # sha256("persona:p17:<field>")[:12] modulo the vocabulary size, recomputed here by hand
    def h(field: str) -> int:
        return int(hashlib.sha256(f"persona:p17:{field}".encode()).hexdigest()[:12], 16)

    assert lookup("p17", "city") == tools.CITIES[h("city") % 30] == "Austin"
    assert lookup("p17", "sister") == f"p{1 + h('sister') % 4999}" == "p1484"
    # "In which city does the manager of the sister of p17 live?": innermost relation first
    manager = lookup(lookup("p17", "sister"), "manager")
    assert manager == "p4910"
    assert lookup(manager, "city") == "Havana"


def test_relations_give_other_valid_people():
    for n in range(1, 5000, 37):
        for rel in tools.RELATIONS:
            other = lookup(f"p{n}", rel)
            assert other != f"p{n}" and 1 <= int(other[1:]) <= tools.N_PEOPLE


def test_bad_arguments_are_error_text():
    for bad in ("p0", "p5000", "p10000", "17", "q17", "", "p017"):
        assert lookup(bad, "city").startswith("error: unknown person")
    assert lookup("p17", "salary").startswith("error: unknown field")
    assert "manager" in lookup("p17", "salary")


def test_difficulty_sets_hops():
    easy, hard = FAMILY.generate(3, 1, difficulty=0.0)[0], FAMILY.generate(3, 1, difficulty=1.0)[0]
    assert len(FAMILY.solution(easy)) == 2 and len(FAMILY.solution(hard)) == 5
    assert all(len(i.question) <= 140 for i in FAMILY.generate(4, 300))


def test_checker_normalises():
    inst = FAMILY.generate(5, 1)[0]
    assert FAMILY.check(inst, f"<think>maybe Oslo</think>The answer: {inst.answer.upper()}.") == 1.0
    assert FAMILY.check(inst, f"Answer: {inst.answer}\nAnswer: nobody") == 0.0
    assert FAMILY.check(inst, inst.answer) == 0.0  # no "Answer:"
