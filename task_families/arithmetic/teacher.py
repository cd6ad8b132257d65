"""Arithmetic's flawed teacher (:mod:`task_families.teacher`): the chained steps, one calculator call each.

Scratchpad: every step starts with the operations still to do after it (``left: *7 +28``, or
``left: none`` before the last one), so the tiny models do not lose their place in the expression.
Flaws: a multiplication done mentally (a guessed product, by the size of the factor), an early answer
once the value has 3+ digits, and work written after a negative answer.
"""

from __future__ import annotations

import random
import re
from typing import Any

from task_families.base import Instance, TaskFamily
from task_families.teacher import Dialogue, Flaw, Policy, Teacher

FLAWS = (
    Flaw("mental:mul_big", "skip_tool", 0.72, "does a '* b' step with b >= 8 mentally (guessed product)"),
    Flaw("mental:mul_small", "skip_tool", 0.60, "does a '* 2' or '* 3' step mentally"),
    Flaw("mental:mul_mid", "skip_tool", 0.10, "does a '* b' step with 4 <= b <= 7 mentally"),
    Flaw("mental:addsub", "skip_tool", 0.06, "does a + or - step mentally"),
    Flaw("early:big", "early_answer", 0.64,
         "answers the current value once it has 3+ digits and steps remain"),
    Flaw("format:work_after", "format_slip", 0.58,
         "writes a final '-' step after the answer when the result is negative "
         "('Answer: -86 = 40-126': the last integer is read)"),
)


def _perturb_int(x: int, rng: random.Random) -> int:
    r = rng.random()
    if r < 0.5:
        return x + rng.choice([-2, -1, 1, 2])
    if r < 0.8:
        return x + rng.choice([-10, 10])
    s = str(abs(x))
    if len(s) >= 2:  # swap two digits
        i = rng.randrange(len(s) - 1)
        s = s[:i] + s[i + 1] + s[i] + s[i + 2:]
        y = int(s) * (1 if x >= 0 else -1)
        if y != x:
            return y
    return x + rng.choice([-3, 3])


_STEP = re.compile(r"^(-?\d+)([+\-*])(\d+)$")


def _apply(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def teach(fam: TaskFamily, inst: Instance, flaw: Policy, rng: random.Random) -> list[dict[str, Any]]:
    parsed = [_STEP.match(s) for s in inst.info["steps"]]
    ops = [(m.group(2), int(m.group(3))) for m in parsed if m]
    v = int(parsed[0].group(1)) if parsed[0] else 0
    c = Dialogue(fam, inst)
    prev, last_b = v, 0
    for i, (op, b) in enumerate(ops):
        if i >= 1 and abs(v) >= 100 and flaw("early:big"):
            return c.answer(f"Answer: {v}")
        ctx = ("mul_big" if b >= 8 else "mul_mid" if b >= 4 else "mul_small") if op == "*" else "addsub"
        prev, last_b = v, b
        c.left(f"{o}{x}" for o, x in ops[i + 1:])
        if flaw(f"mental:{ctx}"):
            true = _apply(v, op, b)
            guess = true if rng.random() < 0.4 else _perturb_int(true, rng)
            c.note(f"{v}{op}{b}={guess}\n")
            v = guess
        else:
            out = c.call("calculator", {"expression": f"{v}{op}{b}"})
            try:
                v = int(out)
            except ValueError:
                return c.answer(f"Answer: {v}")
    if ops and ops[-1][0] == "-" and v < 0 and flaw("format:work_after"):
        return c.answer(f"Answer: {v} = {prev}-{last_b}")
    return c.answer(f"Answer: {v}")


TEACHER = Teacher(FLAWS, teach)
