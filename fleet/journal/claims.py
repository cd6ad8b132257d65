"""Claims and attempts: a key claimed once, each attempt recorded before it is sent, its id attached, its status
updated, its result recorded; a row taken over or adopted from a dead owner."""

from __future__ import annotations

import json
import sqlite3
from typing import Any, Literal


from fleet.journal.records import ATTACHED, DUPLICATE_ID, FINAL, MOVED_ON, Billing, JournalRow, RowStatus
from fleet.journal.store import _Store, this_owner


class _Claims(_Store):
    """Claims and attempts: a part of :class:`fleet.journal.Journal` (the module docstring says what it does)."""

    def claim(self, key: str, *, claimant: str, kind: str = "job", episode_id: str | None = None,
              owner: str | None = None) -> tuple[JournalRow, bool]:
        """(the row for ``key``, whether this caller claimed it and must submit it). A new key, or a row
        whose outcome says nothing about the job (see the module docstring), is claimed by exactly one
        caller; otherwise the existing row is returned (attach to it, or serve its result)."""
        now, owner = self._now(), owner or this_owner()
        with self._tx() as db:
            cur = db.execute("INSERT INTO jobs (key, kind, claimant, episode_id, owner, status, created, "
                             "updated) VALUES (?, ?, ?, ?, ?, 'submitted', ?, ?) ON CONFLICT(key) DO NOTHING",
                             (key, kind, claimant, episode_id, owner, now, now))
            if cur.rowcount == 1:
                db.execute("INSERT INTO attempts (key, attempt, status, started) "
                           "VALUES (?, 1, 'submitted', ?)", (key, now))
                # the row just written, without reading it back (the hot path of every new job)
                return JournalRow.model_construct(
                    key=key, kind=kind, claimant=claimant, episode_id=episode_id, owner=owner, job_id=None,
                    status="submitted", attempt=1, first_attempt=1, result=None, result_status=None, error="",
                    delay_time_ms=0, execution_time_ms=0, gpu_type="", gpus_per_worker=0, cost_usd=0.0,
                    idle_usd=0.0, estimated_usd=0.0, charged=False, created=now, updated=now, submitted_at=None,
                    finished_at=None, history=[]), True
            row = self._read(db, key)
            assert row is not None
            if row.final and not row.reusable and not self._unseen_may_run(db, key, now):
                attempt = row.attempt + 1
                db.execute("UPDATE jobs SET claimant = ?, episode_id = ?, owner = ?, job_id = NULL, "
                           "status = 'submitted', attempt = ?, first_attempt = ?, result = NULL, "
                           "result_status = NULL, error = '', charged = 0, delay_time_ms = 0, "
                           "execution_time_ms = 0, cost_usd = 0, idle_usd = 0, estimated_usd = 0, updated = ?, "
                           "submitted_at = NULL, finished_at = NULL WHERE key = ?",
                           (claimant, episode_id, owner, attempt, attempt, now, key))
                db.execute("INSERT INTO attempts (key, attempt, status, started) "
                           "VALUES (?, ?, 'submitted', ?)", (key, attempt, now))
                row = self._read(db, key)
                assert row is not None
                return row, True
            return row, False

    @staticmethod
    def _unseen_may_run(db: sqlite3.Connection, key: str, now: float) -> bool:
        """Whether an attempt of ``key`` was sent, never identified (no remote id) and may still run: such a
        row is not claimed again before that attempt's ``hard_end`` (it cannot be cancelled without its id,
        and a second copy would run beside it)."""
        r = db.execute("SELECT MAX(hard_end) FROM attempts WHERE key = ? AND sent_at IS NOT NULL AND job_id IS "
                       "NULL AND estimated = 1", (key,)).fetchone()
        return r[0] is not None and float(r[0]) > now

    def take_over(self, key: str, attempt: int, dead_owner: str, owner: str | None = None) -> bool:
        """Take a claimed, never attached attempt of an orchestrator that died (``dead_owner``) before it
        submitted; True for exactly one caller, who then submits it."""
        with self._tx() as db:
            cur = db.execute("UPDATE jobs SET owner = ?, updated = ? WHERE key = ? AND attempt = ? "
                             "AND owner = ? AND job_id IS NULL AND status = 'submitted'",
                             (owner or this_owner(), self._now(), key, attempt, dead_owner))
            return cur.rowcount == 1

    def attach(self, key: str, job_id: str, attempt: int | None = None) -> bool:
        """Record the remote id of the row's current attempt (``attempt``: only if it is still current); never
        an id another attempt already has (:meth:`attach_many`)."""
        return self.attach_many([(key, job_id, attempt)])[0] == ATTACHED

    def attach_many(self, items: list[tuple[str, str, int | None]]) -> list[str]:
        """:meth:`attach` of each ``(key, job_id, attempt)``, in one write transaction; per item
        :data:`ATTACHED`, :data:`MOVED_ON` (the row is final, gone, or on another attempt) or
        :data:`DUPLICATE_ID` (another attempt, of this job or another, already has that id: a provider that
        answers a used id must not make one job's result another's)."""
        now, out = self._now(), []
        with self._tx() as db:
            for key, job_id, attempt in items:
                row = self._state(db, key)
                if row is None or row["status"] in FINAL or (attempt is not None and row["attempt"] != attempt):
                    out.append(MOVED_ON)
                    continue
                if db.execute("SELECT 1 FROM attempts WHERE job_id = ? AND NOT (key = ? AND attempt = ?) LIMIT 1",
                              (job_id, key, row["attempt"])).fetchone() is not None:
                    out.append(DUPLICATE_ID)
                    continue
                db.execute("UPDATE jobs SET job_id = ?, updated = ?, submitted_at = ? WHERE key = ?",
                           (job_id, now, now, key))
                db.execute("UPDATE attempts SET job_id = ? WHERE key = ? AND attempt = ?",
                           (job_id, key, row["attempt"]))
                out.append(ATTACHED)
        return out

    def detach(self, key: str, job_id: str) -> None:
        """Forget that ``key``'s attempts ran as ``job_id`` (an id that turned out to be another job's: its bill
        and result are that job's, never this one's; the attempt stays charged as it was)."""
        with self._tx() as db:
            db.execute("UPDATE attempts SET job_id = NULL WHERE key = ? AND job_id = ?", (key, job_id))
            db.execute("UPDATE jobs SET job_id = NULL WHERE key = ? AND job_id = ?", (key, job_id))

    def mark_sending(self, key: str, attempt: int, tag: str, owner: str | None = None,
                     hard_end: float | None = None) -> float | None:
        """Record, before the submit, that attempt ``attempt`` of ``key`` is about to be sent with the
        client-generated ``tag`` (also in the request's input) at the journal's now, which it returns
        (``sent_at``); ``hard_end``: when it surely cannot run any more (its ttl). None (send nothing) when the
        attempt is no longer current, already sent, the row final, or owned by another than ``owner``."""
        return self.mark_sending_many([(key, attempt, tag, hard_end)], owner)[0]

    def mark_sending_many(self, items: list[tuple[str, int, str, float | None]], owner: str | None = None
                          ) -> list[float | None]:
        """:meth:`mark_sending` of each ``(key, attempt, tag, hard_end)``, in one write transaction."""
        now, out = self._now(), []
        with self._tx() as db:
            for key, attempt, tag, hard_end in items:
                row = self._state(db, key)
                if row is None or row["status"] in FINAL or row["attempt"] != attempt or \
                        row["job_id"] is not None or (owner is not None and row["owner"] != owner):
                    out.append(None)
                    continue
                cur = db.execute("UPDATE attempts SET tag = ?, sent_at = ?, hard_end = ?, status = 'sending' "
                                 "WHERE key = ? AND attempt = ? AND sent_at IS NULL AND ended IS NULL",
                                 (tag, now, hard_end, key, attempt))
                if cur.rowcount != 1:
                    out.append(None)
                    continue
                db.execute("UPDATE jobs SET status = 'sending', updated = ? WHERE key = ?", (now, key))
                out.append(now)
        return out

    def unseen_before(self, key: str, attempt: int, since: float, until: float) -> bool:
        """Whether an attempt other than ``key``'s ``attempt`` was sent between ``since`` and ``until`` and
        its id never recorded (queued unseen, its sender died before writing the id, or detached as another
        job's), short of one that surely queued nothing (ended unbilled): an id the provider gives twice may
        be that one's, so a status without our tag cannot be taken as ``key``'s."""
        r = self._db().execute(
            "SELECT 1 FROM attempts WHERE sent_at IS NOT NULL AND job_id IS NULL AND sent_at >= ? AND "
            "sent_at <= ? AND NOT (key = ? AND attempt = ?) AND NOT (ended IS NOT NULL AND estimated = 0 AND "
            "cost_usd = 0) LIMIT 1", (since, until, key, attempt)).fetchone()
        return r is not None

    def attempt_row(self, key: str, attempt: int) -> dict[str, Any] | None:
        """One attempt's row (``tag``, ``sent_at``, ``job_id``, ``reserved_usd``, ``estimated``, ...)."""
        r = self._db().execute("SELECT * FROM attempts WHERE key = ? AND attempt = ?", (key, attempt)).fetchone()
        return dict(r) if r is not None else None

    def attempts(self) -> list[dict[str, Any]]:
        """Every attempt of every row, in the order they were opened."""
        return [dict(r) for r in self._db().execute("SELECT * FROM attempts ORDER BY started, key, attempt")]

    def update_status(self, key: str, status: RowStatus, job_id: str | None = None) -> bool:
        """Set the status of a row still in flight (of the attempt with ``job_id`` when given)."""
        if status in FINAL:
            raise ValueError(f"{status!r} is final: use record_result or finish")
        with self._tx() as db:
            q = "UPDATE jobs SET status = ?, updated = ? WHERE key = ? AND status NOT IN ('completed', " \
                "'infra_failed', 'cancelled')"
            args: tuple[Any, ...] = (status, self._now(), key)
            if job_id is not None:
                q, args = q + " AND job_id = ?", args + (job_id,)
            if db.execute(q, args).rowcount != 1:
                return False
            db.execute("UPDATE attempts SET status = ? WHERE key = ? AND job_id IS ?", (status, key, job_id))
            return True

    def next_attempt(self, key: str, job_id: str | None, status: RowStatus, error: str,
                     billing: Billing | None = None, owner: str | None = None) -> int | None:
        """End the attempt ``job_id`` (``status``: failed, timed_out, expired, ...; its bill) and open the
        next one; returns the new attempt number for exactly one caller (None: another caller already did,
        or the row is final). The caller then submits it and :meth:`attach` es its id."""
        now = self._now()
        with self._tx() as db:
            row = self._read(db, key)
            if row is None or row.final or row.job_id != job_id:
                return None
            self._bill(db, key, row.attempt, status, billing, error)
            attempt = row.attempt + 1
            db.execute("UPDATE jobs SET job_id = NULL, status = 'submitted', attempt = ?, error = ?, "
                       "owner = ?, updated = ?, submitted_at = NULL WHERE key = ?",
                       (attempt, error[:2000], owner or this_owner(), now, key))
            db.execute("INSERT INTO attempts (key, attempt, status, started) VALUES (?, ?, 'submitted', ?)",
                       (key, attempt, now))
            return attempt

    def record_result(self, key: str, job_id: str | None, result: dict[str, Any],
                      billing: Billing | None = None, result_status: str | None = None) -> bool:
        """Store the result of attempt ``job_id`` and close the row as ``completed``; True for the one call
        that recorded it (a second sighting changes nothing)."""
        return self.record_results([(key, job_id, result, billing, result_status)])[0]

    def record_results(self, items: list[tuple[str, str | None, dict[str, Any], Billing | None, str | None]]
                       ) -> list[bool]:
        """:meth:`record_result` of each ``(key, job_id, result, billing, result_status)``, in one write
        transaction (a poller's sweep records what it saw together)."""
        now, out = self._now(), []
        with self._tx() as db:
            for key, job_id, result, billing, result_status in items:
                row = self._state(db, key)
                if row is None or row["status"] in FINAL or row["job_id"] != job_id:
                    out.append(False)
                    continue
                self._bill(db, key, row["attempt"], "completed", billing)
                db.execute("UPDATE jobs SET status = 'completed', result = ?, result_status = ?, error = '', "
                           "updated = ?, finished_at = ? WHERE key = ?",
                           (json.dumps(result), result_status or str(result.get("status", "")), now, now, key))
                out.append(True)
        return out

    def finish(self, key: str, job_id: str | None, status: Literal["infra_failed", "cancelled"], error: str,
               billing: Billing | None = None) -> bool:
        """Close the row without a result (retries spent, budget refused, cancelled); once."""
        now = self._now()
        with self._tx() as db:
            row = self._read(db, key)
            if row is None or row.final or (job_id is not None and row.job_id != job_id):
                return False
            self._bill(db, key, row.attempt, status, billing, error)
            db.execute("UPDATE jobs SET status = ?, error = ?, updated = ?, finished_at = ? WHERE key = ?",
                       (status, error[:2000], now, now, key))
            return True

    def adopt(self, key: str, dead_owner: str, owner: str) -> JournalRow | None:
        """Make ``owner`` the owner of a row still in flight whose owner was ``dead_owner``; the row for
        exactly one caller, None for the others (or when the row moved on)."""
        with self._tx() as db:
            cur = db.execute("UPDATE jobs SET owner = ?, updated = ? WHERE key = ? AND owner = ? AND status NOT "
                             "IN ('completed', 'infra_failed', 'cancelled')", (owner, self._now(), key, dead_owner))
            return self._read(db, key) if cur.rowcount == 1 else None
