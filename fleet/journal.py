"""The durable job journal of a remote backend: what was sent where, what it cost, what came back.

One SQLite file per run directory (``<runs_dir>/runpod_journal.sqlite``), WAL mode, one connection per
call (safe across threads and processes). A row is one **key**: the job's content hash
(:func:`ait_env.jobs.cache.job_key`, the same key the job result cache uses) plus a nonce (``"0"``;
a deliberate re-run, ``rerun: true``, uses the bundle's job id), and records the remote job id of its
current attempt, its status, the result JSON (written the moment it is seen: Runpod keeps ``/run``
results 30 minutes only), the billed fields (queue/cold-start delay, execution time, GPU type, GPUs per
worker, USD) summed over every attempt, and timestamps. ``attempts`` holds one row per attempt.
``sessions`` holds one row per orchestrator that opened the run dir (:meth:`Journal.open_session`): when
it started and stopped, and what the endpoint's active (``workers_min``) workers cost per second meanwhile.

Contract:

- :meth:`Journal.claim` is atomic (``INSERT ... ON CONFLICT DO NOTHING``): of two orchestrators (threads
  or processes) claiming one key, exactly one gets ``new=True`` and submits; the other attaches to the
  row. A row whose outcome says nothing about the job (``infra_failed``, ``cancelled``, or a result whose
  own status is ``infra_failed``) is re-claimed by the next claim, again by exactly one caller, unless one
  of its attempts was sent without a remote id and may still run (before that attempt's ``hard_end``).
- :meth:`Journal.attach` records the remote id of the claimed attempt; :meth:`Journal.next_attempt`
  moves a row to a new attempt (a retry) for exactly one caller; :meth:`Journal.record_result` and
  :meth:`Journal.finish` write the final state once (later calls change nothing and return False).
- :meth:`Journal.take_charge` hands a row's cost to exactly one caller (the first to read it): a job is
  never paid for twice in the cost ledger. That cost is the job's own bill (``cost_usd``: delay +
  execution); the idle time Runpod bills after an attempt (``idle_usd``, an upper bound: see
  :mod:`ait_env.backends.runpod`) and the active workers of the sessions are **run** costs, never charged
  to a job: :meth:`Journal.run_costs` sums the three (``jobs + idle + active == total``), and
  :meth:`Journal.take_run_charges` hands the idle and active USD not handed out before to exactly one
  caller (``run_charged``: a cost ledger gets them once).
- **An attempt is recorded before it is sent** (:meth:`Journal.mark_sending`: a client-generated ``tag``,
  also put in the request's input, and ``sent_at``), so an attempt whose remote id never came back (a 5xx
  on a non-idempotent submit, a crash between the submit and :meth:`Journal.attach`) is still known: its
  owner (or whoever adopts it) charges it at its bound.
- **Every attempt that may have run is charged.** An attempt whose bill cannot be read is charged at its
  upper bound with ``Billing.estimated`` (column ``attempts.estimated``; :meth:`Journal.estimated_attempts`),
  and :meth:`Journal.correct_attempt` replaces the estimate when the bill is read later
  (``python -m fleet.reconcile --correct``).
- **Budgets reserve** (:meth:`Journal.reserve`): an attempt holds its bound (``reserved_usd`` + its idle
  bound ``reserved_idle_usd``) from when it is accepted until it ends, when its bill replaces it. A
  reservation is granted only while everything committed (the run costs plus every open reservation, or one
  episode's jobs plus its reservations) stays within the limit, inside one write transaction: of any
  number of orchestrators on the run dir, none can pass a budget but by the error of bounds already held.
- **Owners.** A row's ``owner`` is the orchestrator session that acts on it (:meth:`open_session`'s id).
  :meth:`Journal.owner_live` says whether that session is alive *and* polling (not closed, heartbeat newer
  than ``stale_s``, its process alive); a row whose owner is not is taken over by exactly one caller of
  :meth:`Journal.adopt`.
- Time: every timestamp (``created``, ``updated``, ``started``/``ended``, sessions, the ``now`` of
  :meth:`Journal.run_costs`) comes from the journal's clock, ``now`` (default ``time.time``; the fleet
  simulator, ``fleet/simulate/``, injects its simulated clock). An explicit ``now`` argument wins, 0.0
  included.
- Nothing secret is stored: keys, ids, statuses, the worker's (scrubbed) result and billing figures.

Subsumes, for backends that use it, the job result cache (:mod:`ait_env.jobs.cache`): the same key, and
a finished result is served to an identical job for free; but durable across a crash mid-job (the
remote job is re-attached by id) and shared by processes.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

RowStatus = Literal["submitted", "sending", "in_queue", "in_progress", "completed", "failed", "cancelled", "timed_out",
                    "expired", "infra_failed"]
#: statuses after which a row no longer changes unless re-claimed
FINAL: frozenset[str] = frozenset({"completed", "infra_failed", "cancelled"})
#: what :meth:`Journal.attach_many` did with an id
ATTACHED, MOVED_ON, DUPLICATE_ID = "attached", "moved_on", "duplicate_id"
JOURNAL_NAME = "runpod_journal.sqlite"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    key TEXT PRIMARY KEY, kind TEXT NOT NULL, claimant TEXT NOT NULL, episode_id TEXT, owner TEXT NOT NULL,
    job_id TEXT, status TEXT NOT NULL, attempt INTEGER NOT NULL DEFAULT 1,
    first_attempt INTEGER NOT NULL DEFAULT 1, result TEXT, result_status TEXT,
    error TEXT NOT NULL DEFAULT '', delay_time_ms INTEGER NOT NULL DEFAULT 0,
    execution_time_ms INTEGER NOT NULL DEFAULT 0, gpu_type TEXT NOT NULL DEFAULT '',
    gpus_per_worker INTEGER NOT NULL DEFAULT 0, cost_usd REAL NOT NULL DEFAULT 0,
    charged INTEGER NOT NULL DEFAULT 0,
    created REAL NOT NULL, updated REAL NOT NULL, submitted_at REAL, finished_at REAL);
CREATE TABLE IF NOT EXISTS attempts (
    key TEXT NOT NULL, attempt INTEGER NOT NULL, job_id TEXT, status TEXT NOT NULL,
    error TEXT NOT NULL DEFAULT '',
    delay_time_ms INTEGER NOT NULL DEFAULT 0, execution_time_ms INTEGER NOT NULL DEFAULT 0,
    gpu_type TEXT NOT NULL DEFAULT '', gpus_per_worker INTEGER NOT NULL DEFAULT 0,
    cost_usd REAL NOT NULL DEFAULT 0,
    started REAL NOT NULL, ended REAL, PRIMARY KEY (key, attempt));
CREATE INDEX IF NOT EXISTS jobs_status ON jobs (status);
CREATE INDEX IF NOT EXISTS attempts_job_id ON attempts (job_id);
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, endpoint_id TEXT NOT NULL DEFAULT '',
    started REAL NOT NULL, heartbeat REAL NOT NULL, ended REAL,
    workers_min INTEGER NOT NULL DEFAULT 0, gpus_per_worker INTEGER NOT NULL DEFAULT 0,
    pool TEXT NOT NULL DEFAULT '', active_usd_per_s REAL NOT NULL DEFAULT 0,
    idle_timeout_s REAL NOT NULL DEFAULT 0, source TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS run_charged (part TEXT PRIMARY KEY, usd REAL NOT NULL DEFAULT 0);
"""
#: columns added after the first release: (table, column, declaration); added to an older file on open
_ADDED = (("jobs", "idle_usd", "REAL NOT NULL DEFAULT 0"),
          ("attempts", "idle_usd", "REAL NOT NULL DEFAULT 0"),
          # issue 32: record before sending, reserve bounds, mark estimates
          ("jobs", "estimated_usd", "REAL NOT NULL DEFAULT 0"),
          ("attempts", "tag", "TEXT"),
          ("attempts", "sent_at", "REAL"),
          ("attempts", "estimated", "INTEGER NOT NULL DEFAULT 0"),
          ("attempts", "reserved_usd", "REAL NOT NULL DEFAULT 0"),
          # issue 47: who took a row's charge (a session id), so a charge torn from the ledger is found
          ("jobs", "charged_by", "TEXT NOT NULL DEFAULT ''"),
          ("attempts", "reserved_idle_usd", "REAL NOT NULL DEFAULT 0"),
          ("attempts", "hard_end", "REAL"))


