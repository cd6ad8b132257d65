"""The engine contract of the dispatch core (:class:`Engine`: send, statuses, cancel, bill, bounds) and what a
send can end in (:class:`SendFailed`, :class:`SendRefused`, :class:`SendUncertain`), plus the dispatch
vocabulary (:data:`IN_FLIGHT`, :data:`AttemptStatus`)."""

from __future__ import annotations

import math
from typing import Any, Protocol

from fleet.billing import Limits, RunpodJobStatus
from fleet.journal import Billing, Session



#: the in-flight statuses of the dispatch vocabulary, and what the journal calls them
IN_FLIGHT = {"IN_QUEUE": "in_queue", "IN_PROGRESS": "in_progress"}
#: what a worker spends on a request besides the job's own limit (self-check, unpacking the bundle, killing
#: what the job left, packing the result): added to the worker's limit for the engine's execution limit
WORKER_OVERHEAD_S = 300.0

#: an attempt's status, in the dispatch vocabulary (Runpod's job status fields; another engine maps to them)
AttemptStatus = RunpodJobStatus


class SendFailed(RuntimeError):
    """The send surely queued nothing (e.g. a 429, no connection): the job is sent again after
    ``retry_after_s`` (the provider's ``Retry-After``; None: the dispatcher's backoff), within its send window."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        wait = retry_after_s
        self.retry_after_s = wait if wait is not None and math.isfinite(wait) and wait >= 0 else None


class SendRefused(RuntimeError):
    """The engine refused the job as ours (key, endpoint, payload): the job ends infra_failed."""


class SendUncertain(RuntimeError):
    """The send got no clear answer: a job may be queued unseen, and without its id it cannot be cancelled."""


class AttemptGone(RuntimeError):
    """The engine no longer knows the attempt (its result expired, its ttl ran out): it may have run."""


class Engine(Protocol):
    """What the dispatch core needs of a service that runs GPU-worker requests (see the module docstring)."""

    #: the engine's name in messages ("runpod")
    name: str
    #: the longest a send may retry after it was recorded (the attempt's hard end is counted from it)
    send_retry_s: float
    #: how long after an attempt ended the engine still answers its status (the window in which an id it
    #: gave twice can name an earlier attempt's job)
    status_kept_s: float
    #: the endpoint's (or pool's) idle timeout: the idle bound after an attempt
    idle_timeout_s: float
    #: jobs the engine runs at once (the default of ``max_in_flight``)
    workers_max: int

    def send(self, body: dict[str, Any], limits: Limits) -> str: ...

    def statuses(self, ids: list[str]) -> dict[str, AttemptStatus | Exception]: ...

    def read(self, job_id: str) -> AttemptStatus | None: ...

    def find(self, tag: str) -> str | None:
        """The id of the attempt sent with ``tag``, when the engine can list its jobs by it (a lost id found
        again); None when it finds none or cannot look."""
        ...

    def cancel(self, job_id: str) -> bool: ...

    def bill(self, st: AttemptStatus | None, worker: dict[str, Any] | None) -> Billing: ...

    def bound_rate(self) -> float: ...

    def bound_gpus(self) -> tuple[str, int]: ...

    def session(self, session_id: str, started: float) -> Session: ...
