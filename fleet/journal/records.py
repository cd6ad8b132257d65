"""The journal's vocabulary and file: row statuses, the records it returns (:class:`JournalRow`, :class:`Billing`,
:class:`Session`, :class:`RunCosts`) and its SQLite schema (with the columns added since the first release)."""

from __future__ import annotations

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
CREATE TABLE IF NOT EXISTS pool_measured (
    id INTEGER PRIMARY KEY CHECK (id = 1), start REAL NOT NULL, end REAL NOT NULL, workers_usd REAL NOT NULL,
    jobs_usd REAL NOT NULL, idle_usd REAL NOT NULL, controller_usd REAL NOT NULL, source TEXT NOT NULL,
    at REAL NOT NULL);
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




class BillFields(BaseModel):
    """The billed figures an attempt and a job row share: delay (queue and cold start) and execution, on which
    GPUs, in USD (``cost_usd``, the job's own bill); ``idle_usd``: the worker's idle time after it, a run cost."""

    delay_time_ms: int = 0
    execution_time_ms: int = 0
    gpu_type: str = ""
    gpus_per_worker: int = 0
    cost_usd: float = 0.0
    idle_usd: float = 0.0


class Billing(BillFields):
    """What one attempt was billed (:class:`BillFields`). ``estimated``: the figures are the attempt's upper
    bound, not read from the remote (it could not be)."""

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


class PoolMeasure(BaseModel):
    """A SkyPilot pool's cost in one run dir's window, read from SkyPilot's cost report
    (``python -m fleet.reconcile_pool --correct``): the run's share of its workers' time up (busy and idle)
    and of the jobs controller's; ``idle_usd`` = workers - the run's jobs (never below 0) replaces the per-job
    idle estimate in :meth:`Journal.run_costs`."""

    start: float
    end: float
    workers_usd: float = Field(ge=0)
    jobs_usd: float = Field(ge=0)
    idle_usd: float = Field(ge=0)
    controller_usd: float = Field(ge=0)
    source: str
    at: float


class RunCosts(BaseModel):
    """What a run dir cost, in USD: ``jobs`` (every attempt's delay + execution: what the agent is
    charged), ``idle`` (workers idling after attempts: an upper bound, or measured from SkyPilot's report
    when ``measured``), ``active`` (active workers over the sessions' wall time, overlapping sessions counted
    once), ``controller`` (a SkyPilot pool's jobs controller, measured); ``total`` is their sum.
    ``estimated``: the part of jobs + idle charged at attempts' bounds (unread bills); ``reserved``: the
    bounds open attempts hold (not spent, not in ``total``)."""

    jobs: float = 0.0
    idle: float = 0.0
    active: float = 0.0
    controller: float = 0.0
    measured: bool = False
    total: float = 0.0
    wall_s: float = 0.0
    estimated: float = 0.0
    reserved: float = 0.0


class JournalRow(BillFields):
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
