"""Tools of the inventory family: supplier search and order quotes over a hash-defined market."""

from __future__ import annotations

from task_families.base import Instance
from task_families.inventory import tools
from task_families.inventory.family import FAMILY, parse_answer
from task_families.inventory.tools import find_suppliers, quote


def test_tools_are_deterministic_and_tolerant_of_formats():
    assert find_suppliers("bolt, nut") == find_suppliers("Bolts and NUTS") == "s1, s4, s10, s12"
    assert quote("s1", "30 bolt, 12 nut") == quote("S1", "30 bolts and 12 nuts") == quote("s1", "bolt:30, nut=12")
    for s in tools.SUPPLIERS:
        for item in tools.ITEMS:
            assert tools.carries(s, item) == (s in find_suppliers(item).split(", "))


def test_hand_checked_example():
    # s1 sells bolt at 30 (94 in stock) and nut at 3 (55 in stock): 30*30 + 12*3 = 936
    assert (tools.unit_price("s1", "bolt"), tools.stock("s1", "bolt")) == (30, 94)
    assert (tools.unit_price("s1", "nut"), tools.stock("s1", "nut")) == (3, 55)
    assert quote("s1", "30 bolt, 12 nut") == "cost=936"
    assert quote("s4", "30 bolt, 12 nut") == "s4 has only 5 bolt"
    assert quote("s10", "30 bolt, 12 nut") == "cost=1548"
    assert quote("s12", "30 bolt, 12 nut") == "s12 has only 10 nut"
    assert quote("s2", "30 bolt, 12 nut") == "s2 does not carry: nut"
    # so the cheapest single supplier for "30 bolt, 12 nut" is s1 at 936


def test_bad_arguments_are_error_text():
    assert find_suppliers("gizmo").startswith("error: unknown item 'gizmo'")
    assert find_suppliers("").startswith("error:")
    assert quote("s13", "1 bolt").startswith("error: unknown supplier 's13'")
    assert quote("supplier one", "1 bolt").startswith("error: unknown supplier")
    assert quote("s1", "lots of bolts").startswith("error: cannot read")
    assert quote("s1", "3 gizmo").startswith("error: unknown item")
    assert quote("s1", "0 bolt").startswith("error: quantity")
    assert quote("s1", "").startswith("error: empty order")


def test_difficulty_sets_candidates_and_checker_needs_both_parts():
    easy, hard = FAMILY.generate(3, 1, difficulty=0.0)[0], FAMILY.generate(3, 1, difficulty=1.0)[0]
    assert len(FAMILY.solution(easy)) == 2 and len(FAMILY.solution(hard)) == 5
    inst = Instance(question="q", answer="supplier=s1;cost=936", info={})
    assert parse_answer("Supplier: S1, cost: $936") == ("s1", 936)
    assert FAMILY.check(inst, "Answer: supplier = s1; cost = 936") == 1.0
    assert FAMILY.check(inst, "Answer: supplier=s1;cost=1,548") == 0.0
    assert FAMILY.check(inst, "Answer: supplier=s10;cost=936") == 0.0
    assert FAMILY.check(inst, "supplier=s1;cost=936") == 0.0
