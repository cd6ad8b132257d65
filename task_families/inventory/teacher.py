"""Inventory's flawed teacher (:mod:`task_families.teacher`): the suppliers that stock the items, then one
quote each.

Flaws: the first feasible quote answered (by number of suppliers), a dropped trailing zero of a
quantity, and a 3-item answer without ``supplier=``/``cost=``.
"""

from __future__ import annotations

import random
import re
from typing import Any

from task_families.base import Instance, TaskFamily
from task_families.teacher import Dialogue, Flaw, Policy, Teacher

FLAWS = (
    Flaw("first_feasible:c4", "early_answer", 0.72,
         "answers the first supplier that can fill the order (4 listed)"),
    Flaw("first_feasible:c3", "early_answer", 0.60,
         "answers the first supplier that can fill the order (3 listed)"),
    Flaw("first_feasible:c2", "early_answer", 0.10,
         "answers the first supplier that can fill the order (2 listed)"),
    Flaw("drop_zero", "copy_slip", 0.62, "drops the trailing zero of a quantity (30 -> 3) in the quote"),
    Flaw("format:three_items", "format_slip", 0.57,
         "answers a 3-item order as 'Answer: s4 for 818' (no supplier=/cost=)"),
)


def best_note(best: tuple[int, str] | None) -> str:
    """Inventory's scratchpad line after each quote: the cheapest feasible quote so far (``best: s3 412``,
    or ``best: none``). Each line compares one new cost with the line before, and the answer copies the
    last line, instead of comparing every quote at the end."""
    return f"best: {best[1]} {best[0]}" if best else "best: none"


def teach(fam: TaskFamily, inst: Instance, flaw: Policy, rng: random.Random) -> list[dict[str, Any]]:
    plan = fam.solution(inst)
    items_arg = plan[0].arguments["items"]
    order_arg = next((s.arguments["order"] for s in plan if s.name == "quote"), "")
    order = [(int(q), item) for q, item in re.findall(r"(\d+) ([a-z]+)", order_arg)]
    c = Dialogue(fam, inst)
    listed = c.call("find_suppliers", {"items": items_arg})
    cands = ([s.strip() for s in listed.split(",") if s.strip()]
             if not listed.startswith(("none", "error")) else [])
    if any(q % 10 == 0 for q, _ in order) and flaw("drop_zero"):
        order = [(q // 10 if q % 10 == 0 else q, item) for q, item in order]
    otext = ", ".join(f"{q} {item}" for q, item in order)
    best: tuple[int, str] | None = None
    for j, s in enumerate(cands):
        q = c.call("quote", {"supplier": s, "order": otext})
        first = False
        if q.startswith("cost="):
            cost = int(q[5:])
            first = best is None
            if best is None or cost < best[0]:
                best = (cost, s)
        c.note(best_note(best) + "\n")
        if first and j < len(cands) - 1 and flaw(f"first_feasible:c{min(len(cands), 4)}"):
            break
    if best is None:
        return c.answer("Answer: none")
    cost, s = best
    if len(order) == 3 and flaw("format:three_items"):
        return c.answer(f"Answer: {s} for {cost}")
    return c.answer(f"Answer: supplier={s};cost={cost}")


TEACHER = Teacher(FLAWS, teach)
