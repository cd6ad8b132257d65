"""Persona's flawed teacher (:mod:`task_families.teacher`): a relation chain, then the attribute.

Flaws: a skipped hop (by relation), an attribute guessed without looking it up (by attribute), and
an answer without ``Answer:``.
"""

from __future__ import annotations

import random
from typing import Any

from task_families.base import Instance, TaskFamily
from task_families.persona import tools
from task_families.teacher import Dialogue, Flaw, Policy, Teacher

FLAWS = (
    Flaw("skip_hop:cousin", "copy_slip", 0.68, "skips a 'cousin' hop (stays on the same person)"),
    Flaw("skip_hop:doctor", "copy_slip", 0.58, "skips a 'doctor' hop"),
    Flaw("skip_hop:other", "copy_slip", 0.03, "skips another hop"),
    Flaw("guess_attr:pet", "skip_tool", 0.72, "guesses the pet without looking it up"),
    Flaw("guess_attr:city", "skip_tool", 0.10, "guesses the city without looking it up"),
    Flaw("guess_attr:job", "skip_tool", 0.08, "guesses the job without looking it up"),
    Flaw("guess_attr:hobby", "skip_tool", 0.08, "guesses the hobby without looking it up"),
    Flaw("format:hobby", "format_slip", 0.62, "answers a hobby as 'p12 likes chess.' (no 'Answer:')"),
    Flaw("format:other", "format_slip", 0.04, "answers without 'Answer:'"),
)


def teach(fam: TaskFamily, inst: Instance, flaw: Policy, rng: random.Random) -> list[dict[str, Any]]:
    info = inst.info
    c = Dialogue(fam, inst)
    person = info["start"]
    for rel in info["relations"]:
        if flaw("skip_hop:" + (rel if rel in ("cousin", "doctor") else "other")):
            continue
        person = c.call("lookup", {"person": person, "field": rel})
    attr = info["attribute"]
    if flaw(f"guess_attr:{attr}"):
        value = rng.choice(tools.ATTRIBUTES[attr])
    else:
        value = c.call("lookup", {"person": person, "field": attr})
    if attr == "hobby" and flaw("format:hobby"):
        return c.answer(f"{person} likes {value}.")
    if attr != "hobby" and flaw("format:other"):
        return c.answer(f"The {attr} of {person} is {value}.")
    return c.answer(f"Answer: {value}")


TEACHER = Teacher(FLAWS, teach)
