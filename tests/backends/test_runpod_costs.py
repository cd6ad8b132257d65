"""Run costs of the runpod backend (tests/fakes/runpod_client.py, in process): each attempt a worker ran to
its end carries an idle charge (the endpoint's idle timeout x $/GPU-s x GPUs, an upper bound), active
workers are charged over the sessions' wall time, and jobs + idle + active add up to the journal's total;
the agent's charge (JobResult.cost_usd) stays the job's own bill; the run budget counts idle and active,
the episode budget does not; the settings come from the endpoint, else options, else
fleet/fleet_defaults.yaml; an older journal file gets the new columns; the env's cost ledger gets idle and
active once, and its total is jobs + idle + active."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from ait_env.backends.runpod import RunpodBackend
from fleet.journal import Journal, Session
from fleet import prices
from fleet.endpoint import fleet_settings
from fleet.runpod_api import RunpodAPIError
from tests.backends.test_runpod_backend import PER_JOB, bundles, settings
from tests.fakes.runpod_client import FakeServerlessClient

A5000_X2 = prices.FLEX_USD_PER_S["AMPERE_24"] * 2          # $/s of one 2-GPU A5000 worker (flex)
ACTIVE_X2 = prices.price_per_s("AMPERE_24", active=True) * 2   # ... active: the flex rate (one price)


def backend(tmp_path: Path, fake: FakeServerlessClient, management: Any = None,
            **options: Any) -> RunpodBackend:
    return RunpodBackend(settings(**options), tmp_path / "runs", show_progress=False, client=fake,
                         management=management)


class Endpoint:
    """A ManagementClient stand-in: ``get`` answers ``record`` (or raises ``error``)."""

    def __init__(self, record: dict[str, Any] | None = None, error: Exception | None = None) -> None:
        self.record, self.error, self.calls = record, error, 0

    def get(self, endpoint_id: str) -> dict[str, Any]:
        self.calls += 1
        if self.error is not None:
            raise self.error
        assert self.record is not None
        return {"id": endpoint_id, **self.record}


def test_idle_and_active_are_run_costs_that_add_up_and_never_the_agents_charge(tmp_path):
    fake = FakeServerlessClient()
    jobs = bundles(tmp_path, 3)
    with backend(tmp_path, fake, idle_timeout_s=7, workers_min=1) as b:
        assert (b.endpoint_costs.idle_timeout_s, b.endpoint_costs.workers_min) == (7, 1)
        results = [b.run(j) for j in jobs]
        open_costs = b.run_costs()
        time.sleep(0.3)
        assert b.run_costs().active > open_costs.active          # active workers accrue while it runs
        rows = [b.journal.get(b._key(j), history=True) for j in jobs]
    closed = b.run_costs()
    time.sleep(0.2)
    assert b.run_costs() == closed                                 # attributed when the run ended
    idle = round(7 * A5000_X2, 6)
    assert all(r.status == "succeeded" and r.cost_usd == pytest.approx(PER_JOB) for r in results)
    assert all(row.idle_usd == pytest.approx(idle) and row.cost_usd == pytest.approx(PER_JOB) for row in rows)
    assert [a["idle_usd"] for row in rows for a in row.history] == pytest.approx([idle] * 3)
    assert closed.jobs == pytest.approx(3 * PER_JOB) and closed.idle == pytest.approx(3 * idle)
    (session,) = b.journal.sessions()
    assert session.ended is not None and session.active_usd_per_s == pytest.approx(ACTIVE_X2)
    assert closed.active == pytest.approx((session.ended - session.started) * ACTIVE_X2, abs=1e-6)
    assert closed.total == pytest.approx(closed.jobs + closed.idle + closed.active, abs=1e-9)
    assert b.spent_usd() == pytest.approx(sum(r.cost_usd for r in results))   # the agents' charges only


def test_idle_is_charged_after_a_worker_ran_a_request_and_not_after_a_timeout(tmp_path):
    idle = round(5 * A5000_X2, 6)
    lost = FakeServerlessClient(plan=lambda inp, n: "lost" if n == 1 else "ok")  # FAILED: may live on
    timed = FakeServerlessClient(plan=lambda inp, n: "timed_out" if n == 1 else "ok")   # "the worker stops"
    (job,) = bundles(tmp_path, 1)
    for name, fake, want in (("lost", lost, [idle, idle]), ("timed", timed, [0.0, idle])):
        with backend(tmp_path / name, fake, idle_timeout_s=5) as b:
            r = b.run(job)
            row = b.journal.get(b._key(job), history=True)
            costs = b.run_costs()
        assert r.status == "succeeded" and r.cost_usd == pytest.approx(2 * PER_JOB), name
        assert [a["idle_usd"] for a in row.history] == pytest.approx(want), name
        assert costs.idle == pytest.approx(sum(want)) and costs.active == 0


def test_settings_come_from_the_endpoint_else_the_options_else_the_fleet_defaults(tmp_path):
    fake = FakeServerlessClient()
    ep = Endpoint({"workers": {"min": 2, "max": 4, "idleTimeout": 11},
                   "gpu": {"pools": ["ADA_24"], "count": 1}})
    with backend(tmp_path / "ep", fake, ep, endpoint_id="ep-1") as b:
        c = b.endpoint_costs
        assert b.max_in_flight == 4          # no more jobs out than workers: Runpod's queue wait is not billed
    assert ep.calls == 1
    assert (c.idle_timeout_s, c.workers_min, c.gpus_per_worker, c.pool) == (11, 2, 1, "ADA_24")
    assert c.active_usd_per_gpu_s == prices.price_per_s("ADA_24", active=True)
    assert "idle_timeout_s: endpoint ep-1" in c.source and "workers_min: endpoint ep-1" in c.source
    (s,) = b.journal.sessions()
    assert s.endpoint_id == "ep-1" and s.active_usd_per_s == pytest.approx(2 * 1 * c.active_usd_per_gpu_s)
    with backend(tmp_path / "opt", fake, ep, endpoint_id="ep-1", idle_timeout_s=3) as b:
        assert b.endpoint_costs.idle_timeout_s == 11                 # what Runpod bills by wins
    fleet = fleet_settings()                                       # the one place the defaults live
    down = Endpoint(error=RunpodAPIError("GET /serverless/ep-1: HTTP 503", 503))
    for mgmt in (None, down):
        with backend(tmp_path / f"d{bool(mgmt)}", fake, mgmt, endpoint_id="ep-1") as b:
            c = b.endpoint_costs
        assert (c.idle_timeout_s, c.workers_min) == (fleet["idle_timeout_s"], fleet["workers_min"])
        assert "fleet/fleet_defaults.yaml" in c.source and (c.pool, c.gpus_per_worker) == ("AMPERE_24", 2)
        assert b.max_in_flight == fleet["workers_max"]
        with backend(tmp_path / f"o{bool(mgmt)}", fake, mgmt, endpoint_id="ep-1", idle_timeout_s=3) as b:
            c3 = b.endpoint_costs
        assert c3.idle_timeout_s == 3 and "idle_timeout_s: options" in c3.source
    assert "HTTP 503" in c.source


def test_the_run_budget_counts_idle_and_active_and_the_episode_budget_does_not(tmp_path):
    jobs = bundles(tmp_path, 3)
    bound = {"execution_timeout_s": 60, "startup_allowance_s": 2, "ttl_margin_s": 0}   # = an instant job's bill
    idle = 600 * A5000_X2                                          # a long idle timeout: idle >> the job
    fake = FakeServerlessClient()
    with backend(tmp_path / "run", fake, idle_timeout_s=600, run_budget_usd=PER_JOB + idle + 0.05,
                 **bound) as b:
        assert b.estimate_cost_usd(jobs[0]) == pytest.approx(PER_JOB + idle)   # a job reserves its idle too
        first, second = b.run(jobs[0]), b.run(jobs[1])
    assert first.status == "succeeded" and second.status == "infra_failed" and fake.total_runs() == 1
    assert "run budget exceeded" in second.error and f"idle ${idle:.4f}" in second.error
    for j in jobs:
        j.manifest.episode_id = "ep-1"
    fake2 = FakeServerlessClient()
    with backend(tmp_path / "episode", fake2, idle_timeout_s=600, episode_budget_usd=2.5 * PER_JOB,
                 **bound) as b:                                     # idle counted, the 2nd would be refused
        done = [b.run(j) for j in jobs[:2]]
    assert [r.status for r in done] == ["succeeded", "succeeded"] and fake2.total_runs() == 2
    # active workers: an earlier session of this run dir kept 1000 s of them running at $0.001/s
    runs = tmp_path / "active" / "runs"
    now = time.time()
    Journal.in_run_dir(runs).open_session(Session(id="earlier", owner="elsewhere:1", started=now - 1000,
                                                  heartbeat=now, active_usd_per_s=0.001, workers_min=1))
    fake3 = FakeServerlessClient()
    with RunpodBackend(settings(idle_timeout_s=0, run_budget_usd=0.5, **bound), runs,
                       show_progress=False, client=fake3) as b:
        r = b.run(jobs[2])
        assert b.run_costs().active == pytest.approx(1.0, abs=0.01)
    assert r.status == "infra_failed" and "active workers $1.00" in r.error and fake3.total_runs() == 0


def test_overlapping_sessions_are_counted_once_and_a_dead_one_ends_at_its_heartbeat(tmp_path):
    j = Journal(tmp_path / "j.sqlite")
    j.open_session(Session(id="a", owner="h:1", started=0.0, heartbeat=0.0, active_usd_per_s=0.01))
    j.close_session("a", now=100.0)
    j.open_session(Session(id="b", owner="h:2", started=50.0, heartbeat=50.0, active_usd_per_s=0.02))
    j.close_session("b", now=150.0)
    j.open_session(Session(id="c", owner="h:3", started=200.0, heartbeat=260.0, active_usd_per_s=0.01))
    costs = j.run_costs(now=1000.0)                                # c died: it ends at its last beat
    assert costs.active == pytest.approx(50 * 0.01 + 100 * 0.02 + 60 * 0.01)
    assert costs.wall_s == pytest.approx(210.0)
    assert j.run_costs(now=1000.0, live=frozenset({"c"})).active == pytest.approx(2.5 + 800 * 0.01)


def test_an_older_journal_file_gets_the_new_columns(tmp_path):
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE jobs (key TEXT PRIMARY KEY, kind TEXT NOT NULL, claimant TEXT NOT NULL, episode_id TEXT,
            owner TEXT NOT NULL, job_id TEXT, status TEXT NOT NULL, attempt INTEGER NOT NULL DEFAULT 1,
            first_attempt INTEGER NOT NULL DEFAULT 1, result TEXT, result_status TEXT,
            error TEXT NOT NULL DEFAULT '', delay_time_ms INTEGER NOT NULL DEFAULT 0,
            execution_time_ms INTEGER NOT NULL DEFAULT 0, gpu_type TEXT NOT NULL DEFAULT '',
            gpus_per_worker INTEGER NOT NULL DEFAULT 0, cost_usd REAL NOT NULL DEFAULT 0,
            charged INTEGER NOT NULL DEFAULT 0, created REAL NOT NULL, updated REAL NOT NULL,
            submitted_at REAL, finished_at REAL);
        CREATE TABLE attempts (key TEXT NOT NULL, attempt INTEGER NOT NULL, job_id TEXT, status TEXT NOT NULL,
            error TEXT NOT NULL DEFAULT '', delay_time_ms INTEGER NOT NULL DEFAULT 0,
            execution_time_ms INTEGER NOT NULL DEFAULT 0, gpu_type TEXT NOT NULL DEFAULT '',
            gpus_per_worker INTEGER NOT NULL DEFAULT 0, cost_usd REAL NOT NULL DEFAULT 0,
            started REAL NOT NULL, ended REAL, PRIMARY KEY (key, attempt));
        INSERT INTO attempts (key, attempt, status, cost_usd, started, ended)
            VALUES ('k', 1, 'completed', 0.5, 1, 2);
    """)
    db.close()
    j = Journal(path)
    Journal(path)                                                  # a second open changes nothing
    costs = j.run_costs()
    assert (costs.jobs, costs.idle, costs.active, costs.total) == (0.5, 0.0, 0.0, 0.5)