class Billing(BaseModel):
    """What one attempt was billed: delay (queue and cold start) and execution, on which GPUs, in USD
    (``cost_usd``, the job's own bill); ``idle_usd``: the worker's idle time after it, a run cost.
    ``estimated``: the figures are the attempt's upper bound, not read from the remote (it could not be)."""

    delay_time_ms: int = 0
    execution_time_ms: int = 0
    gpu_type: str = ""
    gpus_per_worker: int = 0
    cost_usd: float = 0.0
    idle_usd: float = 0.0
    estimated: bool = False


class Session(BaseModel):
    """One orchestrator's time on the run dir, and what the endpoint's active workers cost meanwhile
    (``active_usd_per_s``: ``workers_min`` x GPUs per worker x the active $/GPU-s)."""

    id: str
    owner: str
    endpoint_id: str = ""
    started: float
    heartbeat: float
    ended: float | None = None
    workers_min: int = 0
    gpus_per_worker: int = 0
    pool: str = ""
    active_usd_per_s: float = 0.0
    idle_timeout_s: float = 0.0
    source: str = ""


class RunCosts(BaseModel):
    """What a run dir cost, in USD: ``jobs`` (every attempt's delay + execution: what the agent is
    charged), ``idle`` (workers idling after attempts, an upper bound), ``active`` (active workers over the
    sessions' wall time, overlapping sessions counted once); ``total`` is their sum. ``estimated``: the part
    of jobs + idle charged at attempts' bounds (unread bills); ``reserved``: the bounds open attempts hold
    (not spent, not in ``total``)."""

    jobs: float = 0.0
    idle: float = 0.0
    active: float = 0.0
    total: float = 0.0
    wall_s: float = 0.0
    estimated: float = 0.0
    reserved: float = 0.0


