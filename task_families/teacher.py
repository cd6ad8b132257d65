"""The flawed teacher: how a family demonstrates its task in the local models' pretraining corpus.

Each family has one teacher, in ``task_families/<name>/teacher.py`` (:func:`get_teacher`): a module-level
``TEACHER = Teacher(flaws, teach)``. ``teach(family, instance, flaw, rng)`` returns the completion
messages of one demonstration (assistant tool calls, the *real* tools' results, a final answer) after the
family's eval prompt. It must:

- ask ``flaw(key)`` (a :class:`Policy`) at every behaviour choice, with a key of its ``flaws``, and ask
  about the same flaws in the same order whatever the answers are (``research/flaw_calibration.py``
  forces decision ``k`` and compares the result with the clean demonstration);
- get every tool result from the family's tools (:class:`Dialogue`) and draw every other random choice
  from ``rng``, so that a demonstration depends only on the instance, the seed and the flaw decisions;
- solve the instance when no flaw is taken (``mode="clean"``; tested on the hidden sets).

:mod:`cpu.tiny_models.corpus` renders these demonstrations into the pretraining corpus; a change to a
teacher changes the base models, so bump ``cpu.tiny_models.corpus.CORPUS_VERSION`` with it.

Flaw model
----------
A tiny model trained on perfect demonstrations scores near its skill ceiling and leaves nothing for RL
to fix; one trained on demonstrations with *one* bad habit flips all at once under GRPO (the local
training spike). So the teacher is a policy with several **flaws**, each a behaviour choice (never a
missing skill: after a flaw, everything it does is self-consistent with what it has seen), taken with
a probability that depends on a **context the model can see** (the operator of the next step, the
attribute asked, the number of candidates a tool listed, ...). Under greedy decoding a context
whose rate is above 0.5 shows the flaw and one below 0.5 does not, so the base model's greedy score is
set by the contexts above 0.5; RL lowers those rates and the contexts flip one after another, the
ones close to 0.5 first (graded uplift). :func:`oracle_ladder` simulates exactly that with a perfect
executor: the greedy score as flaws are fixed in order of their rates.

Flaw kinds (each family's contexts and rates are in its teacher's ``flaws``; :func:`describe_flaws`
prints them all):

- ``early_answer``: stops calling tools and answers with what it has (an intermediate value, the
  first feasible quote, the alerting service), more often when more work is left.
- ``skip_tool``: does a step "mentally" and writes a guessed value (right ~40% of the time) instead
  of calling the tool, or guesses an attribute/action without looking it up.
- ``copy_slip``: copies an argument wrongly (rounds a decimal amount, drops a trailing zero of a
  quantity, skips a hop of a relation chain, forgets the last person of a list).
- ``format_slip``: a final message the checker cannot read (no ``Answer:``, ``2 pm`` instead of
  ``14:00``, the walk's label ``10h`` instead of ``10:30``, the start quantity restated first, work
  written after the answer).
- ``wrong_tool``: a plausible but wrong call (a direct exchange that skips the stated route).

Rates between ~0.55 and ~0.85 in the flawed contexts give base greedy scores of roughly 0.15-0.5 with
a clean-skill ceiling near 1 (:func:`oracle_ladder`); the exact numbers the trained models reach are
measured by :mod:`cpu.tiny_models.quick_eval` and stored in each model's ``ait_model.json``.

Scratchpads: where the tiny models could not learn a family's *skill* from plain demonstrations, the
teacher writes its state before each call (:meth:`Dialogue.note`, :meth:`Dialogue.left`) and the model
learns to copy and update it; each family's teacher module says what its scratchpad holds. Flaws act on
the scratchpad consistently (a forgotten person is missing from the union; a shortcut leaves
``left: none``).
"""

from __future__ import annotations

import importlib
import json
import random
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Iterable

from task_families import FAMILY_NAMES, get_family
from task_families.base import Instance, TaskFamily

#: The kinds of flaw a teacher may show (module docstring).
FLAW_KINDS = ("early_answer", "skip_tool", "copy_slip", "format_slip", "wrong_tool")


@dataclass(frozen=True)
class Flaw:
    key: str          # "<flaw>:<context>"
    kind: str         # one of FLAW_KINDS
    rate: float       # probability the teacher shows the flaw in that context
    text: str         # what it does, in words


class Policy:
    """Takes the teacher's flaw decisions (``rates``: flaw key -> rate).

    ``mode="sample"`` (the corpus): a flaw happens with its rate. ``mode="greedy"`` (the oracle): a
    flaw happens iff its rate is above 0.5 and it is not in ``fixed`` (what greedy decoding of a
    perfectly calibrated model does). ``mode="clean"``: never, except at decision number ``force``
    (0-based, in the order the teacher asks), which takes the flaw (``research/flaw_calibration.py``).
    ``used`` records the flaws taken, ``decisions`` every flaw the teacher asked about."""

    def __init__(self, rates: dict[str, float], rng: random.Random, mode: str = "sample",
                 fixed: Iterable[str] = (), force: int | None = None) -> None:
        self.rates = rates
        self.rng = rng
        self.mode = mode
        self.fixed = set(fixed)
        self.force = force
        self.used: list[str] = []
        self.decisions: list[str] = []

    def __call__(self, key: str) -> bool:
        rate = self.rates[key]
        self.decisions.append(key)
        if self.mode == "clean":
            hit = len(self.decisions) - 1 == self.force
        elif key in self.fixed:
            hit = False
        elif self.mode == "greedy":
            hit = rate > 0.5
        else:
            hit = self.rng.random() < rate
        if hit:
            self.used.append(key)
        return hit


