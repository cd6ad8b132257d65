"""The submitter threads: queued jobs recorded in one transaction, then sent one by one while fewer than
``max_in_flight`` are out; each sent attempt's id journaled."""

from __future__ import annotations

import uuid

from fleet.journal import ATTACHED, DUPLICATE_ID, Billing
from fleet.dispatch.engine import SendFailed, SendRefused, SendUncertain
from fleet.dispatch.state import _SEND_BATCH, _Entry, _State, _log, _utc


class _Sending(_State):
    """The submitters: a part of :class:`fleet.dispatch.Dispatcher` (the module docstring says what it does)."""

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