class JournalRow(BaseModel):
    key: str
    kind: str
    claimant: str                       # the bundle job id (or baseline name) that claimed the key
    episode_id: str | None = None
    owner: str                          # host:pid of the orchestrator that claimed it
    job_id: str | None = None           # the remote job id of the current attempt
    status: str
    attempt: int = 1
    first_attempt: int = 1              # the first attempt of the current claim (a re-claim starts anew)
    result: dict[str, Any] | None = None
    result_status: str | None = None
    error: str = ""
    delay_time_ms: int = 0
    execution_time_ms: int = 0
    gpu_type: str = ""
    gpus_per_worker: int = 0
    cost_usd: float = 0.0
    idle_usd: float = 0.0
    estimated_usd: float = 0.0          # the part of cost_usd charged at bounds (attempts not read)
    charged: bool = False
    charged_by: str = ""                # the session that took the charge (:meth:`Journal.collect`)
    created: float = 0.0
    updated: float = 0.0
    submitted_at: float | None = None
    finished_at: float | None = None
    history: list[dict[str, Any]] = Field(default_factory=list)

    @property
    def final(self) -> bool:
        return self.status in FINAL

    @property
    def reusable(self) -> bool:
        """A final row whose outcome says something about the job (served to identical jobs)."""
        return self.status == "completed" and self.result_status != "infra_failed"


_WRITER_LOCKS: dict[str, threading.Lock] = {}
_WRITER_LOCKS_GUARD = threading.Lock()


def _writer_lock(path: Path) -> threading.Lock:
    """This process's lock for writing the journal at ``path`` (one per file, shared by its instances)."""
    key = str(path.resolve())
    with _WRITER_LOCKS_GUARD:
        return _WRITER_LOCKS.setdefault(key, threading.Lock())