class Dialogue:
    """Builds a demonstration's completion messages; tool results come from the family's real tools."""

    def __init__(self, fam: TaskFamily, inst: Instance | None = None) -> None:
        self.fam = fam
        #: the demonstration's own world (a stateful family needs ``inst`` for it)
        self.world = fam.new_world(inst) if inst is not None else None
        self.msgs: list[dict[str, Any]] = []
        self.pending = ""

    def call(self, name: str, args: dict[str, Any]) -> str:
        cid = f"call_{len(self.msgs) // 2}"
        self.msgs.append({"role": "assistant", "content": self.pending, "tool_calls": [{
            "id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]})
        self.pending = ""
        result = self.fam.call_tool(name, args, self.world)
        self.msgs.append({"role": "tool", "tool_call_id": cid, "content": result})
        return result

    def note(self, text: str) -> None:
        self.pending += text

    def left(self, items: Iterable[str], tag: str = "") -> None:
        """The scratchpad line of what is still to do after the next call: ``left: a b`` or ``left: none``
        (``left 60: a b`` with a ``tag`` the later lines copy, such as the meeting length)."""
        self.note(f"left{' ' + tag if tag else ''}: " + (" ".join(items) or "none") + "\n")

    def answer(self, text: str) -> list[dict[str, Any]]:
        self.msgs.append({"role": "assistant", "content": self.pending + text})
        self.pending = ""
        return self.msgs


#: ``teach(family, instance, flaw, rng)``: the completion messages of one demonstration.
Teach = Callable[[TaskFamily, Instance, Policy, random.Random], list[dict[str, Any]]]


@dataclass(frozen=True)
class Teacher:
    """A family's flawed teacher: its flaw table and its demonstration function (module docstring)."""

    flaws: tuple[Flaw, ...]
    teach: Teach

    def rates(self) -> dict[str, float]:
        return {f.key: f.rate for f in self.flaws}


@lru_cache(maxsize=None)
def get_teacher(name: str) -> Teacher:
    """The teacher of family ``name`` (``task_families/<name>/teacher.py``, its ``TEACHER``)."""
    get_family(name)  # the same error for an unknown family
    return importlib.import_module(f"task_families.{name}.teacher").TEACHER


def flaw_rates(family: str) -> dict[str, float]:
    return get_teacher(family).rates()


def describe_flaws() -> str:
    """Every family's flaw table, one flaw a line."""
    lines = []
    for fam in FAMILY_NAMES:
        lines.append(f"{fam}:")
        lines += [f"  {f.rate:.2f}  {f.key:<22} [{f.kind}] {f.text}" for f in get_teacher(fam).flaws]
    return "\n".join(lines)


def teacher_completion(family: str, inst: Instance, *, mode: str = "sample", seed: int | str = 0,
                       fixed: Iterable[str] = (), force: int | None = None,
                       decisions: list[str] | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """(completion messages, flaws taken) of the flawed teacher on ``inst`` (``force``: see
    :class:`Policy`; ``decisions``, if given, receives every flaw key the teacher asked about)."""
    rng = random.Random(f"teacher:{family}:{seed}")
    teacher = get_teacher(family)
    policy = Policy(teacher.rates(), rng, mode=mode, fixed=fixed, force=force)
    msgs = teacher.teach(get_family(family), inst, policy, rng)
    if decisions is not None:
        decisions.extend(policy.decisions)
    return msgs, policy.used


def final_content(messages: list[dict[str, Any]]) -> str:
    return str(messages[-1].get("content") or "") if messages else ""


def oracle_score(family: str, instances: list[Instance], fixed: Iterable[str] = ()) -> float:
    """Mean score of the teacher in greedy mode (flaws with rate > 0.5, minus ``fixed``): what a perfectly
    skilled, perfectly calibrated base model would score under greedy decoding."""
    fam = get_family(family)
    fixed = tuple(fixed)
    total = 0.0
    for i, inst in enumerate(instances):
        comp, _ = teacher_completion(family, inst, mode="greedy", seed=f"oracle:{i}", fixed=fixed)
        total += float(fam.score_completion(inst, comp))
    return total / max(1, len(instances))


def oracle_ladder(family: str, instances: list[Instance]) -> list[tuple[str, float]]:
    """Greedy oracle score as the visible flaws (rate > 0.5) are fixed one by one, lowest rate first
    (the order in which RL should flip them). First entry: ("base", score)."""
    visible = sorted((f for f in get_teacher(family).flaws if f.rate > 0.5), key=lambda f: f.rate)
    out = [("base", oracle_score(family, instances))]
    fixed: list[str] = []
    for f in visible:
        fixed.append(f.key)
        out.append((f.key, oracle_score(family, instances, fixed)))
    return out
