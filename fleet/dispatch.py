"""The dispatch core of a GPU fleet: jobs for the GPU worker sent to an engine (Runpod Serverless today;
an engine adapter is all a second one needs), durably, never paid twice, within budgets, never blocking.

:class:`Dispatcher` owns the journal's rows of one orchestrator (:mod:`fleet.journal`), a local queue,
**submitter threads** that record and send queued jobs while fewer than ``max_in_flight`` are out, and
**one poller thread** that reads the status of every job in flight, checks every deadline on every sweep
(also while status reads fail), cancels, and wakes each waiter when its job ends. The poller never sends
or sleeps on a send's back-off. What a guarantee means, with the test that shows it, is in docs/fleet.md
("Guarantees under faults"); the ``runpod`` backend's docstring says how it uses this core.

The engine (:class:`Engine`) is the only part that knows the service: it sends an attempt (with its
limits) and says whether a failed send surely queued nothing (:class:`SendFailed`), was refused as ours
(:class:`SendRefused`), or may have queued a job unseen (:class:`SendUncertain`); reads statuses in the
dispatch vocabulary (:data:`IN_FLIGHT` and the final ``COMPLETED``, ``FAILED``, ``TIMED_OUT``,
``CANCELLED``; :class:`AttemptGone` when the engine no longer knows the attempt); cancels; and bills an
attempt (:meth:`Engine.bill`) or bounds one whose bill cannot be read (:meth:`Engine.bound_rate`).
Everything else (keys, claims, attempts and their deadlines, retries, budgets, owners and adoption, run
costs) is here, the same for every engine.
"""

from __future__ import annotations

import logging
import math
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from ait_env.jobs.settings import EVAL_ALLOWANCE_S
from fleet.billing import Limits, RunpodJobStatus, billing_problem
from fleet.journal import ATTACHED, DUPLICATE_ID, Billing, Journal, JournalRow, RowStatus, RunCosts, Session, this_owner
from fleet.settings import DispatchOptions

_log = logging.getLogger(__name__)
#: the in-flight statuses of the dispatch vocabulary, and what the journal calls them
IN_FLIGHT = {"IN_QUEUE": "in_queue", "IN_PROGRESS": "in_progress"}
#: what a worker spends on a request besides the job's own limit (self-check, unpacking the bundle, killing
#: what the job left, packing the result): added to the worker's limit for the engine's execution limit
WORKER_OVERHEAD_S = 300.0
#: jobs a submitter takes from the local queue at once (recorded in one transaction, then sent one by one)
_SEND_BATCH = 32

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


