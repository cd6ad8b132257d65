"""The dispatcher: one orchestrator's dispatch core (the contract: :mod:`fleet.dispatch`), its parts
mixed in from the modules beside this one."""

from __future__ import annotations

import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

from fleet.journal import Journal, JournalRow, this_owner
from fleet.settings import DispatchOptions

from fleet.dispatch.engine import Engine
from fleet.dispatch.state import _Entry, _log
from fleet.dispatch.attempts import _Attempts
from fleet.dispatch.budgets import _Budgets
from fleet.dispatch.owners import _Owners
from fleet.dispatch.polling import _Polling
from fleet.dispatch.sending import _Sending


class Dispatcher(_Budgets, _Sending, _Polling, _Owners, _Attempts):
    """The dispatch core of one orchestrator (see the package docstring)."""

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
