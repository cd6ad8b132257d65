"""Calendar's flawed teacher (:mod:`task_families.teacher`): one ``busy_slots`` call per person, then a
walk over the union of their busy half hours.

Flaws: the last person forgotten (by number of people), the meeting length ignored, and answers the
checker cannot read (the walk's label, ``2 pm``).
"""

from __future__ import annotations

import random
import re
from typing import Any

from task_families.base import Instance, TaskFamily
from task_families.calendar import tools
from task_families.teacher import Dialogue, Flaw, Policy, Teacher

FLAWS = (
    Flaw("forget_last:k5", "copy_slip", 0.70, "forgets the last of 5 people"),
    Flaw("forget_last:k4", "copy_slip", 0.60, "forgets the last of 4 people"),
    Flaw("forget_last:k3", "copy_slip", 0.10, "forgets the last of 3 people"),
    Flaw("forget_last:k2", "copy_slip", 0.05, "forgets the second of 2 people"),
    Flaw("ignore_length:90", "early_answer", 0.66,
         "takes the first common free half hour for a 90-minute meeting"),
    Flaw("ignore_length:60", "early_answer", 0.10,
         "takes the first common free half hour for a 60-minute meeting"),
    Flaw("format:label:30", "format_slip", 0.62,
         "answers a 30-minute meeting with the walk's label ('Answer: 10h', unreadable), not a clock time"),
    Flaw("format:label:other", "format_slip", 0.06, "the same for a longer meeting"),
    Flaw("format:pm", "format_slip", 0.58, "writes an afternoon time as '2 pm' (unreadable)"),
)


def _busy_ranges(busy: str) -> list[tuple[int, int]]:
    """The half-hour index ranges ``[ja, jb)`` of a ``busy_slots`` result, clipped to working hours
    (half hour ``j`` is busy iff its start lies in a listed range)."""
    out = []
    for a, b in re.findall(r"(\d\d:\d\d)-(\d\d:\d\d)", busy):
        ja, jb = (-(-(int(x[:2]) * 60 + int(x[3:]) - tools.DAY_START) // tools.SLOT) for x in (a, b))
        ja, jb = max(ja, 0), min(jb, tools.N_SLOTS)
        if ja < jb:
            out.append((ja, jb))
    return out


def _mask_of(busy: str) -> list[bool]:
    mask = [False] * tools.N_SLOTS
    for ja, jb in _busy_ranges(busy):
        mask[ja:jb] = [True] * (jb - ja)
    return mask


def mask_note(mask: list[bool], minutes: int) -> str:
    """The calendar scratchpad line: the meeting length, then each working hour's label and one mark per
    half hour (``x`` busy, ``.`` free), e.g. ``busy 60: 09x.10..11xx12..13..14x.15..16..``."""
    marks = "".join("x" if b else "." for b in mask)
    hours = range(tools.DAY_START // 60, tools.DAY_END // 60)
    return f"busy {minutes}: " + "".join(f"{h:02d}{marks[2 * j:2 * j + 2]}" for j, h in enumerate(hours))


def half_label(j: int) -> str:
    """The listing notation of half hour ``j`` of the working day: ``09`` for 09:00, ``09h`` for 09:30."""
    t = tools.DAY_START + j * tools.SLOT
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
    out = f"free {minutes}: "
    run = 0
    for j, busy in enumerate(union):
        if j % 2 == 0:
            out += f"{(tools.DAY_START + j * tools.SLOT) // 60:02d}"
        run = 0 if busy else run + 1
        out += "x" if busy else RUN_MARKS[run - 1]
        if run >= need:
            return out, j - need + 1
    return out, None


def teach(fam: TaskFamily, inst: Instance, flaw: Policy, rng: random.Random) -> list[dict[str, Any]]:
    """Scratchpad, in three learnable steps. After each person's ``busy_slots`` result the next message
    lists that person's busy half hours range by range (:func:`listing_note`), then the running union
    of everyone's busy half hours so far (:func:`mask_note`); every call is preceded by the people
    still to look up after it (``left 60: p8 p12``). The final message walks the last union line,
    counting free runs, until one is long enough for the meeting (:func:`free_note`) and answers that
    run's start. Every scratchpad line carries the meeting length, so the walk copies it from the line
    just above instead of from the question. Without the scratchpad the tiny models never learned to
    combine the intervals, and without the listing they could not turn a time range into marks. The
    answer habits (the walk's label ``Answer: 10h`` for a 30-minute meeting, ``2 pm``) are decided after
    the scratchpad is done: one decision in the final line, which RL can sample and fix without touching
    the scratchpad (how the teacher got here: ``research/corpus_history.md``)."""
    info = inst.info
    people, day, minutes = info["people"], info["day"], info["minutes"]
    k = len(people)
    c = Dialogue(fam, inst)
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


TEACHER = Teacher(FLAWS, teach)
