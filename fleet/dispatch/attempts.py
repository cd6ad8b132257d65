"""How an attempt ends: a send that queued nothing is held and sent again, a failed or expired attempt is
retried within the budgets or ends the job, and its waiter is woken."""

from __future__ import annotations

from typing import Literal

from fleet.journal import Billing, RowStatus
from fleet.dispatch.engine import SendFailed
from fleet.dispatch.state import _Entry, _State


class _Attempts(_State):
    """How attempts end: a part of :class:`fleet.dispatch.Dispatcher` (the module docstring says what it does)."""

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
