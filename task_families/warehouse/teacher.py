"""Warehouse's flawed teacher (:mod:`task_families.teacher`): for each item of the order ``find_item``, then
``pick`` the ordered quantity from the bin that holds enough; ``seal_box``; answer the printed label.

Scratchpad: before each item, what is still to pack (``todo: 5 vase, 5 spoon``; ``todo: seal`` before the
seal). Its words are its own: in arithmetic's words (``left: ...`` / ``left: none``, this teacher's first
version) the early seal wrote ``left: none`` with an item still to pack, and models pretrained on both families
carried that early ``left: none`` into arithmetic, whose reference stopped lifting (research/corpus_history.md).
Flaws act on the world, so most cannot be undone: taking a bin's whole stock (by how many bins ``find_item``
listed), sealing after the second item of three (``todo: seal`` with an item still to pack), and a label
without its ``W-``.
"""

from __future__ import annotations

import random
import re
from typing import Any

from task_families.base import Instance, TaskFamily
from task_families.teacher import Dialogue, Flaw, Policy, Teacher

FLAWS = (
    Flaw("take_all:c3", "copy_slip", 0.70, "picks the bin's whole stock instead of the ordered quantity (3 bins listed)"),
    Flaw("take_all:c2", "copy_slip", 0.58, "picks the bin's whole stock instead of the ordered quantity (2 bins listed)"),
    Flaw("take_all:c1", "copy_slip", 0.10, "picks the bin's whole stock instead of the ordered quantity (1 bin listed)"),
    Flaw("early_seal:i3", "early_answer", 0.62, "seals the box after the second item of a 3-item order"),
    Flaw("format:label", "format_slip", 0.30, "answers the label without its 'W-' ('Answer: 0421')"),
)

_BIN_COUNT = re.compile(r"(b\d+): (\d+)")
_LABEL = re.compile(r"W-\d{4}")


def todo_note(order: list[tuple[str, int]]) -> str:
    """The scratchpad line of what is still to pack: ``todo: 5 vase, 5 spoon`` (or ``todo: seal``)."""
    return "todo: " + (", ".join(f"{q} {i}" for i, q in order) or "seal") + "\n"


def teach(fam: TaskFamily, inst: Instance, flaw: Policy, rng: random.Random) -> list[dict[str, Any]]:
    order = [(str(i), int(q)) for i, q in inst.info["order"].items()]
    c = Dialogue(fam, inst)
    for k, (item, qty) in enumerate(order):
        c.note(todo_note(order[k:]))
        found = c.call("find_item", {"item": item})
        bins = [(b, int(n)) for b, n in _BIN_COUNT.findall(found)]
        enough = [(b, n) for b, n in bins if n >= qty]
        if not enough:
            return c.answer("Answer: none")
        where, have = enough[0]
        take = have if flaw(f"take_all:c{min(len(bins), 3)}") else qty
        c.call("pick", {"bin": where, "item": item, "quantity": take})
        if len(order) == 3 and k == 1 and flaw("early_seal:i3"):
            break
    c.note(todo_note([]))
    sealed = c.call("seal_box", {})
    m = _LABEL.search(sealed)
    if m is None:
        return c.answer("Answer: none")
    if flaw("format:label"):
        return c.answer(f"Answer: {m.group(0)[2:]}")
    return c.answer(f"Answer: {m.group(0)}")


TEACHER = Teacher(FLAWS, teach)