def this_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def owner_alive(owner: str) -> bool:
    """Whether the orchestrator ``owner`` (``host:pid``, optionally ``:<instance>``) still runs; another
    host's is assumed alive (its claims go stale by age instead)."""
    host, pid = (owner.split(":") + ["", ""])[:2]
    if host != socket.gethostname() or not pid.isdigit():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Journal:
    """The journal file at ``path`` (see the module docstring). ``now``: the clock every timestamp the
    journal writes or reads against comes from (wall time; the fleet simulator passes its simulated clock)."""

    def __init__(self, path: Path | str, now: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self._now = now
        self.now = now
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._wlock = _writer_lock(self.path)
        self._local = threading.local()
        db = self._db()
        db.executescript(_SCHEMA)
        for table, column, decl in _ADDED:   # an older journal: add the new columns (once, idempotent)
            if column not in {r[1] for r in db.execute(f"PRAGMA table_info({table})")}:
                try:
                    db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
                except sqlite3.OperationalError as exc:   # another process added it meanwhile
                    if "duplicate column" not in str(exc):
                        raise

    def _db(self) -> sqlite3.Connection:
        """This thread's connection (one per thread and process: sqlite3 connections are not shared)."""
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None or getattr(self._local, "pid", None) != os.getpid():
            db = sqlite3.connect(self.path, timeout=60, isolation_level=None, check_same_thread=True)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.row_factory = sqlite3.Row
            self._local.db, self._local.pid = db, os.getpid()
        return db

    def close(self) -> None:
        """Close this thread's connection (others close with their threads)."""
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None

    @classmethod
    def in_run_dir(cls, runs_dir: Path | str, now: Callable[[], float] = time.time) -> "Journal":
        return cls(Path(runs_dir) / JOURNAL_NAME, now)

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One connection and one write transaction (``BEGIN IMMEDIATE``: writers queue, never interleave).
        Writers of one process queue on a lock first (:func:`_writer_lock`): SQLite's busy handler makes a
        waiting writer sleep for milliseconds at a time, a lock hands over at once."""
        db = self._db()
        with self._wlock:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    @staticmethod
    def _state(db: sqlite3.Connection, key: str) -> sqlite3.Row | None:
        """The few columns the hot write paths decide on (no model built)."""
        return db.execute("SELECT status, attempt, job_id, owner, charged, cost_usd FROM jobs WHERE key = ?",
                          (key,)).fetchone()

    def _read(self, db: sqlite3.Connection, key: str, history: bool = False) -> JournalRow | None:
        row = db.execute("SELECT * FROM jobs WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        data = dict(row)
        data["result"] = json.loads(data["result"]) if data["result"] else None
        data["charged"] = bool(data["charged"])
        if history:
            data["history"] = [dict(r) for r in db.execute(
                "SELECT * FROM attempts WHERE key = ? ORDER BY attempt", (key,))]
        return JournalRow.model_validate(data)

    # ------------------------------------------------------------------ claims
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

    # ------------------------------------------------------------------ attempts and outcomes
    def _bill(self, db: sqlite3.Connection, key: str, attempt: int, status: str, billing: Billing | None,
              error: str = "") -> None:
        """End attempt ``attempt`` with its bill (its reservation is released: the bill replaces it)."""
        b = billing or Billing()
        db.execute("UPDATE attempts SET status = ?, error = ?, delay_time_ms = ?, execution_time_ms = ?, "
                   "gpu_type = ?, gpus_per_worker = ?, cost_usd = ?, idle_usd = ?, estimated = ?, "
                   "reserved_usd = 0, reserved_idle_usd = 0, ended = ? WHERE key = ? AND attempt = ?",
                   (status, error[:2000], b.delay_time_ms, b.execution_time_ms, b.gpu_type, b.gpus_per_worker,
                    b.cost_usd, b.idle_usd, int(b.estimated), self._now(), key, attempt))
        db.execute("UPDATE jobs SET delay_time_ms = delay_time_ms + ?, "
                   "execution_time_ms = execution_time_ms + ?, "
                   "gpu_type = CASE WHEN ? != '' THEN ? ELSE gpu_type END, "
                   "gpus_per_worker = CASE WHEN ? > 0 THEN ? ELSE gpus_per_worker END, "
                   "cost_usd = cost_usd + ?, idle_usd = idle_usd + ?, estimated_usd = estimated_usd + ? "
                   "WHERE key = ?",
                   (b.delay_time_ms, b.execution_time_ms, b.gpu_type, b.gpu_type, b.gpus_per_worker,
                    b.gpus_per_worker, b.cost_usd, b.idle_usd, b.cost_usd if b.estimated else 0.0, key))

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

    def collect(self, key: str, by: str = "") -> tuple[JournalRow | None, float | None]:
        """The row and, for the first caller once it is final, its cost (:meth:`take_charge`), in one
        transaction; ``by``: the caller's session, recorded so a charge it took but never wrote to the cost
        ledger (killed in between) is found (:meth:`torn_charges`)."""
        with self._tx() as db:
            row = self._read(db, key)
            if row is None or row.charged or not row.final:
                return row, None
            db.execute("UPDATE jobs SET charged = 1, charged_by = ? WHERE key = ?", (by, key))
            return row.model_copy(update={"charged": True, "charged_by": by}), row.cost_usd

    def take_charge(self, key: str, by: str = "") -> float | None:
        """The row's total cost for the first caller to ask (it goes to the cost ledger); None afterwards."""
        with self._tx() as db:
            row = self._state(db, key)
            if row is None or row["charged"] or row["status"] not in FINAL:
                return None
            db.execute("UPDATE jobs SET charged = 1, charged_by = ? WHERE key = ?", (by, key))
            return float(row["cost_usd"])

    def torn_charges(self, stale_s: float) -> list[JournalRow]:
        """Episode jobs whose charge was taken (:meth:`collect`) by a session that is over
        (:meth:`session_over`): the candidates of a charge that may never have reached the
        episode's cost ledger. The ledger decides (:meth:`ait_env.observe.ledger.CostLedger.recover_charge`:
        written only when no record of the job is there)."""
        rows = self._select("SELECT key FROM jobs WHERE charged = 1 AND charged_by != '' AND cost_usd > 0 "
                            "AND episode_id IS NOT NULL AND kind = 'job' ORDER BY finished_at")
        over: dict[str, bool] = {}
        out = []
        for r in rows:
            if r.charged_by not in over:
                over[r.charged_by] = self.session_over(r.charged_by, stale_s)
            if over[r.charged_by]:
                out.append(r)
        return out

    def session_over(self, session_id: str, stale_s: float) -> bool:
        """Whether a session can no longer act: closed, or its process gone (this host), or silent for
        ``stale_s`` (another host's, whose process cannot be looked at). A paused process on this host is
        not over."""
        r = self._db().execute("SELECT owner, heartbeat, ended FROM sessions WHERE id = ?", (session_id,)).fetchone()
        if r is None:
            return not owner_alive(session_id)
        if r["ended"] is not None:
            return True
        owner = str(r["owner"])
        if owner.split(":")[0] == socket.gethostname():
            return not owner_alive(owner)
        return self._now() - float(r["heartbeat"]) > stale_s

    def correct_attempt(self, key: str, attempt: int, billing: Billing) -> bool:
        """Replace the estimated bill of an ended attempt with one read later (``billing``, not estimated);
        the row's sums follow. False when the attempt is not an ended estimate."""
        with self._tx() as db:
            a = db.execute("SELECT * FROM attempts WHERE key = ? AND attempt = ? AND estimated = 1 AND "
                           "ended IS NOT NULL", (key, attempt)).fetchone()
            if a is None:
                return False
            b = billing
            db.execute("UPDATE attempts SET delay_time_ms = ?, execution_time_ms = ?, gpu_type = ?, "
                       "gpus_per_worker = ?, cost_usd = ?, idle_usd = ?, estimated = 0 WHERE key = ? AND "
                       "attempt = ?", (b.delay_time_ms, b.execution_time_ms, b.gpu_type or a["gpu_type"],
                                       b.gpus_per_worker or a["gpus_per_worker"], b.cost_usd, b.idle_usd, key,
                                       attempt))
            db.execute("UPDATE jobs SET delay_time_ms = delay_time_ms + ?, execution_time_ms = "
                       "execution_time_ms + ?, cost_usd = cost_usd + ?, idle_usd = idle_usd + ?, "
                       "estimated_usd = MAX(0, estimated_usd - ?) WHERE key = ? AND first_attempt <= ?",
                       (b.delay_time_ms - a["delay_time_ms"], b.execution_time_ms - a["execution_time_ms"],
                        b.cost_usd - a["cost_usd"], b.idle_usd - a["idle_usd"], a["cost_usd"], key, attempt))
            return True

    def estimated_attempts(self) -> list[dict[str, Any]]:
        """Ended attempts charged at their bound (``key, attempt, job_id, tag, sent_at, ended, cost_usd,
        idle_usd, gpu_type, gpus_per_worker``): what :meth:`correct_attempt` may correct."""
        return [dict(r) for r in self._db().execute(
            "SELECT key, attempt, job_id, tag, sent_at, ended, cost_usd, idle_usd, gpu_type, gpus_per_worker "
            "FROM attempts WHERE estimated = 1 AND ended IS NOT NULL ORDER BY ended")]

    # ------------------------------------------------------------------ budgets (reservations)
    def reserve(self, key: str, attempt: int, usd: float, idle_usd: float = 0.0, *,
                run_limit: float | None = None, episode_limit: float | None = None,
                live: frozenset[str] = frozenset()) -> str:
        """Make attempt ``attempt`` of ``key`` hold its bound (``usd`` for the job, ``idle_usd`` for the idle
        time after it) if everything committed stays within the limits; if it already holds one, re-check
        that everything committed still does. Returns "" when it may be sent, else why not (then it holds
        nothing new). Committed: the run's costs (jobs + idle + active, ``live`` as :meth:`run_costs`) plus
        every open attempt's bound, against ``run_limit``; the episode's jobs plus its open attempts' job
        bounds, against ``episode_limit``. One write transaction: atomic across orchestrators."""
        with self._tx() as db:
            a = db.execute("SELECT a.reserved_usd, a.reserved_idle_usd, a.ended, j.episode_id FROM attempts a "
                           "JOIN jobs j ON a.key = j.key WHERE a.key = ? AND a.attempt = ?",
                           (key, attempt)).fetchone()
            if a is None or a["ended"] is not None:
                return ""
            held = a["reserved_usd"] + a["reserved_idle_usd"] > 0
            new_job, new_idle = (0.0, 0.0) if held else (max(0.0, usd), max(0.0, idle_usd))
            if run_limit is not None:
                c = self.run_costs(live=live)
                committed = c.total + c.reserved
                if committed + new_job + new_idle > run_limit + 1e-9:
                    this = "" if held else f" + this job's bound ${new_job + new_idle:.4f}"
                    return (f"run budget: committed ${committed:.4f} (spent ${c.total:.4f}: jobs ${c.jobs:.4f}, "
                            f"idle ${c.idle:.4f}, active workers ${c.active:.4f}; bounds of jobs in flight "
                            f"${c.reserved:.4f}){this} > ${run_limit:.4f}")
            if episode_limit is not None and a["episode_id"] is not None:
                ep = a["episode_id"]
                spent = db.execute("SELECT COALESCE(SUM(a.cost_usd), 0), COALESCE(SUM(CASE WHEN a.ended IS "
                                   "NULL THEN a.reserved_usd ELSE 0 END), 0) FROM attempts a JOIN jobs j ON "
                                   "a.key = j.key WHERE j.episode_id = ?", (ep,)).fetchone()
                committed = float(spent[0]) + float(spent[1])
                if committed + new_job > episode_limit + 1e-9:
                    this = "" if held else f" + this job's bound ${new_job:.4f}"
                    return (f"episode budget: episode {ep} committed ${committed:.4f} (spent ${spent[0]:.4f}, "
                            f"bounds of its jobs in flight ${spent[1]:.4f}){this} > ${episode_limit:.4f}")
            if not held:
                db.execute("UPDATE attempts SET reserved_usd = ?, reserved_idle_usd = ? WHERE key = ? AND "
                           "attempt = ?", (new_job, new_idle, key, attempt))
            return ""

    def reserved_usd(self) -> float:
        """USD the open attempts hold (their bounds, jobs and idle)."""
        return float(self._db().execute("SELECT COALESCE(SUM(reserved_usd + reserved_idle_usd), 0) FROM "
                                        "attempts WHERE ended IS NULL").fetchone()[0])

    # ------------------------------------------------------------------ owners
    def owner_live(self, owner: str, stale_s: float) -> bool:
        """Whether ``owner`` (a session id, :meth:`open_session`) is alive and polling: its session is open,
        its heartbeat at most ``stale_s`` old and its process alive. An owner with no session (an older
        journal's ``host:pid``) is judged by its process alone (:func:`owner_alive`)."""
        r = self._db().execute("SELECT owner, heartbeat, ended FROM sessions WHERE id = ?", (owner,)).fetchone()
        if r is None:
            return owner_alive(owner)
        if r["ended"] is not None or self._now() - float(r["heartbeat"]) > stale_s:
            return False
        return owner_alive(str(r["owner"]))

    def adopt(self, key: str, dead_owner: str, owner: str) -> JournalRow | None:
        """Make ``owner`` the owner of a row still in flight whose owner was ``dead_owner``; the row for
        exactly one caller, None for the others (or when the row moved on)."""
        with self._tx() as db:
            cur = db.execute("UPDATE jobs SET owner = ?, updated = ? WHERE key = ? AND owner = ? AND status NOT "
                             "IN ('completed', 'infra_failed', 'cancelled')", (owner, self._now(), key, dead_owner))
            return self._read(db, key) if cur.rowcount == 1 else None

    # ------------------------------------------------------------------ reads
    def get(self, key: str, history: bool = False) -> JournalRow | None:
        return self._read(self._db(), key, history)

    def in_flight(self) -> list[JournalRow]:
        """Every row not yet final (after a restart: the jobs to re-attach by id)."""
        return self._select("SELECT key FROM jobs WHERE status NOT IN "
                            "('completed', 'infra_failed', 'cancelled')")

    def rows(self) -> list[JournalRow]:
        return self._select("SELECT key FROM jobs ORDER BY created")

    def _select(self, query: str, args: tuple[Any, ...] = ()) -> list[JournalRow]:
        db = self._db()
        keys = [r[0] for r in db.execute(query, args)]
        return [r for k in keys if (r := self._read(db, k)) is not None]

    def spent_usd(self, episode_id: str | None = None) -> float:
        """USD billed so far to jobs (every attempt's ``cost_usd``; not idle or active time), in all or for
        one episode's claims."""
        db = self._db()
        if episode_id is None:
            total = db.execute("SELECT COALESCE(SUM(cost_usd), 0) FROM attempts").fetchone()[0]
        else:
            total = db.execute("SELECT COALESCE(SUM(a.cost_usd), 0) FROM attempts a "
                               "JOIN jobs j ON a.key = j.key WHERE j.episode_id = ?",
                               (episode_id,)).fetchone()[0]
        return float(total)

    def idle_usd(self) -> float:
        """USD of idle time attributed to the attempts so far (an upper bound)."""
        return float(self._db().execute("SELECT COALESCE(SUM(idle_usd), 0) FROM attempts").fetchone()[0])

    def attempt_bills(self) -> list[dict[str, Any]]:
        """Every ended attempt's bill: ``key, attempt, job_id, status, ended, delay_time_ms,
        execution_time_ms, cost_usd, idle_usd, estimated`` (what ``python -m fleet.reconcile`` buckets by
        time)."""
        return [dict(r) for r in self._db().execute(
            "SELECT key, attempt, job_id, status, ended, delay_time_ms, execution_time_ms, cost_usd, "
            "idle_usd, estimated FROM attempts WHERE ended IS NOT NULL ORDER BY ended")]

    # ------------------------------------------------------------------ sessions (active workers)
    def open_session(self, session: Session) -> None:
        """Record an orchestrator's start on this run dir (its active-worker rate included)."""
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO sessions (id, owner, endpoint_id, started, heartbeat, ended, "
                       "workers_min, gpus_per_worker, pool, active_usd_per_s, idle_timeout_s, source) "
                       "VALUES (?, ?, ?, ?, ?, NULL, ?, ?, ?, ?, ?, ?)",
                       (session.id, session.owner, session.endpoint_id, session.started, session.heartbeat,
                        session.workers_min, session.gpus_per_worker, session.pool, session.active_usd_per_s,
                        session.idle_timeout_s, session.source))

    def beat(self, session_id: str, now: float | None = None) -> None:
        """A live session's heartbeat (a session that died without :meth:`close_session` ends there)."""
        with self._tx() as db:
            db.execute("UPDATE sessions SET heartbeat = ? WHERE id = ? AND ended IS NULL",
                       (now if now is not None else self._now(), session_id))

    def close_session(self, session_id: str, now: float | None = None) -> None:
        now = now if now is not None else self._now()
        with self._tx() as db:
            db.execute("UPDATE sessions SET ended = ?, heartbeat = ? WHERE id = ? AND ended IS NULL",
                       (now, now, session_id))

    def sessions(self) -> list[Session]:
        return [Session.model_validate(dict(r))
                for r in self._db().execute("SELECT * FROM sessions ORDER BY started")]

    def active_periods(self, now: float | None = None,
                       live: frozenset[str] = frozenset()) -> list[tuple[float, float, float]]:
        """``(start, end, usd_per_s)`` of the active workers, overlapping sessions counted once (at the
        highest rate among them). A session still open ends ``now`` if it is in ``live`` (this process's
        own), else at its last heartbeat (an orchestrator that died)."""
        now = now if now is not None else self._now()
        spans = [(s.started, s.ended if s.ended is not None else (now if s.id in live else s.heartbeat),
                  s.active_usd_per_s) for s in self.sessions()]
        edges = sorted({t for a, b, _ in spans for t in (a, b)})
        out: list[tuple[float, float, float]] = []
        for a, b in zip(edges, edges[1:]):
            covering = [r for s, e, r in spans if s <= a and e >= b and e > s]
            if covering:
                out.append((a, b, max(covering)))
        return out

    def run_costs(self, now: float | None = None, live: frozenset[str] = frozenset()) -> RunCosts:
        """Jobs, idle and active USD of this run dir (see :class:`RunCosts`; ``now``/``live``: as
        :meth:`active_periods`)."""
        periods = self.active_periods(now, live)
        jobs, idle = round(self.spent_usd(), 6), round(self.idle_usd(), 6)
        active = round(sum((b - a) * r for a, b, r in periods), 6)
        wall = sum(b - a for a, b, _ in periods)
        estimated = float(self._db().execute("SELECT COALESCE(SUM(cost_usd + idle_usd), 0) FROM attempts "
                                             "WHERE estimated = 1").fetchone()[0])
        return RunCosts(jobs=jobs, idle=idle, active=active, total=round(jobs + idle + active, 6),
                        wall_s=round(wall, 3), estimated=round(estimated, 6), reserved=round(self.reserved_usd(), 6))

    def take_run_charges(self, costs: RunCosts) -> dict[str, float]:
        """The part of ``costs.idle`` and ``costs.active`` not handed out before (``{"idle": usd, "active":
        usd}``), recorded as handed out: of callers in any process, each dollar goes to one (a cost ledger
        gets the run costs once)."""
        with self._tx() as db:
            done = {r[0]: float(r[1]) for r in db.execute("SELECT part, usd FROM run_charged")}
            out = {}
            for part, now in (("idle", costs.idle), ("active", costs.active)):
                out[part] = round(max(0.0, now - done.get(part, 0.0)), 6)
                db.execute("INSERT INTO run_charged (part, usd) VALUES (?, ?) ON CONFLICT(part) DO UPDATE "
                           "SET usd = MAX(usd, excluded.usd)", (part, now))
            return out

    def counts(self) -> dict[str, int]:
        return {r[0]: r[1] for r in self._db().execute("SELECT status, COUNT(*) FROM jobs GROUP BY status")}
