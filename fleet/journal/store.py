"""The journal file: one SQLite connection per thread, write transactions under one lock per file in this process,
reads of rows; who owns a row (``host:pid``) and whether that owner still runs."""

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
from typing import TYPE_CHECKING, Any

from fleet.journal.records import _ADDED, _SCHEMA, JOURNAL_NAME, JournalRow

if TYPE_CHECKING:
    from fleet.journal.journal import Journal

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


class _Store:
    """The journal file: connections, transactions, reads (a part of :class:`fleet.journal.Journal`)."""

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

    def counts(self) -> dict[str, int]:
        return {r[0]: r[1] for r in self._db().execute("SELECT status, COUNT(*) FROM jobs GROUP BY status")}

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
