"""The dispatcher's state: one tracked key (:class:`_Entry`) and the attributes its parts share (:class:`_State`)."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from fleet.journal import Journal
from fleet.settings import DispatchOptions

from fleet.dispatch.engine import Engine


_log = logging.getLogger('fleet.dispatch')
#: jobs a submitter takes from the local queue at once (recorded in one transaction, then sent one by one)
_SEND_BATCH = 32


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


@dataclass
class _Entry:
    """One key tracked by this orchestrator. States: ``pending`` (in the local queue), ``sending`` (a
    submitter has it), ``sent`` (ours, polled), ``cancelling`` (ours, a cancel is due or being retried),
    ``foreign`` (another live orchestrator owns the row: followed through the journal), ``done``."""

    key: str
    kind: str
    claimant: str
    make: Callable[[], dict[str, Any]] | None   # builds what to (re)send; None: adopted, not resendable
    episode_id: str | None = None
    job_id: str | None = None
    attempt: int = 1
    first_attempt: int = 1                  # the claim's first attempt: retries are counted from it
    state: Literal["pending", "sending", "sent", "cancelling", "foreign", "done"] = "pending"
    sent_at: float = 0.0                    # the journal's clock when the current attempt was sent
    next_poll: float = 0.0
    seen: str = ""
    status_errors: int = 0                  # status reads failed in a row (the backoff's exponent)
    last_error: str = ""
    cancel_status: Literal["failed", "timed_out"] = "timed_out"
    cancel_why: str = ""
    cancel_next: float = 0.0
    cancel_tries: int = 0
    done: threading.Event = field(default_factory=threading.Event)
    body: dict[str, Any] | None = None      # what make() built (kept for retries)
    unsent: int = 0                         # attempts that surely queued nothing (not counted as retries)
    send_window_end: float | None = None    # a job not sent by then (throttled, unreachable) is infra_failed




class _State:
    """What the dispatcher's parts share (set by :meth:`fleet.dispatch.Dispatcher.__init__`): each part is a
    mixin of :class:`fleet.dispatch.Dispatcher` in a module of its own."""

    engine: Engine
    journal: Journal
    options: DispatchOptions
    wall_clock_s: float
    show_progress: bool
    closed: bool
    max_in_flight: int
    _on_result: Callable[[str, dict[str, Any]], str]
    _clock: Callable[[], float]
    _threads_on: bool
    _session_id: str
    _owner: str
    _beat_at: float
    _adopt_at: float
    _entries: dict[str, _Entry]
    _pending: deque[str]
    _held: list[tuple[float, str]]
    _out: set[str]
    _lock: threading.RLock
    _cv: threading.Condition
    _claim_lock: threading.Lock
    _wake: threading.Event
    _stop: threading.Event
    _poller: threading.Thread | None
    _submitters: list[threading.Thread]
    _cancelled: set[str]
    _attaching: list[tuple[_Entry, str]]

    def say(self, msg: str) -> None:
        raise NotImplementedError

    def _start_threads(self) -> None:
        raise NotImplementedError
