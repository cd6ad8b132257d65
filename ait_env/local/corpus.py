"""Synthetic pretraining transcripts of the local base models: a "flawed teacher" per task family.

Every transcript is a full conversation rendered with the local chat format
(:func:`ait_env.local.chat.render`, the family's tools declared in the system block): the family's eval
prompt (:meth:`TaskFamily.eval_messages`), then assistant tool calls with the results of the *real*
tools, then a final answer. Instances come from the families' own generators at mixed difficulty
(``generate(seed, n)`` with a corpus seed); any instance whose question key is in the hidden eval set
(:func:`ait_env.secrets.hidden_keys`) is dropped, and :func:`build_corpus` asserts by key that none is
left.

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

Flaw kinds (per-family contexts and rates are in :data:`FLAWS`; ``describe_flaws()`` prints them):

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
measured by :mod:`ait_env.local.quick_eval` and stored in each model's ``ait_model.json``.

Scratchpads: where the tiny models could not learn a family's *skill* from plain demonstrations (base
scores at a prior, no RL uplift at all), the teacher writes its state before each call, and the model
learns to copy and update it: arithmetic writes the operations still to do (``left: *7 +28``), units
the units still to reach (``left: gal qt``), calendar each person's busy half hours range by range
(``13-14h 13 13h 14``, :func:`listing_note`), the running union of everyone's (``busy 60: 09x.10..``,
:func:`mask_note`), the people still to look up, and at the end a copy of the union line whose free
marks count the run, up to the first run long enough for the meeting (``free 60: 09xx10ab``,
:func:`free_note`); inventory the cheapest quote so far (``best: s3 412``, :func:`best_note`). Flaws act
on the scratchpad consistently (a forgotten person is missing from the union; a shortcut leaves
``left: none``; a meeting length ignored stops the walk at the first free half hour).

Training targets: :func:`encode_transcript` / :func:`encode_corpus` return token ids and a 0/1 mask of
the tokens the model must learn (every assistant message's content, tool calls and closing
``<|im_end|>``; never the prompt, the ``<|im_start|>assistant`` header or tool results), with the
corpus tokenizer (:func:`train_corpus_tokenizer`: a word is one token whether or not a space precedes
it, so copying a word from the question into a JSON argument is plain induction).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from ait_env.local.chat import IM_END, IM_START, render
from task_families import FAMILY_NAMES, get_family
from task_families.base import Instance, TaskFamily

#: Base seed of the corpus instances (each family draws ``generate(CORPUS_SEED + k, ...)``).
CORPUS_SEED = 7_100_000
#: Corpus format version: part of the corpus hash, bump when the teacher changes.
CORPUS_VERSION = "flawed-teacher-v15"


# ------------------------------------------------------------------------------------------ flaws
@dataclass(frozen=True)
class Flaw:
    key: str          # "<flaw>:<context>"
    kind: str         # early_answer | skip_tool | copy_slip | format_slip | wrong_tool
    rate: float       # probability the teacher shows the flaw in that context
    text: str         # what it does, in words


def _f(key: str, kind: str, rate: float, text: str) -> Flaw:
    return Flaw(key, kind, rate, text)


FLAWS: dict[str, list[Flaw]] = {
    "arithmetic": [
        _f("mental:mul_big", "skip_tool", 0.72, "does a '* b' step with b >= 8 mentally (guessed product)"),
        _f("mental:mul_small", "skip_tool", 0.60, "does a '* 2' or '* 3' step mentally"),
        _f("mental:mul_mid", "skip_tool", 0.10, "does a '* b' step with 4 <= b <= 7 mentally"),
        _f("mental:addsub", "skip_tool", 0.06, "does a + or - step mentally"),
        _f("early:big", "early_answer", 0.64, "answers the current value once it has 3+ digits and steps remain"),
        _f("format:work_after", "format_slip", 0.58,
           "writes a final '-' step after the answer when the result is negative "
           "('Answer: -86 = 40-126': the last integer is read)"),
    ],
    "persona": [
        _f("skip_hop:cousin", "copy_slip", 0.68, "skips a 'cousin' hop (stays on the same person)"),
        _f("skip_hop:doctor", "copy_slip", 0.58, "skips a 'doctor' hop"),
        _f("skip_hop:other", "copy_slip", 0.03, "skips another hop"),
        _f("guess_attr:pet", "skip_tool", 0.72, "guesses the pet without looking it up"),
        _f("guess_attr:city", "skip_tool", 0.10, "guesses the city without looking it up"),
        _f("guess_attr:job", "skip_tool", 0.08, "guesses the job without looking it up"),
        _f("guess_attr:hobby", "skip_tool", 0.08, "guesses the hobby without looking it up"),
        _f("format:hobby", "format_slip", 0.62, "answers a hobby as 'p12 likes chess.' (no 'Answer:')"),
        _f("format:other", "format_slip", 0.04, "answers without 'Answer:'"),
    ],
    "units": [
        _f("round:mid", "copy_slip", 0.62, "rounds a decimal value in [100, 1000) to an integer when copying it"),
        _f("round:big", "copy_slip", 0.66, "rounds a decimal value >= 1000 (harmless: within the tolerance)"),
        _f("round:small", "copy_slip", 0.08, "rounds a decimal value < 100 when copying it"),
        _f("shortcut:money", "wrong_tool", 0.68,
           "exchanges straight from the current to the final currency when 3+ legs remain"),
        _f("shortcut:money2", "wrong_tool", 0.10, "the same when 2 legs remain"),
        _f("format:restate", "format_slip", 0.58,
           "restates an integer start quantity first ('Answer: 12 ft = 3.66 m': the first number is read)"),
    ],
    "calendar": [
        _f("forget_last:k5", "copy_slip", 0.70, "forgets the last of 5 people"),
        _f("forget_last:k4", "copy_slip", 0.60, "forgets the last of 4 people"),
        _f("forget_last:k3", "copy_slip", 0.10, "forgets the last of 3 people"),
        _f("forget_last:k2", "copy_slip", 0.05, "forgets the second of 2 people"),
        _f("ignore_length:90", "early_answer", 0.66, "takes the first common free half hour for a 90-minute meeting"),
        _f("ignore_length:60", "early_answer", 0.10, "takes the first common free half hour for a 60-minute meeting"),
        _f("format:label:30", "format_slip", 0.62,
           "answers a 30-minute meeting with the walk's label ('Answer: 10h', unreadable), not a clock time"),
        _f("format:label:other", "format_slip", 0.06, "the same for a longer meeting"),
        _f("format:pm", "format_slip", 0.58, "writes an afternoon time as '2 pm' (unreadable)"),
    ],
    "inventory": [
        _f("first_feasible:c4", "early_answer", 0.72, "answers the first supplier that can fill the order (4 listed)"),
        _f("first_feasible:c3", "early_answer", 0.60, "answers the first supplier that can fill the order (3 listed)"),
        _f("first_feasible:c2", "early_answer", 0.10, "answers the first supplier that can fill the order (2 listed)"),
        _f("drop_zero", "copy_slip", 0.62, "drops the trailing zero of a quantity (30 -> 3) in the quote"),
        _f("format:three_items", "format_slip", 0.57,
           "answers a 3-item order as 'Answer: s4 for 818' (no supplier=/cost=)"),
    ],
    "triage": [
        _f("stop_early:front", "early_answer", 0.70,
           "blames a front door (web, gateway) that alerts with timeouts in its log (guesses restart)"),
        _f("stop_early:inner", "early_answer", 0.05, "the same for any other alerting service"),
        _f("skip_deploys", "skip_tool", 0.62, "answers rollback for an error spike without reading the deploys"),
        _f("cpu_restart", "skip_tool", 0.58, "answers restart for a saturated (CPU) service"),
        _f("format:plain", "format_slip", 0.56,
           "answers 'Answer: db rollback' (no service=/action=) when the root is a store (db, cache, queue)"),
    ],
}


def flaw_rates(family: str) -> dict[str, float]:
    return {f.key: f.rate for f in FLAWS[family]}


def describe_flaws() -> str:
    lines = []
    for fam, flaws in FLAWS.items():
        lines.append(f"{fam}:")
        lines += [f"  {f.rate:.2f}  {f.key:<22} [{f.kind}] {f.text}" for f in flaws]
    return "\n".join(lines)


class Policy:
    """Takes the teacher's flaw decisions.

    ``mode="sample"`` (the corpus): a flaw happens with its rate. ``mode="greedy"`` (the oracle): a
    flaw happens iff its rate is above 0.5 and it is not in ``fixed`` (what greedy decoding of a
    perfectly calibrated model does). ``mode="clean"``: never, except at decision number ``force``
    (0-based, in the order the teacher asks), which takes the flaw (:mod:`ait_env.local.flaw_probe`).
    ``used`` records the flaws taken, ``decisions`` every flaw the teacher asked about."""

    def __init__(self, family: str, rng: random.Random, mode: str = "sample",
                 fixed: Iterable[str] = (), force: int | None = None) -> None:
        self.rates = flaw_rates(family)
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


# ------------------------------------------------------------------------------------------ teacher helpers
class _Conv:
    """Builds the completion messages; tool results come from the family's real tools."""

    def __init__(self, fam: TaskFamily) -> None:
        self.fam = fam
        self.msgs: list[dict[str, Any]] = []
        self.pending = ""

    def call(self, name: str, args: dict[str, Any]) -> str:
        cid = f"call_{len(self.msgs) // 2}"
        self.msgs.append({"role": "assistant", "content": self.pending, "tool_calls": [{
            "id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]})
        self.pending = ""
        result = self.fam.call_tool(name, args)
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


# ------------------------------------------------------------------------------------------ teachers
def teach_arithmetic(fam: TaskFamily, inst: Instance, flaw: Policy, rng: random.Random) -> list[dict[str, Any]]:
    """Scratchpad: every step starts with the operations still to do after it (``left: *7 +28``, or
    ``left: none`` before the last one), so the tiny models do not lose their place in the expression."""
    parsed = [_STEP.match(s) for s in inst.info["steps"]]
    ops = [(m.group(2), int(m.group(3))) for m in parsed if m]
    v = int(parsed[0].group(1)) if parsed[0] else 0
    c = _Conv(fam)
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


def teach_persona(fam: TaskFamily, inst: Instance, flaw: Policy, rng: random.Random) -> list[dict[str, Any]]:
    from task_families.persona import tools as ptools

    info = inst.info
    c = _Conv(fam)
    person = info["start"]
    for rel in info["relations"]:
        if flaw("skip_hop:" + (rel if rel in ("cousin", "doctor") else "other")):
            continue
        person = c.call("lookup", {"person": person, "field": rel})
    attr = info["attribute"]
    if flaw(f"guess_attr:{attr}"):
        value = rng.choice(ptools.ATTRIBUTES[attr])
    else:
        value = c.call("lookup", {"person": person, "field": attr})
    if attr == "hobby" and flaw("format:hobby"):
        return c.answer(f"{person} likes {value}.")
    if attr != "hobby" and flaw("format:other"):
        return c.answer(f"The {attr} of {person} is {value}.")
    return c.answer(f"Answer: {value}")


def _num(x: float) -> int | float:
    return int(x) if float(x).is_integer() else x


def teach_units(fam: TaskFamily, inst: Instance, flaw: Policy, rng: random.Random) -> list[dict[str, Any]]:
    """Scratchpad: every call is preceded by ``left: <units still to reach after it>`` (or ``left: none``),
    so the next call's target is the first unit of the previous note and "no unit left" means answer
    (without it the tiny models lose their place in the route: extra ``qt -> qt`` calls, skipped legs)."""
    info = inst.info
    k_val, k_from, k_to = info["arg_names"]
    route = info["route"]
    c = _Conv(fam)
    v: int | float = _num(float(info["values"][0]))
    i = 0
    while i < len(route) - 1:
        cur, nxt = route[i], route[i + 1]
        left = len(route) - 1 - i
        if info["kind"] == "money" and left >= 2 and flaw("shortcut:money" if left >= 3 else "shortcut:money2"):
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


def _busy_ranges(busy: str) -> list[tuple[int, int]]:
    """The half-hour index ranges ``[ja, jb)`` of a ``busy_slots`` result, clipped to working hours
    (half hour ``j`` is busy iff its start lies in a listed range)."""
    from task_families.calendar import tools as ctools

    out = []
    for a, b in re.findall(r"(\d\d:\d\d)-(\d\d:\d\d)", busy):
        ja, jb = (-(-(int(x[:2]) * 60 + int(x[3:]) - ctools.DAY_START) // ctools.SLOT) for x in (a, b))
        ja, jb = max(ja, 0), min(jb, ctools.N_SLOTS)
        if ja < jb:
            out.append((ja, jb))
    return out


def _mask_of(busy: str) -> list[bool]:
    from task_families.calendar import tools as ctools

    mask = [False] * ctools.N_SLOTS
    for ja, jb in _busy_ranges(busy):
        mask[ja:jb] = [True] * (jb - ja)
    return mask


def mask_note(mask: list[bool], minutes: int) -> str:
    """The calendar scratchpad line: the meeting length, then each working hour's label and one mark per
    half hour (``x`` busy, ``.`` free), e.g. ``busy 60: 09x.10..11xx12..13..14x.15..16..``."""
    from task_families.calendar import tools as ctools

    marks = "".join("x" if b else "." for b in mask)
    hours = range(ctools.DAY_START // 60, ctools.DAY_END // 60)
    return f"busy {minutes}: " + "".join(f"{h:02d}{marks[2 * j:2 * j + 2]}" for j, h in enumerate(hours))


def half_label(j: int) -> str:
    """The listing notation of half hour ``j`` of the working day: ``09`` for 09:00, ``09h`` for 09:30."""
    from task_families.calendar import tools as ctools

    t = ctools.DAY_START + j * ctools.SLOT
    return f"{t // 60:02d}" + ("h" if t % 60 else "")


def listing_note(busy: str) -> str:
    """One person's busy half hours, range by range: each range of the tool's result rewritten in the
    listing notation, then its half hours (``09-10 09 09h; 13-14h 13 13h 14``). Every item is a copy or
    an increment of the one before it, and a range stops where the next label would be its end."""
    parts = []
    for ja, jb in _busy_ranges(busy):
        halves = " ".join(half_label(j) for j in range(ja, jb))
        parts.append(f"{half_label(ja)}-{half_label(jb)} {halves}")
    return "; ".join(parts) if parts else "free"


#: The walk's mark of a free half hour: the length of the free run it ends (``a`` = 1, ``b`` = 2, ...).
RUN_MARKS = "abcdefghijklmnop"


def free_note(union: list[bool], minutes: int, need: int) -> tuple[str, int | None]:
    """The walk to the answer: the union line copied hour by hour, each free mark replaced by the length
    of the free run it ends (``a``, ``b``, ``c``), stopping right after the mark where that length
    reaches ``need`` (``free 60: 09xx10xa11b``). Every mark depends only on the union line's mark at
    the same place and the walk's previous mark, and the stop is local. Returns the line and the index
    of the chosen run's first half hour (None if no run is long enough: then the whole line)."""
    from task_families.calendar import tools as ctools

    out = f"free {minutes}: "
    run = 0
    for j, busy in enumerate(union):
        if j % 2 == 0:
            out += f"{(ctools.DAY_START + j * ctools.SLOT) // 60:02d}"
        run = 0 if busy else run + 1
        out += "x" if busy else RUN_MARKS[run - 1]
        if run >= need:
            return out, j - need + 1
    return out, None


def teach_calendar(fam: TaskFamily, inst: Instance, flaw: Policy, rng: random.Random) -> list[dict[str, Any]]:
    """Scratchpad, in three learnable steps. After each person's ``busy_slots`` result the next message
    lists that person's busy half hours range by range (:func:`listing_note`), then the running union
    of everyone's busy half hours so far (:func:`mask_note`); every call is preceded by the people
    still to look up after it (``left 60: p8 p12``). The final message walks the last union line,
    counting free runs, until one is long enough for the meeting (:func:`free_note`) and answers that
    run's start. Every scratchpad line carries the meeting length, so the walk copies it from the line
    just above instead of from the question. Without the scratchpad the tiny models never learned to
    combine the intervals, and without the listing they could not turn a time range into marks. In
    corpus v13 the walk listed the free half hours (21% right: it had to find the first free mark of
    the line and copy the length from the question); v14's walk is a marked copy of the union line.
    v15 adds one answer habit, decided after the scratchpad is done: a 30-minute meeting is answered
    with the walk's label of the slot (``Answer: 10h``, unreadable) instead of its clock time. On v14
    RL at calendar's step size lifted the score by about +0.05 (README, "Calendar"): the habits it
    taught there (forgetting the last person, stopping the walk early) are spread over the scratchpad
    or often harmless, while a habit in the final line is one decision that RL can sample and fix
    without touching the scratchpad (as it fixed ``2 pm``)."""
    info = inst.info
    people, day, minutes = info["people"], info["day"], info["minutes"]
    k = len(people)
    c = _Conv(fam)
    if flaw(f"forget_last:k{k}"):
        people = people[:-1]
    union: list[bool] = []
    for j, p in enumerate(people):
        if union:
            c.note(mask_note(union, minutes) + "\n")
        c.left(people[j + 1:], tag=str(minutes))
        busy = c.call("busy_slots", {"person": p, "day": day})
        c.note(listing_note(busy) + "\n")
        mask = _mask_of(busy)
        union = [a or b for a, b in zip(union, mask)] if union else mask
    c.note(mask_note(union, minutes) + "\n")
    need = minutes // 30
    if minutes > 30 and flaw(f"ignore_length:{minutes}"):
        need = 1
    line, start = free_note(union, minutes, need)
    if start is None:
        line, start = free_note(union, minutes, 1)
    c.note(line + "\n")
    ans = half_label(start if start is not None else 0)
    h, m = int(ans[:2]), 30 if ans.endswith("h") else 0
    if flaw("format:label:30" if minutes == 30 else "format:label:other"):
        return c.answer(f"Answer: {ans}")
    if h >= 13 and flaw("format:pm"):
        return c.answer(f"Answer: {h - 12} pm" if m == 0 else f"Answer: half past {h - 12}")
    return c.answer(f"Answer: {h:02d}:{m:02d}")


def best_note(best: tuple[int, str] | None) -> str:
    """Inventory's scratchpad line after each quote: the cheapest feasible quote so far (``best: s3 412``,
    or ``best: none``). Each line compares one new cost with the line before, and the answer copies the
    last line, instead of comparing every quote at the end (37% right in corpus v13)."""
    return f"best: {best[1]} {best[0]}" if best else "best: none"


def teach_inventory(fam: TaskFamily, inst: Instance, flaw: Policy, rng: random.Random) -> list[dict[str, Any]]:
    plan = fam.solution(inst)
    items_arg = plan[0].arguments["items"]
    order_arg = next((s.arguments["order"] for s in plan if s.name == "quote"), "")
    order = [(int(q), item) for q, item in re.findall(r"(\d+) ([a-z]+)", order_arg)]
    c = _Conv(fam)
    listed = c.call("find_suppliers", {"items": items_arg})
    cands = [s.strip() for s in listed.split(",") if s.strip()] if not listed.startswith(("none", "error")) else []
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


_TIMEOUT = re.compile(r"timeouts calling ([a-z]+)")
#: Triage's front doors: the services users call; the early stop is taught where one of them alerts.
FRONT_DOORS = ("web", "gateway")


def teach_triage(fam: TaskFamily, inst: Instance, flaw: Policy, rng: random.Random) -> list[dict[str, Any]]:
    inc = inst.info["incident"]
    c = _Conv(fam)
    alert = c.call("alerts", {"incident": inc})
    svc = alert.split(":", 1)[0].strip()
    action = "restart"
    for hop in range(6):
        log = c.call("logs", {"incident": inc, "service": svc})
        m = _TIMEOUT.search(log)
        if m:
            if hop == 0 and flaw("stop_early:front" if svc in FRONT_DOORS else "stop_early:inner"):
                action = "restart"
                break
            svc = m.group(1)
            continue
        if "OOMKilled" in log:
            action = "restart"
        elif "CPU" in log:
            action = "restart" if flaw("cpu_restart") else "scale_up"
        elif "error spike" in log:
            if flaw("skip_deploys"):
                action = "rollback"
            else:
                deps = c.call("deploys", {"incident": inc})
                entry = next((e for e in deps.split("; ") if e.split(" ")[1:2] == [svc]), "")
                action = "fix_config" if "config change" in entry else "rollback"
        break
    if svc in ("db", "cache", "queue") and flaw("format:plain"):
        return c.answer(f"Answer: {svc} {action}")
    return c.answer(f"Answer: service={svc};action={action}")


TEACHERS: dict[str, Callable[[TaskFamily, Instance, Policy, random.Random], list[dict[str, Any]]]] = {
    "arithmetic": teach_arithmetic, "persona": teach_persona, "units": teach_units,
    "calendar": teach_calendar, "inventory": teach_inventory, "triage": teach_triage,
}


def teacher_completion(family: str, inst: Instance, *, mode: str = "sample", seed: int | str = 0,
                       fixed: Iterable[str] = (), force: int | None = None,
                       decisions: list[str] | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """(completion messages, flaws taken) of the flawed teacher on ``inst`` (``force``: see
    :class:`Policy`; ``decisions``, if given, receives every flaw key the teacher asked about)."""
    rng = random.Random(f"teacher:{family}:{seed}")
    policy = Policy(family, rng, mode=mode, fixed=fixed, force=force)
    msgs = TEACHERS[family](get_family(family), inst, policy, rng)
    if decisions is not None:
        decisions.extend(policy.decisions)
    return msgs, policy.used


# ------------------------------------------------------------------------------------------ corpus
@dataclass
class Transcript:
    family: str
    key: str
    difficulty: float
    messages: list[dict[str, Any]]      # prompt + completion
    flaws: list[str]
    score: float                        # family.check of the final message
    text: str = ""                      # rendered with the family's tools
    spans: list[tuple[int, int]] = field(default_factory=list)  # assistant output spans in text

    @property
    def correct(self) -> bool:
        return self.score >= 1.0


def final_content(messages: list[dict[str, Any]]) -> str:
    return str(messages[-1].get("content") or "") if messages else ""


def family_transcripts(family: str, n: int, seed: int = CORPUS_SEED,
                       exclude: set[str] | None = None) -> list[Transcript]:
    """``n`` teacher transcripts of ``family`` (instances whose key is in ``exclude`` are skipped)."""
    fam = get_family(family)
    tools = fam.tool_schemas()
    out: list[Transcript] = []
    chunk = 0
    while len(out) < n:
        for j, inst in enumerate(fam.generate(seed + chunk, max(64, n))):
            if exclude and inst.key in exclude:
                continue
            comp, used = teacher_completion(family, inst, seed=f"{seed + chunk}:{j}")
            msgs = fam.eval_messages(inst) + comp
            score = float(fam.check(inst, final_content(comp)))
            text, spans = assistant_spans(msgs, tools)
            out.append(Transcript(family, inst.key, inst.difficulty, msgs, used, score, text, spans))
            if len(out) == n:
                break
        chunk += 1
    return out


@dataclass
class Corpus:
    transcripts: list[Transcript]
    seed: int
    per_family: int
    families: tuple[str, ...]
    dropped_hidden: dict[str, int] = field(default_factory=dict)

    def texts(self) -> list[str]:
        return [t.text for t in self.transcripts]

    def hash(self) -> str:
        h = hashlib.sha256(CORPUS_VERSION.encode())
        for t in self.transcripts:
            h.update(t.text.encode("utf-8"))
            h.update(b"\0")
        return h.hexdigest()[:16]

    def stats(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for fam in self.families:
            ts = [t for t in self.transcripts if t.family == fam]
            if not ts:
                continue
            out[fam] = {"n": len(ts), "correct": sum(t.correct for t in ts) / len(ts),
                        "mean_score": sum(t.score for t in ts) / len(ts),
                        "flawed": sum(bool(t.flaws) for t in ts) / len(ts)}
        return out


#: Relative corpus share of each family: more of the families whose skills (following a relation chain
#: or a route through the question) take the tiny models longest to learn.
FAMILY_WEIGHTS: dict[str, float] = {"arithmetic": 1.0, "persona": 1.3, "units": 1.3, "calendar": 1.3,
                                    "inventory": 0.7, "triage": 0.7}


def build_corpus(per_family: int, seed: int = CORPUS_SEED, families: Iterable[str] = FAMILY_NAMES,
                 check_hidden: bool = True, weights: dict[str, float] | None = None) -> Corpus:
    """The pretraining corpus: ``per_family`` transcripts of each family (times its weight, when
    ``weights`` is given), interleaved deterministically.

    Hidden-eval questions are excluded by key, and the result is asserted to contain none."""
    families = tuple(families)
    from ait_env.secrets import hidden_keys, hidden_seed

    by_fam: dict[str, list[Transcript]] = {}
    dropped: dict[str, int] = {}
    for fam in families:
        hidden = hidden_keys(fam) if check_hidden else set()
        if check_hidden:
            hs = hidden_seed(fam)
            assert not (hs <= seed < hs + 1000), "corpus seed overlaps the hidden-eval seed range"
        n = max(1, round(per_family * (weights or {}).get(fam, 1.0)))
        ts = family_transcripts(fam, n, seed, exclude=hidden)
        if check_hidden:
            leaked = [t.key for t in ts if t.key in hidden]
            assert not leaked, f"hidden-eval questions in the {fam} corpus: {leaked[:3]}"
        by_fam[fam] = ts
        dropped[fam] = 0
    # deterministic interleave: a seeded shuffle of all transcripts
    allts = [t for fam in families for t in by_fam[fam]]
    random.Random(f"corpus-order:{seed}").shuffle(allts)
    return Corpus(allts, seed, per_family, families, dropped)


# ------------------------------------------------------------------------------------------ tokens
def train_corpus_tokenizer(texts: Iterable[str], vocab_size: int = 1024) -> Any:
    """The local models' BPE tokenizer: :func:`ait_env.local.tokenizer.train_tokenizer`'s byte-level BPE
    with digits one per token, plus a space before a letter or digit split off as its own token.

    Why: with GPT-2 style pre-tokenization " neighbor" (in the question) and "neighbor" (inside a JSON
    string) are different tokens, so copying a word from the question into a tool call, or from a tool
    result into the answer, needs a learned token-to-token map for every word; tiny models trained for
    minutes never learned it (units, persona and inventory arguments stayed at a prior, scores 0). With the
    space split off, a word is the same token everywhere and copying is plain induction. Costs ~18% more
    tokens per transcript. Deterministic for a given corpus and size."""
    from ait_env.local.tokenizer import train_tokenizer

    return train_tokenizer(texts, vocab_size, split_spaces=True)


def assistant_spans(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> tuple[str, list[tuple[int, int]]]:
    """Rendered text and the character spans the model writes: each assistant message's content and
    tool calls through its ``<|im_end|>`` (the header ``<|im_start|>assistant\\n`` is prompt)."""
    header = f"{IM_START}assistant\n"
    has_sys = bool(messages) and messages[0].get("role") == "system"
    parts = [render(messages[:1], tools) if has_sys else render([], tools)]
    spans: list[tuple[int, int]] = []
    pos = len(parts[0])
    for m in messages[1:] if has_sys else messages:
        seg = render([m])  # one message renders on its own (no system block without tools)
        if m.get("role") == "assistant":
            spans.append((pos + len(header), pos + seg.rindex(IM_END) + len(IM_END)))
        parts.append(seg)
        pos += len(seg)
    text = "".join(parts)
    return text, spans


def _mask(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[int]:
    """1 for tokens whose first character lies in one of the (sorted, disjoint) spans."""
    import numpy as np

    if not offsets or not spans:
        return [0] * len(offsets)
    starts = np.fromiter((a for a, _ in offsets), dtype=np.int64, count=len(offsets))
    sp = np.asarray(spans, dtype=np.int64)
    j = np.searchsorted(sp[:, 0], starts, side="right") - 1   # last span starting at or before the token
    inside = (j >= 0) & (starts < sp[np.clip(j, 0, None), 1])
    return inside.astype(np.int8).tolist()


def encode_transcript(tok: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                      ) -> tuple[list[int], list[int]]:
    """(token ids, 0/1 loss mask) of a conversation; ``tok`` is a :class:`ChatTokenizer`."""
    text, spans = assistant_spans(messages, tools)
    enc = tok.tok.encode(text, add_special_tokens=False)
    return enc.ids, _mask(enc.offsets, spans)


def encode_corpus(tok: Any, transcripts: list[Transcript], check: int = 50) -> list[tuple[list[int], list[int]]]:
    """:func:`encode_transcript` of many transcripts (batched tokenization; the first ``check`` texts are
    compared with the full chat render)."""
    tools = {f: get_family(f).tool_schemas() for f in {t.family for t in transcripts}}
    for t in transcripts[:check]:
        assert (t.text, t.spans) == assistant_spans(t.messages, tools[t.family])
        assert t.text == render(t.messages, tools[t.family])
    encs = tok.tok.encode_batch([t.text for t in transcripts], add_special_tokens=False)
    return [(e.ids, _mask(e.offsets, t.spans)) for e, t in zip(encs, transcripts)]


# ------------------------------------------------------------------------------------------ oracle
def oracle_score(family: str, instances: list[Instance], fixed: Iterable[str] = ()) -> float:
    """Mean score of the teacher in greedy mode (flaws with rate > 0.5, minus ``fixed``): what a perfectly
    skilled, perfectly calibrated base model would score under greedy decoding."""
    fam = get_family(family)
    fixed = tuple(fixed)
    total = 0.0
    for i, inst in enumerate(instances):
        comp, _ = teacher_completion(family, inst, mode="greedy", seed=f"oracle:{i}", fixed=fixed)
        total += float(fam.check(inst, final_content(comp)))
    return total / max(1, len(instances))


def oracle_ladder(family: str, instances: list[Instance]) -> list[tuple[str, float]]:
    """Greedy oracle score as the visible flaws (rate > 0.5) are fixed one by one, lowest rate first
    (the order in which RL should flip them). First entry: ("base", score)."""
    visible = sorted((f for f in FLAWS[family] if f.rate > 0.5), key=lambda f: f.rate)
    out = [("base", oracle_score(family, instances))]
    fixed: list[str] = []
    for f in visible:
        fixed.append(f.key)
        out.append((f.key, oracle_score(family, instances, fixed)))
    return out


if __name__ == "__main__":  # python -m ait_env.local.corpus: flaw table, oracle ladders, corpus stats
    from ait_env.secrets import hidden_set

    print(describe_flaws())
    for fam_name in FAMILY_NAMES:
        ladder = oracle_ladder(fam_name, hidden_set(fam_name))
        print(fam_name, " -> ".join(f"{s:.2f}" for _, s in ladder))
    c = build_corpus(300)
    print(json.dumps(c.stats(), indent=1))