def test_the_cost_ledger_gets_idle_and_active_once_and_its_total_is_the_sum_of_the_parts(tmp_path):
    from ait_env.observe.ledger import CostLedger, CostRecord

    ledger = CostLedger(tmp_path / "costs.jsonl")
    fake = FakeServerlessClient()
    jobs = bundles(tmp_path, 3)
    with backend(tmp_path, fake, idle_timeout_s=7, workers_min=1) as b:
        for j in jobs[:2]:                                         # what the env writes per job
            r = b.run(j)
            ledger.append(CostRecord(kind="gpu_job", usd=r.cost_usd, meta={"job_id": r.job_id}))
        b.charge_run_costs(ledger)                                 # mid-run: the ledger catches up
    b.charge_run_costs(ledger)                                     # at the end: the rest, once
    b.charge_run_costs(ledger)
    with backend(tmp_path, fake, idle_timeout_s=7, workers_min=1) as again:   # a second orchestrator
        r = again.run(jobs[2])
        ledger.append(CostRecord(kind="gpu_job", usd=r.cost_usd, meta={"job_id": r.job_id}))
    again.charge_run_costs(ledger)
    costs = again.run_costs()
    kinds = {k: sum(x.usd for x in ledger.records() if x.kind == k)
             for k in ("gpu_job", "gpu_idle", "gpu_active")}
    assert kinds["gpu_job"] == pytest.approx(costs.jobs) and kinds["gpu_idle"] == pytest.approx(costs.idle)
    assert kinds["gpu_active"] == pytest.approx(costs.active, abs=1e-5) and costs.active > 0
    assert ledger.spent() == pytest.approx(costs.total, abs=1e-5)
    assert all(x.episode_id is None for x in ledger.records() if x.kind != "gpu_job")   # never an agent's
