"""The job result cache: an identical job is never trained twice.

A job's **key** (:func:`job_key`) hashes what decides its result and nothing else: the job file and the
agent's files as they are bundled (not the job id, the env id or the generated package ``__init__``),
the family and its hidden set, the backend's name and settings (models, bounds, options such as the
seed), and the hash of the weights the job's base model would start from. Two bundles with the same
key train the same model from the same start on the same data with the same seed, so the second one's
result is the first one's.

:class:`JobCache` keeps results in one SQLite file (``<runs_dir>/job_cache.sqlite``), safe for threads
and processes. Only results that say something about the job are kept (``succeeded``, ``job_failed``);
an ``infra_failed`` result never is. Concurrent requests for one key are coalesced: the first trains,
the others wait for its result (so a run is reproducible from a warm cache). A result served from the
cache carries ``cache_hit = True`` and the job id it was measured under. Backends use it when their
settings ask for it (``BackendSettings.job_cache``); :attr:`JobCache.stats` counts hits and misses.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ait_env.jobs.bundle import JobBundle

#: bump when training or evaluation changes what the same job produces (old entries stop matching)
CACHE_VERSION = 2
_KEEP = ("succeeded", "job_failed")


def job_key(bundle: JobBundle, backend_settings: dict[str, Any], weights_hash: str, hidden_set_hash: str) -> str:
    """The content hash of a job (see the module docstring).

    The hashed text is one canonical JSON document: every entry of the package as a (path, kind, size,
    sha256) row, sorted, folders included (an empty folder is an importable namespace package), plus the
    job file's hash and every setting. Nothing is concatenated, so no two different jobs share a key
    by how their bytes are cut into files (a one-file job never collides with a two-file job whose
    bytes join up to the same stream)."""
    pkg = bundle.package_dir
    entries: list[list[Any]] = []
    for path in sorted(pkg.rglob("*")):
        rel = path.relative_to(pkg).as_posix()
        if "__pycache__" in path.parts or rel == "__init__.py":  # bytecode; generated (names the env id)
            continue
        if path.is_symlink():
            entries.append([rel, "link", 0, hashlib.sha256(str(path.readlink()).encode()).hexdigest()])
        elif path.is_dir():
            entries.append([rel, "dir", 0, ""])
        elif path.is_file():
            data = path.read_bytes()
            entries.append([rel, "file", len(data), hashlib.sha256(data).hexdigest()])
    doc = {"cache_version": CACHE_VERSION,
           "job_toml": hashlib.sha256((bundle.root / "job.toml").read_bytes()).hexdigest(),
           "package": entries, "family": bundle.manifest.family, "backend": backend_settings,
           "weights": weights_hash, "hidden_set": hidden_set_hash}
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class JobCache:
    """Results by job key in a SQLite file; see the module docstring."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._inflight: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        with self._connect() as db:
            db.execute("CREATE TABLE IF NOT EXISTS results (key TEXT PRIMARY KEY, backend TEXT, family TEXT, "
                       "job_id TEXT, status TEXT, result TEXT NOT NULL, created REAL)")

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=60)
        db.execute("PRAGMA journal_mode=WAL")
        return db

    @property
    def stats(self) -> dict[str, float]:
        total = self.hits + self.misses
        return {"hits": self.hits, "misses": self.misses, "hit_rate": self.hits / total if total else 0.0}

    def get(self, key: str) -> dict[str, Any] | None:
        with self._connect() as db:
            row = db.execute("SELECT result FROM results WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else None

    def put(self, key: str, result: dict[str, Any], family: str = "") -> bool:
        """Keep ``result`` (a JobResult as a dict) under ``key`` when its status is worth keeping."""
        if result.get("status") not in _KEEP:
            return False
        with self._connect() as db:
            db.execute("INSERT OR REPLACE INTO results VALUES (?, ?, ?, ?, ?, ?, ?)",
                       (key, result.get("backend", ""), family, result.get("job_id", ""), result["status"],
                        json.dumps(result), time.time()))
        return True

    def get_or_run(self, key: str, run: Callable[[], dict[str, Any]], family: str = "") -> tuple[dict[str, Any], bool]:
        """(the result for ``key``, whether it came from the cache): a stored one, or the one ``run`` makes
        (stored when worth keeping). A second caller of a key being run waits for the first."""
        while True:
            with self._lock:
                found = self.get(key)
                if found is not None:
                    self.hits += 1
                    return found, True
                event = self._inflight.get(key)
                if event is None:
                    self._inflight[key] = threading.Event()
                    self.misses += 1
                    break
            event.wait()  # the same job is training in another thread: take its result
        try:
            result = run()
            self.put(key, result, family)
            return result, False
        finally:
            with self._lock:
                self._inflight.pop(key).set()
