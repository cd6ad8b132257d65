"""Units' flawed teacher (:mod:`task_families.teacher`): one conversion or exchange call per leg of the route.

Flaws: a decimal value rounded when copied (by size), a direct exchange that skips the stated route,
and the start quantity restated in the answer.
"""

from __future__ import annotations

import random
from typing import Any

from task_families.base import Instance, TaskFamily
from task_families.teacher import Dialogue, Flaw, Policy, Teacher

FLAWS = (
    Flaw("round:mid", "copy_slip", 0.62,
         "rounds a decimal value in [100, 1000) to an integer when copying it"),
    Flaw("round:big", "copy_slip", 0.66, "rounds a decimal value >= 1000 (harmless: within the tolerance)"),
    Flaw("round:small", "copy_slip", 0.08, "rounds a decimal value < 100 when copying it"),
    Flaw("shortcut:money", "wrong_tool", 0.68,
         "exchanges straight from the current to the final currency when 3+ legs remain"),
    Flaw("shortcut:money2", "wrong_tool", 0.10, "the same when 2 legs remain"),
    Flaw("format:restate", "format_slip", 0.58,
         "restates an integer start quantity first ('Answer: 12 ft = 3.66 m': the first number is read)"),
)


def _num(x: float) -> int | float:
    return int(x) if float(x).is_integer() else x


def teach(fam: TaskFamily, inst: Instance, flaw: Policy, rng: random.Random) -> list[dict[str, Any]]:
    """Scratchpad: every call is preceded by ``left: <units still to reach after it>`` (or ``left: none``),
    so the next call's target is the first unit of the previous note and "no unit left" means answer
    (without it the tiny models lose their place in the route: extra ``qt -> qt`` calls, skipped legs)."""
    info = inst.info
    k_val, k_from, k_to = info["arg_names"]
    route = info["route"]
    c = Dialogue(fam, inst)
    v: int | float = _num(float(info["values"][0]))
    i = 0
    while i < len(route) - 1:
        cur, nxt = route[i], route[i + 1]
        left = len(route) - 1 - i
        shortcut = "shortcut:money" if left >= 3 else "shortcut:money2"
        if info["kind"] == "money" and left >= 2 and flaw(shortcut):
            nxt = route[-1]
            i = len(route) - 2
        arg = v
        if i > 0 and isinstance(v, float):
            ctx = "big" if abs(v) >= 1000 else "mid" if abs(v) >= 100 else "small"
            if flaw(f"round:{ctx}"):
                arg = int(round(v))
        c.left(route[i + 2:])
        out = c.call(info["tool"], {k_val: arg, k_from: cur, k_to: nxt})
        try:
            v = _num(float(out.split()[0]))
        except ValueError:
            return c.answer(f"Answer: {v}")
        i += 1
    if info["kind"] == "unit" and float(info["values"][0]).is_integer() and flaw("format:restate"):
        return c.answer(f"Answer: {info['values'][0]} {route[0]} = {v} {route[-1]}")
    return c.answer(f"Answer: {v}")


TEACHER = Teacher(FLAWS, teach)
