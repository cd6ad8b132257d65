"""Costs: each attempt's bill, reservations and their corrections, the charges an episode takes once (and the
charges a killed session left torn), the orchestrator sessions whose active workers bill, and the run's costs."""

from __future__ import annotations

import socket
import sqlite3
from typing import Any


from fleet.journal.records import FINAL, Billing, JournalRow, PoolMeasure, RunCosts, Session
from fleet.journal.store import _Store, owner_alive


class _Costs(_Store):
    """Costs and sessions: a part of :class:`fleet.journal.Journal` (the module docstring says what it does)."""

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

    def run_costs(self, now: float | None = None, live: frozenset[str] = frozenset()) -> RunCosts:
        """Jobs, idle and active USD of this run dir (see :class:`RunCosts`; ``now``/``live``: as
        :meth:`active_periods`)."""
        periods = self.active_periods(now, live)
        jobs, idle = round(self.spent_usd(), 6), round(self.idle_usd(), 6)
        measure = self.pool_measure()
        controller = 0.0
        if measure is not None:   # SkyPilot's report of the pool replaces the per-job idle estimate
            idle, controller = round(measure.idle_usd, 6), round(measure.controller_usd, 6)
        active = round(sum((b - a) * r for a, b, r in periods), 6)
        wall = sum(b - a for a, b, _ in periods)
        estimated = float(self._db().execute("SELECT COALESCE(SUM(cost_usd + idle_usd), 0) FROM attempts "
                                             "WHERE estimated = 1").fetchone()[0])
        return RunCosts(jobs=jobs, idle=idle, active=active, controller=controller, measured=measure is not None,
                        total=round(jobs + idle + active + controller, 6), wall_s=round(wall, 3),
                        estimated=round(estimated, 6), reserved=round(self.reserved_usd(), 6))

    def record_pool_measure(self, measure: PoolMeasure) -> None:
        """Record SkyPilot's report of the pool's cost in this run's window (one record: a later reading, which
        sees more of the pool's tail, replaces an earlier one)."""
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO pool_measured (id, start, end, workers_usd, jobs_usd, idle_usd, "
                       "controller_usd, source, at) VALUES (1, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (measure.start, measure.end, measure.workers_usd, measure.jobs_usd, measure.idle_usd,
                        measure.controller_usd, measure.source, measure.at))

    def pool_measure(self) -> PoolMeasure | None:
        """The pool's cost in this run's window as last read from SkyPilot (:meth:`record_pool_measure`)."""
        r = self._db().execute("SELECT * FROM pool_measured WHERE id = 1").fetchone()
        return None if r is None else PoolMeasure.model_validate({k: r[k] for k in r.keys() if k != "id"})

    def take_run_charges(self, costs: RunCosts) -> dict[str, float]:
        """The part of ``costs.idle``, ``costs.active`` and ``costs.controller`` not handed out before
        (``{"idle": usd, "active": usd, "controller": usd}``), recorded as handed out: of callers in any
        process, each dollar goes to one (a cost ledger gets the run costs once). A part never goes down: a
        measured idle below the estimate already handed out leaves the ledger at the estimate (above the bill,
        never below it)."""
        with self._tx() as db:
            done = {r[0]: float(r[1]) for r in db.execute("SELECT part, usd FROM run_charged")}
            out = {}
            for part, now in (("idle", costs.idle), ("active", costs.active), ("controller", costs.controller)):
                out[part] = round(max(0.0, now - done.get(part, 0.0)), 6)
                db.execute("INSERT INTO run_charged (part, usd) VALUES (?, ?) ON CONFLICT(part) DO UPDATE "
                           "SET usd = MAX(usd, excluded.usd)", (part, now))
            return out

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
