"""The simulated clock: an event queue; ``now`` moves only when events run (no sleeping)."""

from __future__ import annotations

import heapq
import itertools
from typing import Callable




class SimClock:
    """A simulated clock with an event queue. ``now`` only moves when events run."""

    def __init__(self) -> None:
        self.now = 0.0
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()

    def schedule(self, at: float, action: Callable[[], None]) -> None:
        if at < self.now:
            raise ValueError(f"cannot schedule in the past ({at} < {self.now})")
        heapq.heappush(self._events, (at, next(self._seq), action))

    def next_at(self) -> float | None:
        """When the earliest pending event runs (None: no event left)."""
        return self._events[0][0] if self._events else None

    def run_next(self) -> bool:
        """Run the earliest event; False when none is left."""
        if not self._events:
            return False
        at, _, action = heapq.heappop(self._events)
        self.now = at
        action()
        return True

    def run_until(self, done: Callable[[], bool]) -> None:
        while not done():
            if not self.run_next():
                raise RuntimeError("simulation stalled: no event left and the condition is not met")

    def advance_to(self, at: float) -> None:
        """Run every event up to ``at`` and set the clock there."""
        while self._events and self._events[0][0] <= at:
            self.run_next()
        self.now = max(self.now, at)

    def drain(self) -> None:
        while self.run_next():
            pass
