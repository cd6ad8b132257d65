"""Owners: rows another live orchestrator owns are followed through the journal; rows whose owner closed or
died are adopted (re-attached by id, never resent blind)."""

from __future__ import annotations


from fleet.journal import ATTACHED, JournalRow
from fleet.dispatch.state import _Entry, _State, _utc


class _Owners(_State):
    """Following and adopting rows: a part of :class:`fleet.dispatch.Dispatcher` (the module docstring says what it does)."""

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