class Dispatcher:
    """The dispatch core of one orchestrator (see the module docstring)."""

    def __init__(self, engine: Engine, journal: Journal, options: DispatchOptions, *, wall_clock_s: float,
                 on_result: Callable[[str, dict[str, Any]], str] | None = None, show_progress: bool = True,
                 clock: Callable[[], float] = time.time, threads: bool = True) -> None:
        """``wall_clock_s``: the jobs' wall-clock bound (the worker's limit adds the evals' allowance);
        ``on_result(kind, output)``: checks a completed attempt's output and keeps what it carries (why it is
        not a result, or ""); ``clock``: the wall clock every deadline, heartbeat and journal time is read
        from; ``threads=False``: no submitter or poller thread is started, the caller drives them with
        :meth:`pump` (a simulated clock)."""
        self.engine, self.journal, self.options = engine, journal, options
        self.wall_clock_s = wall_clock_s
        self._on_result = on_result or (lambda kind, out: "")
        self.show_progress = show_progress
        self._clock = clock
        self._threads_on = threads
        self.closed = False
        #: jobs out at once: the option, else the engine's own limit (see DispatchOptions.max_in_flight)
        self.max_in_flight = options.max_in_flight or engine.workers_max
        # this orchestrator's session: the owner of every row it acts on (alive while it beats)
        self._session_id = f"{this_owner()}:{uuid.uuid4().hex[:8]}"
        self._owner = self._session_id
        now = self._clock()
        self._beat_at = now
        self._adopt_at = now + options.owner_stale_s / 2
        self.journal.open_session(engine.session(self._session_id, now))
        self._entries: dict[str, _Entry] = {}
        self._pending: deque[str] = deque()
        self._held: list[tuple[float, str]] = []   # (not before, key): sends that queued nothing, backing off
        self._out: set[str] = set()          # our keys holding a slot (sending, sent, cancelling)
        self._lock = threading.RLock()
        self._cv = threading.Condition(self._lock)   # submitters wait on it for a queued job and a slot
        self._claim_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None
        self._submitters: list[threading.Thread] = []
        self._cancelled: set[str] = set()
        self._attaching: list[tuple[_Entry, str]] = []   # sent, their id not journaled yet
        self._adopt()

    def _adopt(self) -> None:
        """Track every job the journal has in flight at start: a row whose owner is alive is followed, one
        whose owner closed or died is adopted (re-attached by id, never resent blind)."""
        rows = self.journal.in_flight()
        for row in rows:
            self._entries[row.key] = _Entry(key=row.key, kind=row.kind, claimant=row.claimant, make=None,
                                            episode_id=row.episode_id, job_id=row.job_id, attempt=row.attempt,
                                            first_attempt=row.first_attempt, state="foreign")
        if rows:
            self.say(f"re-attaching {len(rows)} job(s) in flight from the journal "
                      f"({sum(r.job_id is not None for r in rows)} with a Runpod id)")
            for row in rows:
                self._follow(self._entries[row.key])
            self._start_threads()

    def say(self, msg: str) -> None:
        """A progress line (logged; on stderr too when ``show_progress``): the backends' one voice for the fleet."""
        _log.info(msg)
        if self.show_progress:
            print(f"[{time.strftime('%H:%M:%S')}] {self.engine.name}: {msg}", file=sys.stderr, flush=True)

    def _start_threads(self) -> None:
        if not self._threads_on or self._stop.is_set():
            return
        if self._poller is not None and len(self._submitters) == self.options.submit_threads and \
                self._poller.is_alive():
            return   # the common case, without the lock (a submitter never exits before close)
        with self._lock:
            if self._poller is None or not self._poller.is_alive():
                self._poller = threading.Thread(target=self._poll_loop, name=f"{self.engine.name}-poller", daemon=True)
                self._poller.start()
            self._submitters = [t for t in self._submitters if t.is_alive()]
            while len(self._submitters) < self.options.submit_threads:
                t = threading.Thread(target=self._submit_loop, name=f"{self.engine.name}-submit-{len(self._submitters)}",
                                     daemon=True)
                t.start()
                self._submitters.append(t)

    # ------------------------------------------------------------------ limits, bounds and budgets
    def limits(self, kind: str = "job") -> Limits:
        """The time limits and bounds of one attempt of a ``kind`` request (see :class:`Limits`): the
        worker's limit is ``job_timeout_s``, else the bounds' wall clock plus the evals' allowance (a
        baseline: the allowance), as the GPU worker applies it."""
        cache: dict[str, Limits] = self.__dict__.setdefault("_limits", {})
        if kind not in cache:
            cache[kind] = self._make_limits(kind)
        return cache[kind]

    def _make_limits(self, kind: str) -> Limits:
        o = self.options
        worker = o.job_timeout_s or (EVAL_ALLOWANCE_S if kind == "baseline" else
                                     self.wall_clock_s + EVAL_ALLOWANCE_S)
        execution = o.execution_timeout_s or worker + WORKER_OVERHEAD_S
        deadline = o.deadline_s or o.startup_allowance_s + execution
        bound = deadline + o.ttl_margin_s
        rate = self.engine.bound_rate()
        return Limits(execution_s=execution, deadline_s=deadline, bound_s=bound,
                      job_usd=round(math.ceil(bound) * rate, 6),
                      idle_usd=round(self.engine.idle_timeout_s * rate, 6))

    def estimate_cost_usd(self, kind: str = "job") -> float:
        """A job's bound: what one attempt can bill at most (its hard end x the dearest rate x GPUs) plus
        the idle bound after it. A budget reserves it (the env's ledger, the journal)."""
        lim = self.limits(kind)
        return round(lim.job_usd + lim.idle_usd, 6)

    def wait_bound_s(self, kind: str = "job") -> float:
        """:meth:`wait`'s default limit: every attempt the retry budget allows at its bound, plus the status
        backoff and a minute (the option ``wait_timeout_s`` overrides it)."""
        o = self.options
        if o.wait_timeout_s is not None:
            return o.wait_timeout_s
        return (o.retry_budget + 1) * (self.limits(kind).bound_s + 2 * o.status_backoff_max_s) + 60.0

    def _bound_bill(self, entry: _Entry, until: float | None) -> Billing:
        """The upper bound of an attempt whose bill cannot be read, marked ``estimated``: from its send to
        ``until`` (when it surely ended: a confirmed cancel, a 404), or to its ttl when nothing says it ended,
        x the dearest rate x GPUs, plus the idle bound."""
        lim = self.limits(entry.kind)
        sent = entry.sent_at or self._clock()
        seconds = lim.bound_s if until is None else min(max(0.0, until - sent), lim.bound_s)
        seconds = math.ceil(seconds - 1e-9)
        rate = self.engine.bound_rate()
        gpu_type, gpus = self.engine.bound_gpus()
        return Billing(execution_time_ms=int(seconds * 1000), gpu_type=gpu_type,
                       gpus_per_worker=gpus, cost_usd=round(seconds * rate, 6),
                       idle_usd=lim.idle_usd, estimated=True)

    def _bill(self, entry: _Entry, st: RunpodJobStatus | None, worker: dict[str, Any] | None = None) -> Billing:
        """The bill of a final status, every final status's (COMPLETED included): the engine's bill of the
        reported times, unless they cannot be taken as given (:func:`fleet.billing.billing_problem`:
        missing for an attempt a worker took, malformed, negative, longer than its ttl): then the attempt's
        whole bound, marked estimated (never under what the provider can bill; reconciled later against its
        bill)."""
        if st is not None:
            why = billing_problem(st, self.limits(entry.kind).bound_s)
            if why:
                self.say(f"{entry.claimant}: {self.engine.name} job {entry.job_id}: {why}; charged at its bound, "
                         "estimated")
                return self._bound_bill(entry, None)
        return self.engine.bill(st, worker)

    def run_costs(self) -> RunCosts:
        """This run dir's costs so far: jobs (the agents' charges), idle (upper bound), active workers over
        the sessions' wall time (this one up to now while open), and their total, in USD; ``estimated``:
        what of it is charged at bounds; ``reserved``: the bounds of jobs in flight."""
        return self.journal.run_costs(live=self._live())

    def _live(self) -> frozenset[str]:
        return frozenset() if self.closed else frozenset({self._session_id})

    def _reserve(self, entry: _Entry) -> str:
        """Hold the current attempt's bound in the journal, or re-check the one it holds; why it may not be
        sent ("" when it may). Nothing is held when no budget is set."""
        o = self.options
        if o.run_budget_usd is None and o.episode_budget_usd is None:
            return ""
        lim = self.limits(entry.kind)
        why = self.journal.reserve(entry.key, entry.attempt, lim.job_usd, lim.idle_usd,
                                   run_limit=o.run_budget_usd,
                                   episode_limit=o.episode_budget_usd if entry.episode_id else None,
                                   live=self._live())
        if not why:
            return ""
        fix = ("Raise backend.options.run_budget_usd or start a new run dir" if why.startswith("run")
               else "Raise backend.options.episode_budget_usd")
        return (f"{why.replace(' budget:', ' budget exceeded:', 1)} (journal {self.journal.path}; a job "
                f"in flight holds its bound, ${lim.job_usd + lim.idle_usd:.4f}, until it ends). {fix}.")

    # ------------------------------------------------------------------ claims and waits
    def track(self, key: str, kind: str, claimant: str, episode_id: str | None,
               payload: Callable[[], dict[str, Any]] | None) -> _Entry:
        """Claim ``key`` (or join it) and track it: a new claim reserves its bound and is queued for a
        submitter. ``payload()`` builds what to send (called when it is sent; None: this caller cannot
        resend it)."""
        if self.closed:
            raise RuntimeError(f"the {self.engine.name} backend is closed; build a new one")
        # one claim per key and process at a time (two episodes, one identical job): claims queue on their
        # own lock, so the journal transaction never holds up the submitters and the poller
        with self._claim_lock:
            with self._lock:
                entry = self._entries.get(key)
                if entry is not None and entry.state != "done":
                    if entry.make is None:   # adopted after a restart: now it can be resent if needed
                        entry.make = payload
                    return entry
            row, new = self.journal.claim(key, claimant=claimant, kind=kind, episode_id=episode_id,
                                          owner=self._owner)
            entry = _Entry(key=key, kind=kind, claimant=claimant, make=payload, episode_id=episode_id,
                           job_id=row.job_id, attempt=row.attempt, first_attempt=row.first_attempt)
            if row.final and not new:
                entry.state, entry.make = "done", None
                entry.done.set()
                self.say(f"{claimant}: served from the journal (job {row.job_id}, "
                          f"{row.result_status or row.status})")
            elif not new:
                entry.state = "foreign"
                self.say(f"{claimant}: already in flight as {row.job_id or '(being sent)'}; attached")
            elif why := self._reserve(entry):
                self.journal.finish(key, None, "infra_failed", f"dispatch refused: {why}")
                entry.state = "done"
                entry.done.set()
                self.say(f"{claimant}: refused ({why})")
            with self._cv:
                there = self._entries.get(key)
                if there is not None and there.state != "done":   # the poller adopted the row meanwhile
                    return there
                self._entries[key] = entry
                if entry.state == "pending":
                    self._pending.append(key)
                    self._cv.notify()
        if entry.state == "foreign":
            self._follow(entry)
        if entry.state != "done":
            self._start_threads()
        return entry

    def wait(self, key: str, claimant: str, timeout: float | None = None) -> tuple[JournalRow, float | None]:
        """The row of ``key``'s job once it ended, and its charge when this caller is the one charged (else
        None: served, or charged before). ``timeout``: raise ``TimeoutError`` after that many seconds (the
        job keeps running); None: at most :meth:`wait_bound_s`, after which the job is ended here (cancelled,
        charged at its bound, ``infra_failed``): no waiter blocks forever."""
        with self._lock:
            entry = self._entries.get(key)
        if entry is None:  # a handle from another instance: follow the journal's row
            row = self.journal.get(key)
            if row is None:
                raise KeyError(f"job {claimant} ({key}) is not in the journal {self.journal.path}")
            entry = self.track(key, row.kind, claimant, row.episode_id, None)
        limit = timeout if timeout is not None else self.wait_bound_s(entry.kind)
        if not entry.done.wait(limit):
            if timeout is not None:
                raise TimeoutError(f"{self.engine.name} job {claimant} did not finish within {timeout} s (it "
                                   "keeps running; wait again, or a restarted orchestrator re-attaches it)")
            self._give_up(entry, f"no end within wait()'s bound of {limit:.0f} s (wait_bound_s: every "
                                 "attempt's ttl plus the status backoff)")
        row, charge = self.journal.collect(key, by=self._session_id)
        assert row is not None
        return row, charge

    def settle(self, key: str, kind: str, claimant: str, payload: Callable[[], dict[str, Any]]) -> JournalRow:
        """Track a request, wait for its end (at most :meth:`wait_bound_s`), take its charge, and return its
        row (a baseline measurement)."""
        entry = self.track(key, kind, claimant, None, payload)
        limit = self.wait_bound_s(kind)
        if not entry.done.wait(limit):
            self._give_up(entry, f"no end within the bound of {limit:.0f} s")
        row = self.journal.get(key)
        assert row is not None
        self.journal.take_charge(key, by=self._session_id)
        return row

    def _give_up(self, entry: _Entry, why: str) -> None:
        """End a job nothing else ended in time: cancel its attempt (best effort), charge the attempt at its
        bound, finish it ``infra_failed``."""
        row = self.journal.get(entry.key)
        if row is not None and not row.final:
            sent = self.journal.attempt_row(entry.key, row.attempt) or {}
            bill = None
            if row.job_id:
                self._cancel(row.job_id)
            if row.job_id or sent.get("sent_at") is not None:
                entry.sent_at = float(sent.get("sent_at") or row.submitted_at or entry.sent_at or 0.0)
                bill = self._bound_bill(entry, None)
            if self.journal.finish(entry.key, row.job_id, "infra_failed", why, bill):
                self.say(f"{entry.claimant}: infra_failed ({why})")
        self._done(entry)

    # ------------------------------------------------------------------ submitters
    def _submit_loop(self) -> None:
        while not self._stop.is_set():
            try:
                if not self._send_next(block=True):
                    continue
            except Exception:  # noqa: BLE001 - a submitter must outlive one bad send
                _log.exception("%s submitter failed; going on", self.engine.name)

    def _send_next(self, block: bool = False) -> bool:
        """Take the queued jobs free slots allow (up to :data:`_SEND_BATCH`) and send them; False when there
        was none."""
        with self._cv:
            while True:
                self._release_held()
                while self._pending and self._entries[self._pending[0]].state != "pending":
                    self._pending.popleft()
                if self._pending and len(self._out) < self.max_in_flight:
                    break
                if not block or self._stop.is_set():
                    return False
                self._cv.wait(1.0)
                if self._stop.is_set():
                    return False
            batch: list[_Entry] = []
            while self._pending and len(self._out) < self.max_in_flight and len(batch) < _SEND_BATCH:
                entry = self._entries[self._pending.popleft()]
                if entry.state != "pending":
                    continue
                entry.state = "sending"
                self._out.add(entry.key)
                batch.append(entry)
        self._send(batch)
        return True

    def _send(self, batch: list[_Entry]) -> None:
        """Send the entries' current attempts: re-check each one's budget, pack it if it is not yet, record
        them all (tag, time: one transaction), then run each; the ids go to the journal in one transaction
        too (:meth:`_attach_sent`, by this thread or the poller, whichever comes first)."""
        ready: list[_Entry] = []
        for entry in batch:
            why = self._reserve(entry)   # the budget, re-checked as the job leaves the local queue
            if why:
                self._end(entry, None, f"dispatch refused: {why}")
                continue
            try:
                if entry.body is None:
                    assert entry.make is not None
                    entry.body = entry.make()
            except (OSError, ValueError) as exc:   # e.g. a bundle over the /run payload limit
                self._end(entry, None, f"the job could not be packed for Runpod: {exc}")
                continue
            ready.append(entry)
        if not ready:
            return
        tags = [uuid.uuid4().hex for _ in ready]
        now = self._clock()
        # hard_end: the last moment the attempt can run (its ttl from a send as late as the client's retries
        # allow); a row with an attempt sent unseen is not claimed again before it
        sent = self.journal.mark_sending_many(
            [(e.key, e.attempt, tag, now + self.limits(e.kind).bound_s + self.engine.send_retry_s)
             for e, tag in zip(ready, tags)], owner=self._owner)
        for entry, tag, sent_at in zip(ready, tags, sent):
            if sent_at is None:
                self._to_foreign(entry)   # the row moved on meanwhile (adopted elsewhere, or final)
                continue
            entry.sent_at = sent_at
            self._run(entry, tag)
        self._attach_sent()

    def _run(self, entry: _Entry, tag: str) -> None:
        """Send the entry's attempt (recorded as sending, with ``tag``) and act on what the answer means."""
        assert entry.body is not None
        lim = self.limits(entry.kind)
        try:
            job_id = self.engine.send({**entry.body, "tag": tag}, lim)
        except SendUncertain as exc:
            # a send without an idempotency key, and no way to list the engine's jobs (Runpod's /run): a job
            # may be queued (and billed) unseen, and without its id it cannot be cancelled. It is charged at
            # its bound (its hard end caps its life) and not resent, which could run it twice.
            self._end(entry, None, f"the run call got no clear answer ({exc}); not resent, since a job may "
                                   f"have been queued unseen (tag {tag}): charged at its bound, estimated; the "
                                   f"same job is not sent again before "
                                   f"{_utc(entry.sent_at + lim.bound_s + self.engine.send_retry_s)}",
                      self._bound_bill(entry, None))
            return
        except SendRefused as exc:   # ours: bad key, payload too large, no endpoint
            self._end(entry, None, str(exc), Billing())
            return
        except SendFailed as exc:   # surely not queued: sent again after its Retry-After or a backoff
            self._send_failed(entry, exc)
            return
        with self._lock:
            self._attaching.append((entry, job_id))

    def _attach_sent(self) -> None:
        """Journal the ids of the attempts sent since the last call (one transaction) and start polling
        them. Submitters call it after their batch, the poller at every sweep, so a run call that hangs
        never holds up the ids of those sent before it."""
        with self._lock:
            items, self._attaching = self._attaching, []
        if not items:
            return
        done = self.journal.attach_many([(e.key, job_id, e.attempt) for e, job_id in items])
        now = self._clock()
        for (entry, job_id), attached in zip(items, done):
            if attached == DUPLICATE_ID:
                # the engine answered with an id another attempt already has: following it would score this
                # job with that one's result. Whether this attempt's job was queued is unknown (like a run
                # call without a clear answer, SendUncertain above): charged at its bound, estimated, not
                # resent, and the other job's id is never cancelled from here
                lim = self.limits(entry.kind)
                self._end(entry, None, f"{self.engine.name} answered the run call with the id {job_id}, which "
                                       "another attempt already has; this attempt is not followed (its job may "
                                       "have been queued unseen): charged at its bound, estimated; the same job "
                                       f"is not sent again before "
                                       f"{_utc(entry.sent_at + lim.bound_s + self.engine.send_retry_s)}",
                          self._bound_bill(entry, None))
                continue
            if attached != ATTACHED:
                self._cancel(job_id)   # the row moved on meanwhile (adopted and ended elsewhere): surplus
                self._to_foreign(entry)
                continue
            with self._lock:
                entry.job_id, entry.seen, entry.status_errors, entry.next_poll = job_id, "", 0, now
                if entry.state == "sending":
                    entry.state = "sent"
            self.say(f"{entry.claimant}: submitted as {job_id}"
                      + (f" (attempt {entry.attempt})" if entry.attempt > 1 else ""))

    def _cancel(self, job_id: str) -> bool:
        """Cancel an attempt; True when the engine answered (it is cancelled, or already gone)."""
        try:
            return self.engine.cancel(job_id)
        except Exception as exc:  # noqa: BLE001 - the caller retries
            _log.warning("could not cancel %s job %s: %s", self.engine.name, job_id, exc)
            return False

    # ------------------------------------------------------------------ the poller
    def pump(self) -> None:
        """One turn of the submitters and the poller, on the caller's thread (``threads=False``: a test
        or simulator drives the backend on its own clock)."""
        while self._send_next(block=False):
            pass
        self._sweep()

    def _poll_loop(self) -> None:
        """A sweep every ``poll_interval_s`` (never more often: a sweep goes over every job tracked), until
        :meth:`close` wakes it."""
        while not self._stop.is_set():
            try:
                self._sweep()
            except Exception:  # noqa: BLE001 - the poller must outlive one bad sweep
                _log.exception("%s poller sweep failed; retrying", self.engine.name)
            self._wake.wait(self.options.poll_interval_s)

    def _sweep(self) -> None:
        """Beat; adopt rows whose owner is gone; read the statuses that are due (backing off the unreadable
        ones); check every deadline; push every cancel that is due; follow rows others own."""
        o, now = self.options, self._clock()
        if now - self._beat_at >= o.owner_stale_s / 4:
            self._beat_at = now
            self.journal.beat(self._session_id)
        if now >= self._adopt_at:
            self._adopt_at = now + o.owner_stale_s / 2
            self._adopt_orphans()
        self._attach_sent()
        own: list[_Entry] = []
        foreign: list[_Entry] = []
        with self._lock:
            for e in self._entries.values():
                if e.state == "done":
                    continue
                if e.state == "foreign":
                    foreign.append(e)
                elif e.state in ("sent", "cancelling") and e.job_id:
                    own.append(e)
        due = [e for e in own if e.state == "sent" and e.next_poll <= now]
        answers = self._statuses([e.job_id for e in due if e.job_id])
        batch: list[tuple[_Entry, RunpodJobStatus, dict[str, Any], Billing]] = []
        for entry in due:
            if self._stop.is_set():
                break
            if entry.state == "sent" and entry.job_id in answers:
                self._poll(entry, answers[entry.job_id], batch)
        self._record(batch)
        now = self._clock()
        for entry in own:   # deadlines: on every sweep, whatever the status reads did
            if entry.state == "sent" and now >= entry.sent_at + self.limits(entry.kind).deadline_s:
                limit = self.limits(entry.kind).deadline_s
                seen = f" (status unreadable {entry.status_errors} time(s): {entry.last_error[:200]})" \
                    if entry.status_errors else ""
                self._begin_cancel(entry, "timed_out", f"no result from {entry.job_id} within its deadline of "
                                                       f"{limit:.0f} s{seen}")
            elif entry.state == "cancelling" and now >= entry.cancel_next:
                self._try_cancel(entry)
        for entry in foreign:
            self._follow(entry)

    def _statuses(self, ids: list[str]) -> dict[str, Any]:
        """The status of each id, or the error its read raised."""
        if not ids:
            return {}
        try:
            return dict(self.engine.statuses(ids))
        except Exception as exc:  # noqa: BLE001 - every id gets the error
            return {i: exc for i in ids}

    def _poll(self, entry: _Entry, answer: Any, batch: list[Any] | None = None) -> None:
        """Act on the status of ``entry``'s attempt (``answer``: a status or the error its read raised);
        results to record go to ``batch`` when given (:meth:`_record`)."""
        job_id, o, now = entry.job_id, self.options, self._clock()
        assert job_id is not None
        if isinstance(answer, AttemptGone):
            # the job is gone (its result expired, or its ttl ran out): it may have run up to now
            self._attempt_failed(entry, "expired", f"the result of {job_id} expired before it was read "
                                                   f"({answer}); charged at its bound, estimated",
                                 self._bound_bill(entry, now))
            return
        if isinstance(answer, Exception):
            entry.status_errors += 1
            entry.last_error = f"{type(answer).__name__}: {answer}"
            entry.next_poll = now + min(o.status_backoff_max_s, o.poll_interval_s * 2 ** entry.status_errors)
            if entry.status_errors in (1, 4) or entry.status_errors % 10 == 0:
                _log.warning("status of job %s unreadable (%d in a row; next read in %.1f s; its "
                             "deadline decides): %s", job_id, entry.status_errors, entry.next_poll - now,
                             entry.last_error[:300])
            return
        st = answer
        entry.status_errors, entry.next_poll = 0, now + o.poll_interval_s
        if st.status in IN_FLIGHT:
            if st.status != entry.seen:
                entry.seen = st.status
                self.journal.update_status(entry.key, IN_FLIGHT[st.status], job_id)  # type: ignore[arg-type]
                where = "in queue" if st.status == "IN_QUEUE" else "running"
                self.say(f"{entry.claimant}: {where} ({job_id}"
                          + (f" on worker {st.worker_id})" if st.worker_id else ")"))
            return
        self._final(entry, st, batch)

    def _final(self, entry: _Entry, st: RunpodJobStatus, batch: list[Any] | None = None) -> None:
        """Act on a final status of the current attempt."""
        job_id = entry.job_id
        if st.status == "COMPLETED":
            self._completed(entry, st, batch)
        elif st.status == "CANCELLED" and job_id in self._cancelled:
            self._end(entry, job_id, "cancelled by this orchestrator (close)", self._bill(entry, st), "cancelled")
        elif st.status in ("FAILED", "TIMED_OUT", "CANCELLED"):
            what = {"FAILED": "failed without a result from our handler (worker lost, image pull, out of "
                              "GPUs)",
                    "TIMED_OUT": f"timed out on {self.engine.name.capitalize()} (the request's execution "
                                 "timeout)",
                    "CANCELLED": f"was cancelled on {self.engine.name.capitalize()}'s side"}[st.status]
            detail = f": {str(st.error)[:300]}" if st.error else ""
            self._attempt_failed(entry, "timed_out" if st.status == "TIMED_OUT" else "failed",
                                 f"{self.engine.name.capitalize()} job {job_id} {what}{detail}",
                                 self._bill(entry, st))
        else:
            _log.warning("%s job %s has an unknown status %r; polling on", self.engine.name, job_id, st.status)

    def _begin_cancel(self, entry: _Entry, status: Literal["failed", "timed_out"], why: str) -> None:
        with self._lock:
            if entry.state != "sent":
                return
            entry.state, entry.cancel_status, entry.cancel_why = "cancelling", status, why
            entry.cancel_tries, entry.cancel_next = 0, self._clock()
        self._try_cancel(entry)

    def _try_cancel(self, entry: _Entry) -> None:
        """Cancel the attempt; once Runpod confirms (or its ttl passed: it cannot run any more), bill it and
        retry or end the job. Until then nothing is sent again; the cancel is retried with backoff."""
        job_id, o, now = entry.job_id, self.options, self._clock()
        assert job_id is not None
        confirmed = self._cancel(job_id)
        lim = self.limits(entry.kind)
        if not confirmed:
            entry.cancel_tries += 1
            if now < entry.sent_at + lim.bound_s:
                entry.cancel_next = now + min(o.status_backoff_max_s, o.poll_interval_s * 2 ** entry.cancel_tries)
                return
            why = f"{entry.cancel_why}; the cancel was not confirmed, but its ttl of {lim.bound_s:.0f} s has passed"
            self._attempt_failed(entry, entry.cancel_status, why + "; charged at its bound, estimated",
                                 self._bound_bill(entry, None))
            return
        st = self.engine.read(job_id)   # its final bill (or a result that came just before the cancel)
        if st is not None and st.status == "COMPLETED":
            self._completed(entry, st)
            return
        if st is None or st.status not in ("CANCELLED", "FAILED", "TIMED_OUT"):
            bill = self._bound_bill(entry, now)   # cancelled by now, its bill unread
            why = entry.cancel_why + "; cancelled, its bill unread: charged up to the cancel, estimated"
        else:
            bill, why = self._bill(entry, st), entry.cancel_why + "; cancelled"
        self._attempt_failed(entry, entry.cancel_status, why, bill)

    def _completed(self, entry: _Entry, st: RunpodJobStatus, batch: list[Any] | None = None) -> None:
        """A COMPLETED attempt: check its result and record it (into ``batch`` when given)."""
        job_id = entry.job_id
        out = st.output
        if not (isinstance(out, dict) and isinstance(out.get("result"), dict)):
            self._attempt_failed(entry, "failed", f"{self.engine.name.capitalize()} job {job_id} completed "
                                                  f"without our handler's result (output {str(out)[:200]!r})",
                                 self._bill(entry, st))
            return
        result = out["result"]
        if entry.kind == "job" and result.get("job_id") != entry.claimant:
            # another job's result under this attempt's id (an id the engine gave twice, one of them to a job
            # queued unseen): never served as this job's. Whether this attempt's own job was queued is unknown:
            # charged at its bound, estimated, not resent (see SendUncertain in _run)
            self._end(entry, job_id, f"{self.engine.name} job {job_id} answered with the result of job "
                                     f"{str(result.get('job_id'))[:80]!r}, not {entry.claimant!r} (an id given "
                                     "twice); not served, not resent: charged at its bound, estimated",
                      self._bound_bill(entry, None))
            self.journal.detach(entry.key, job_id)
            return
        worker = result.get("worker") if isinstance(result.get("worker"), dict) else {}
        bill = self._bill(entry, st, worker)
        problem = self._non_replica(worker)
        if problem:   # deterministic: the endpoint's workers run another image or versions than pinned
            self._end(entry, job_id, f"non-replica worker: {problem}. Not retried: every worker of this "
                                     "endpoint would answer the same; deploy the pinned image (Runpod: "
                                     "python -m fleet.endpoint up) or change require_revision/expected_versions", bill)
            return
        problem = self._on_result(entry.kind, out)
        if problem:
            self._attempt_failed(entry, "failed", problem, bill)
            return
        if batch is not None:
            batch.append((entry, st, out, bill))
        else:
            self._record([(entry, st, out, bill)])

    def _record(self, batch: list[tuple[_Entry, RunpodJobStatus, dict[str, Any], Billing]]) -> None:
        """Record the results of ``batch`` (one write transaction) and end their jobs."""
        if not batch:
            return
        done = self.journal.record_results([(e.key, e.job_id, out, bill, str(out["result"].get("status", "")))
                                            for e, _, out, bill in batch])
        for (entry, _, out, bill), recorded in zip(batch, done):
            if not recorded:   # another orchestrator recorded it, or moved the row on
                self._to_foreign(entry)
                continue
            billed_s = math.ceil((bill.delay_time_ms + bill.execution_time_ms) / 1000 - 1e-9)
            self.say(f"{entry.claimant}: done ({entry.job_id}: {out['result'].get('status')}, "
                      f"{bill.gpus_per_worker}x {bill.gpu_type}, {billed_s} s billed, ${bill.cost_usd:.4f}; "
                      f"idle <= ${bill.idle_usd:.4f} to the run)")
            self._done(entry)

    def _non_replica(self, worker: dict[str, Any]) -> str:
        """Why the worker that produced a result is not the pinned one ("" when it is)."""
        o, problems = self.options, []
        if o.require_revision and worker.get("image_revision") != o.require_revision:
            problems.append(f"image revision {worker.get('image_revision')!r}, pinned {o.require_revision!r}")
        versions = worker.get("versions") or {}
        problems += [f"{k} {versions.get(k) or 'missing'}, pinned {v}" for k, v in o.expected_versions.items()
                     if versions.get(k) != v]
        return "; ".join(problems)

    # ------------------------------------------------------------------ owners: follow and adopt
    def _follow(self, entry: _Entry) -> None:
        """An entry whose row another orchestrator owns: take its end from the journal; adopt the row when
        its owner closed, died or stopped polling."""
        row = self.journal.get(entry.key)
        if row is None:
            return
        if row.final:
            self._done(entry)
            return
        if row.owner == self._owner:
            self._own(entry, row)
            return
        if not self.journal.owner_live(row.owner, self.options.owner_stale_s):
            adopted = self.journal.adopt(entry.key, row.owner, self._owner)
            if adopted is not None:
                self.say(f"{entry.claimant}: adopted from {row.owner} (closed, gone or not polling)")
                self._own(entry, adopted)
            return
        entry.job_id, entry.attempt = row.job_id, row.attempt

    def _own(self, entry: _Entry, row: JournalRow) -> None:
        """Act on a row this orchestrator now owns, by where its current attempt is."""
        a = self.journal.attempt_row(entry.key, row.attempt) or {}
        with self._lock:
            entry.attempt, entry.first_attempt = row.attempt, row.first_attempt
            entry.sent_at = float(a.get("sent_at") or row.submitted_at or self._clock())
            if row.job_id is not None:                      # sent and recorded: poll it
                entry.job_id, entry.state, entry.next_poll = row.job_id, "sent", self._clock()
                entry.status_errors, entry.seen = 0, ""
                self._out.add(entry.key)
                return
            entry.job_id = None
        if a.get("sent_at") is not None:                    # sent, its id never recorded
            if self._found(entry, row.attempt, str(a.get("tag") or "")):
                return                                      # found again by its tag: followed from here
            until = a.get("hard_end") or entry.sent_at + self.limits(entry.kind).bound_s
            self._end(entry, None, f"attempt {row.attempt} was sent (tag {a.get('tag')}) but its {self.engine.name} id was "
                                   "never recorded (the orchestrator that sent it ended first, or the answer was "
                                   "lost): it may run unseen and cannot be cancelled without its id; charged at "
                                   f"its bound, estimated, and not sent again before {_utc(float(until))}",
                      self._bound_bill(entry, None))
        elif entry.make is not None:                        # claimed, never sent: send it
            with self._cv:
                entry.state = "pending"
                self._pending.append(entry.key)
                self._cv.notify()
            self._start_threads()
        else:
            self._end(entry, None, "the orchestrator that claimed this job ended before sending it, and this "
                                   "one has not got its bundle; submit the job again")

    def _found(self, entry: _Entry, attempt: int, tag: str) -> bool:
        """Look up an attempt whose id was never recorded by the tag it was sent with; journal and poll it
        when the engine lists it. Not found is not proof it never launched (a launch may still be queued at
        the engine), so the caller then charges it at its bound, as before."""
        if not tag:
            return False
        try:
            job_id = self.engine.find(tag)
        except Exception:  # noqa: BLE001 - an engine that cannot look finds nothing
            job_id = None
        if not job_id or self.journal.attach_many([(entry.key, job_id, attempt)])[0] != ATTACHED:
            return False
        with self._lock:
            entry.job_id, entry.state, entry.next_poll = job_id, "sent", self._clock()
            entry.status_errors, entry.seen = 0, ""
            self._out.add(entry.key)
        self.say(f"{entry.claimant}: attempt {attempt} (tag {tag}) was sent but its id never recorded; found on "
                 f"{self.engine.name} as {job_id}, followed from here")
        return True

    def _to_foreign(self, entry: _Entry) -> None:
        with self._lock:
            self._out.discard(entry.key)
            entry.state = "foreign"
        self._follow(entry)

    def _adopt_orphans(self) -> None:
        """Rows in flight whose owner is gone (closed, dead, not polling): this orchestrator adopts them."""
        live: dict[str, bool] = {}
        for row in self.journal.in_flight():
            if row.owner == self._owner:
                continue
            if row.owner not in live:
                live[row.owner] = self.journal.owner_live(row.owner, self.options.owner_stale_s)
            if live[row.owner]:
                continue
            with self._lock:
                entry = self._entries.get(row.key)
                if entry is None or entry.state == "done":
                    entry = _Entry(key=row.key, kind=row.kind, claimant=row.claimant, make=None,
                                   episode_id=row.episode_id, state="foreign")
                    self._entries[row.key] = entry
            if entry.state == "foreign":
                self._follow(entry)

    # ------------------------------------------------------------------ attempts end
    def _release_held(self) -> None:
        """Move the held sends whose wait is over back to the queue (the caller holds ``_cv``)."""
        if not self._held:
            return
        now = self._clock()
        due = [k for t, k in self._held if t <= now]
        if due:
            self._held = [(t, k) for t, k in self._held if t > now]
            self._pending.extend(due)

    def _send_failed(self, entry: _Entry, exc: SendFailed) -> None:
        """A send that surely queued nothing (a 429, a 503, no connection): nothing can bill, so it is not one
        of the job's retries; the job waits the provider's ``Retry-After`` (else a backoff from
        ``poll_interval_s`` doubling to ``status_backoff_max_s``) and is sent again, as long as that is within
        its send window (``startup_allowance_s`` from its first unsent attempt); past it, infra_failed."""
        o, now = self.options, self._clock()
        if entry.send_window_end is None:
            entry.send_window_end = now + o.startup_allowance_s
        backoff = min(o.status_backoff_max_s, o.poll_interval_s * 2 ** min(entry.unsent, 16))
        wait = exc.retry_after_s if exc.retry_after_s is not None else backoff
        if entry.make is None or now + wait > entry.send_window_end:
            why = (f"{exc}; not sent: waiting {wait:.0f} s more would pass the job's send window "
                   f"(startup_allowance_s={o.startup_allowance_s:g} s from its first refused send)"
                   if entry.make is not None else str(exc))
            self._attempt_failed(entry, "failed", why, Billing(), final=True)
            return
        self._next_attempt(entry, "failed", str(exc), Billing(), f"not sent ({exc}); sending again in {wait:.0f} s",
                           not_before=now + wait)

    def _attempt_failed(self, entry: _Entry, status: Literal["failed", "timed_out", "expired"], why: str,
                        bill: Billing | None = None, final: bool = False) -> None:
        """A Runpod-side failure of the current attempt (already over: cancelled, gone, or never queued):
        retry within the budget, else infra_failed."""
        budget, used = self.options.retry_budget, entry.attempt - entry.first_attempt + 1 - entry.unsent
        if final or used > budget or entry.make is None:
            tail = (f"; gave up after {used} attempt(s) (retry_budget={budget})" if entry.make
                    else "; not resent (this orchestrator re-attached it after a restart and has not got its "
                         "bundle)")
            self._end(entry, entry.job_id, why + tail, bill)
            return
        self._next_attempt(entry, status, why, bill, f"attempt {entry.attempt} lost ({why}); retrying")

    def _next_attempt(self, entry: _Entry, status: RowStatus, why: str, bill: Billing | None, said: str,
                      not_before: float | None = None) -> None:
        """Journal the current attempt's end and the next attempt, and queue it: at once, or (a send that
        queued nothing, :meth:`_send_failed`) held until ``not_before`` and not counted as a retry."""
        attempt = self.journal.next_attempt(entry.key, entry.job_id, status, why, bill, owner=self._owner)
        if attempt is None:  # another orchestrator moved it on
            self._to_foreign(entry)
            return
        self.say(f"{entry.claimant}: {said}")
        with self._cv:
            self._out.discard(entry.key)
            entry.job_id, entry.attempt, entry.state, entry.sent_at = None, attempt, "pending", 0.0
            if not_before is None:
                self._pending.append(entry.key)
            else:
                entry.unsent += 1
                self._held.append((not_before, entry.key))
            self._cv.notify()

    def _end(self, entry: _Entry, job_id: str | None, why: str, bill: Billing | None = None,
             status: Literal["infra_failed", "cancelled"] = "infra_failed") -> None:
        if self.journal.finish(entry.key, job_id, status, why, bill):
            self.say(f"{entry.claimant}: {status} ({why})")
            self._done(entry)
        else:
            self._to_foreign(entry)

    def _done(self, entry: _Entry) -> None:
        with self._cv:
            self._out.discard(entry.key)
            entry.state = "done"
            entry.make = entry.body = None
            self._cv.notify()
        entry.done.set()

    def close(self) -> None:
        """Stop the submitters and the poller and close this orchestrator's session: its jobs in flight keep
        running on the engine and any orchestrator on this run dir adopts them (a new one at start), unless
        ``cancel_on_close``. Idempotent."""
        if self.closed:
            return
        if self.options.cancel_on_close:
            with self._lock:
                live = [e for e in self._entries.values() if e.state in ("sent", "cancelling") and e.job_id]
            for e in live:
                assert e.job_id is not None
                self._cancelled.add(e.job_id)
                self._cancel(e.job_id)
                st = self.engine.read(e.job_id)
                bill = self._bill(e, st) if st is not None and st.status != "IN_PROGRESS" and \
                    st.status != "IN_QUEUE" else self._bound_bill(e, self._clock())
                self._end(e, e.job_id, "cancelled by this orchestrator (close)", bill, "cancelled")
        self._stop.set()
        with self._cv:
            self._cv.notify_all()
        self._wake.set()
        if self._poller is not None:
            self._poller.join(timeout=30)
        for t in self._submitters:   # one may be sleeping out a Retry-After: its send ends on its own, and
            t.join(timeout=10)       # its attach lands on a closed session's row, which others adopt
        self._attach_sent()
        with self._lock:   # wake every waiter: its job is no longer tracked here
            waiting = [e for e in self._entries.values() if not e.done.is_set()]
        for e in waiting:
            e.done.set()
        self.journal.close_session(self._session_id)
        self.closed = True
