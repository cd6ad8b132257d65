"""Tools of the calendar family (the inner model calls these; identical in training and eval).

The world is a fixed, hash-defined set of work calendars: people ``p1`` .. ``p99``, weekdays Mon to
Fri, working hours 09:00-17:00 on a 30-minute grid. A person's busy times on a day are a pure
function of the person id and the day.
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache

N_PEOPLE = 99
DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri")
DAY_START = 9 * 60
DAY_END = 17 * 60
SLOT = 30
N_SLOTS = (DAY_END - DAY_START) // SLOT  # 16 half-hours

_ID = re.compile(r"p([1-9]\d?)")
_DAY_NAMES = {d.lower(): d for d in DAYS}
_DAY_NAMES.update({"monday": "Mon", "tuesday": "Tue", "wednesday": "Wed", "thursday": "Thu", "friday": "Fri"})


def _h(*parts: str) -> int:
    return int(hashlib.sha256(":".join(("calendar",) + parts).encode("utf-8")).hexdigest()[:12], 16)


def busy_mask(person: str, day: str) -> list[bool]:
    """Busy flag of each half-hour slot (not a tool; ``person`` and ``day`` must be canonical).

    The day alternates busy stretches of 30-120 min and free stretches of 30-150 min; the
    alternation starts before 09:00 so that mornings are as busy as afternoons."""
    return list(_busy_mask(person, day))


@lru_cache(maxsize=1024)
def _busy_mask(person: str, day: str) -> tuple[bool, ...]:
    warm = 8
    busy = _h(person, day, "first") % 2 == 0
    mask: list[bool] = []
    j = 0
    while len(mask) < warm + N_SLOTS:
        length = 1 + _h(person, day, str(j)) % (4 if busy else 5)
        mask += [busy] * length
        busy = not busy
        j += 1
    return tuple(mask[warm:warm + N_SLOTS])


def hhmm(minutes: int) -> str:
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def busy_intervals(mask: list[bool]) -> list[tuple[int, int]]:
    """Merged busy intervals of a slot mask, in minutes since midnight."""
    out: list[tuple[int, int]] = []
    i = 0
    while i < len(mask):
        if mask[i]:
            j = i
            while j < len(mask) and mask[j]:
                j += 1
            out.append((DAY_START + i * SLOT, DAY_START + j * SLOT))
            i = j
        else:
            i += 1
    return out


def busy_slots(person: str, day: str) -> str:
    """List the times a person is busy on a weekday (working hours are 09:00-17:00).

    Args:
        person: A person id from p1 to p99, e.g. "p12".
        day: A weekday: Mon, Tue, Wed, Thu or Fri.

    Returns:
        The busy intervals, e.g. "09:00-10:30, 13:00-14:00", or a message starting with "error:".
    """
    pid = str(person).strip().lower()
    m = _ID.fullmatch(pid)
    if m is None:
        return f"error: unknown person {str(person)[:20]!r}; ids are p1..p{N_PEOPLE}"
    canon_day = _DAY_NAMES.get(str(day).strip().lower())
    if canon_day is None:
        return f"error: unknown day {str(day)[:20]!r}; days: {', '.join(DAYS)}"
    spans = busy_intervals(busy_mask(pid, canon_day))
    return ", ".join(f"{hhmm(a)}-{hhmm(b)}" for a, b in spans) or "none"


TOOLS = [busy_slots]
