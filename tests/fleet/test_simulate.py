"""fleet/simulate/ invariants on small workloads (the simulated server as the project's Runpod client; the
Serverless path through the real journal and billing, agreeing with the simulator's own accounting where
nothing but cold starts waits), and fleet/bench_matrix.py's dry run."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from fleet import bench_matrix
from fleet.prices import PRICE_SHEET
from fleet.runpod_api import RunpodJob
from fleet.simulate import (PodPoolConfig, ServerlessConfig, SimClock,
                          SimulatedServerless, Workload, draw_jobs, pick, pod_factory, run_through_journal,
                          serverless_factory, simulate, simulate_journal, sweep, write_defaults)

ROOT = Path(__file__).resolve().parents[2]
SMALL = Workload(steps=4, jobs_per_step=10, median_s=600.0, p90_s=900.0, gap_s=60.0)
FLEETS = {
    "pods": pod_factory(PodPoolConfig(max_pods=4, reap_s=120.0)),
    "serverless": serverless_factory(ServerlessConfig(workers_max=4, idle_timeout_s=30.0)),
    "serverless-nofb": serverless_factory(ServerlessConfig(workers_max=6, flashboot=False)),
}


@pytest.mark.parametrize("name", sorted(FLEETS))
def test_every_job_completes_exactly_once(name: str) -> None:
    clock = SimClock()
    fleet = FLEETS[name](clock, 0)
    jobs = [j for batch in draw_jobs(SMALL, 0) for j in batch]
    ids = [fleet.run({"job_id": j.job_id, "exec_s": j.exec_s, "failed": j.failed}) for j in jobs]
    clock.drain()
    assert sorted(fleet.requests) == sorted(ids) and len(set(ids)) == len(jobs)
    assert all(r.runs == 1 and r.finished is not None for r in fleet.requests.values())
    got = fleet.status_many(ids)
    assert {st.status for st in got.values()} == {"COMPLETED"}   # a failed job is the worker's verdict
    verdicts = {st.output["result"]["job_id"]: st.output["result"]["status"] for st in got.values()}
    assert verdicts == {j.job_id: "job_failed" if j.failed else "succeeded" for j in jobs}
    again = fleet.run({"job_id": jobs[0].job_id, "exec_s": 1.0})   # Runpod: a new job, a new id
    assert again not in ids


def test_status_shape() -> None:
    clock = SimClock()
    sls = SimulatedServerless(clock, ServerlessConfig(workers_max=1, flashboot=False, cold_start_s=10.0))
    a = sls.run({"job_id": "a", "exec_s": 5.0})
    b = sls.run({"job_id": "b", "exec_s": 5.0})
    assert isinstance(sls.status(a), RunpodJob) and sls.status(a).status == "IN_QUEUE"
    clock.advance_to(12.0)
    assert sls.status(a).status == "IN_PROGRESS" and sls.status(b).status == "IN_QUEUE"
    clock.drain()
    st = sls.status(b)
    assert (st.id, st.status, st.delay_time_ms, st.execution_time_ms, st.worker_id) == (b, "COMPLETED", 15000,
                                                                                        5000, "w0")
    assert st.output == {"result": {"job_id": "b", "status": "succeeded",
                                    "worker": {"gpus": ["NVIDIA RTX A5000"] * 2}}}
    assert RunpodJob.model_validate(st.model_dump(by_alias=True)) == st   # what /status/<id> would carry


def test_cancel_frees_the_worker() -> None:
    clock = SimClock()
    sls = SimulatedServerless(clock, ServerlessConfig(workers_max=1, flashboot=False, cold_start_s=10.0))
    a, b, c = (sls.run({"job_id": x, "exec_s": 100.0}) for x in "abc")
    sls.cancel(c)                                  # queued: never runs
    clock.advance_to(50.0)
    sls.cancel(a)                                  # running: stops now, b starts on the same worker
    assert [sls.status(i).status for i in (a, b, c)] == ["CANCELLED", "IN_PROGRESS", "CANCELLED"]
    clock.drain()
    assert sls.status(b).delay_time_ms == 50_000 and sls.requests[c].runs == 0
    assert sls.workers[0].busy_s == pytest.approx(40.0 + 100.0)


@pytest.mark.parametrize("name", sorted(FLEETS))
def test_realised_at_least_ideal(name: str) -> None:
    res = simulate(FLEETS[name], SMALL, [0, 1], name)
    assert res.jobs == 2 * SMALL.steps * SMALL.jobs_per_step
    assert res.realised_usd >= res.ideal_usd > 0
    assert 0 < res.utilisation <= 1


def test_no_overhead_means_realised_equals_ideal() -> None:
    cfg = ServerlessConfig(workers_max=SMALL.jobs_per_step, idle_timeout_s=0.0, flashboot=False,
                           cold_start_s=0.0, round_up=False)
    res = simulate(serverless_factory(cfg), SMALL, [0, 1, 2], "ideal")
    assert res.realised_usd == pytest.approx(res.ideal_usd, rel=1e-9)
    assert res.utilisation == pytest.approx(1.0)


def test_latency_monotone_in_workers_max() -> None:
    w = Workload(steps=3, jobs_per_step=12, median_s=100.0, p90_s=100.0, fail_frac=0.0, gap_s=10.0)
    p95 = []
    for wmax in (1, 2, 3, 4, 6, 12):
        cfg = ServerlessConfig(workers_max=wmax, flashboot=False, cold_start_s=5.0)
        p95.append(simulate(serverless_factory(cfg), w, [0], "x").p(0.95))
    assert all(a >= b for a, b in zip(p95, p95[1:])), p95
    assert p95[0] == pytest.approx(5 + 12 * 100) and p95[-1] == pytest.approx(5 + 100)


def test_deterministic_per_seed() -> None:
    cfg = ServerlessConfig(workers_max=4)
    one, two = (simulate(serverless_factory(cfg), SMALL, [7], "x") for _ in range(2))
    assert (one.realised_usd, one.step_wall_s, one.cold_starts) == (two.realised_usd, two.step_wall_s,
                                                                    two.cold_starts)
    other = simulate(serverless_factory(cfg), SMALL, [8], "x")
    assert other.step_wall_s != one.step_wall_s
    assert draw_jobs(SMALL, 3) == draw_jobs(SMALL, 3)


def test_job_length_distribution_matches_its_figures() -> None:
    w = Workload(steps=50, jobs_per_step=40, fail_frac=0.0)
    xs = sorted(j.exec_s for b in draw_jobs(w, 0) for j in b)
    assert xs[len(xs) // 2] == pytest.approx(w.median_s, rel=0.05)
    assert xs[int(0.9 * len(xs))] == pytest.approx(w.p90_s, rel=0.05)


def test_pick_and_defaults(tmp_path: Path) -> None:
    w = replace(SMALL, steps=2)
    rows = sweep(w, [0], ServerlessConfig(), PodPoolConfig())
    chosen = pick(rows, 1.2)
    best = min(r.result.p(0.95) for r in rows if r.fleet == "serverless")
    assert chosen.fleet == "serverless" and chosen.result.p(0.95) <= 1.2 * best
    ok = [r for r in rows if r.fleet == "serverless" and r.result.p(0.95) <= 1.2 * best]
    assert chosen.result.realised_usd == min(r.result.realised_usd for r in ok)
    out = tmp_path / "d.yaml"
    write_defaults(out, chosen, w, ["NVIDIA RTX A5000"], "python -m fleet.simulate")
    data = yaml.safe_load(out.read_text())
    assert data["workers_max"] == chosen.cfg.workers_max and data["gpu_priority"] == ["NVIDIA RTX A5000"]
    assert "python -m fleet.simulate" in out.read_text()


def test_committed_defaults_are_valid() -> None:
    text = (ROOT / "fleet" / "fleet_defaults.yaml").read_text()
    data = yaml.safe_load(text)
    assert "python -m fleet.simulate" in text
    assert 0 <= data["workers_min"] <= data["workers_max"] <= 16
    assert data["idle_timeout_s"] >= 0
    assert 1 <= len(data["gpu_priority"]) <= 3 and set(data["gpu_priority"]) <= set(PRICE_SHEET.gpus)


def test_bench_matrix_dry_run(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert bench_matrix.main(["--dry-run", "--out", str(tmp_path / "m")]) == 0
    out = capsys.readouterr().out
    assert "estimated from the seed's figures, not measured" in out
    for gpu in PRICE_SHEET.gpus:
        assert gpu in out
    assert "Qwen/Qwen3-0.6B" in out and "Qwen/Qwen3-1.7B" in out
    csv_lines = (tmp_path / "m.csv").read_text().splitlines()
    assert len(csv_lines) == 1 + 2 * len(PRICE_SHEET.gpus)


def test_bench_matrix_live_needs_key(capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RUNPOD_API_KEY", raising=False)
    assert bench_matrix.main([]) == 2
    err = capsys.readouterr().err
    assert "RUNPOD_API_KEY" in err and "--dry-run" in err


def test_bench_matrix_live_with_a_fake_backend() -> None:
    class Fake:
        def __init__(self, endpoint: str) -> None:
            self.polls = 0

        def submit(self, payload: dict) -> str:
            return payload["input"]["base_model"]

        def status(self, job_id: str) -> dict:
            self.polls += 1
            return {"status": "COMPLETED" if self.polls > 1 else "IN_PROGRESS", "executionTime": 600_000}

    cells = bench_matrix.run_live({"NVIDIA RTX A5000": "ep1"}, Fake, sleep=lambda s: None)
    assert [c.model for c in cells] == list(bench_matrix.MODELS)
    assert cells[0].minutes_per_job == pytest.approx(10.0)
    assert cells[0].basis.startswith("measured")


# ------------------------------------------------------------------ the Serverless path through the journal
def test_journal_run_completes_every_job_exactly_once_on_the_simulated_clock(tmp_path: Path) -> None:
    from fleet.billing import GpuPrices, attempt_billing
    from fleet.journal import Journal

    cfg = ServerlessConfig(workers_max=4, idle_timeout_s=30.0)
    clock = SimClock()
    fleet = SimulatedServerless(clock, cfg, 0)
    journal = Journal(tmp_path / "j.sqlite", now=lambda: clock.now)

    def bill(st, worker):  # type: ignore[no-untyped-def]
        return attempt_billing(st, worker, prices=GpuPrices(), gpu_type=cfg.gpu_type,
                               gpus_per_worker=cfg.gpus, idle_timeout_s=cfg.idle_timeout_s)

    steps = draw_jobs(SMALL, 0)
    walls = run_through_journal(fleet, clock, steps, SMALL.gap_s, journal, bill, poll_s=5.0, max_in_flight=3)
    rows = journal.rows()
    jobs = [j for b in steps for j in b]
    assert len(walls) == SMALL.steps and len(rows) == len(jobs) == len(fleet.requests)
    assert sorted(r.claimant for r in rows) == sorted(j.job_id for j in jobs)
    assert all(r.status == "completed" and r.attempt == 1 and r.job_id in fleet.requests for r in rows)
    failed = {j.job_id for j in jobs if j.failed}
    assert failed
    assert all(r.result_status == ("job_failed" if r.claimant in failed else "succeeded") for r in rows)
    assert all(0 <= r.created <= r.finished_at <= clock.now < 1e6 for r in rows)   # simulated, not wall, time
    assert all(r.finished_at % 5.0 == 0 for r in rows)                             # seen by a 5 s sweep
    for r in rows:
        st = fleet.status(r.job_id)
        assert r.cost_usd == bill(st, st.output["result"]["worker"]).cost_usd
        assert (r.delay_time_ms, r.execution_time_ms) == (st.delay_time_ms, st.execution_time_ms)


def test_simulate_journal_counts_each_job_once_and_explains_its_difference() -> None:
    res = simulate_journal(ServerlessConfig(workers_max=4, idle_timeout_s=30.0, workers_min=1), SMALL, [0, 1],
                           max_in_flight=16)   # more out than workers: the queue wait lands in delayTime
    n = 2 * SMALL.steps * SMALL.jobs_per_step
    assert res.rows == res.attempts == res.sim.jobs == n
    # Runpod's rule + queue wait in delayTime + the idle bound + jobs on active workers counted twice
    assert res.total_usd == pytest.approx(res.explained_usd, rel=1e-3)
    assert res.delay_excess_usd > 0 and res.active_jobs_usd > 0 and res.active_usd > 0
    assert res.total_usd > 1.05 * res.sim.realised_usd    # 16 in flight on 4 workers: the journal is high


@pytest.mark.parametrize("cfg, max_in_flight", [
    (ServerlessConfig(workers_max=4, idle_timeout_s=5.0), 4),                 # as many out as workers
    (ServerlessConfig(workers_max=4, idle_timeout_s=5.0, flashboot=False), 4),
    (ServerlessConfig(workers_max=SMALL.jobs_per_step, flashboot=False), None),  # never a queue
])
def test_journal_usd_per_job_agrees_with_the_simulator_within_1pct(cfg: ServerlessConfig,
                                                                    max_in_flight: int | None) -> None:
    """Where nothing waits at Runpod but for a cold start, the journal's run_costs() (jobs + idle + active)
    per job is the simulator's $/job (Runpod's billing rule) within 1 %."""
    res = simulate_journal(cfg, SMALL, [0, 1], max_in_flight=max_in_flight)
    assert res.rows == res.sim.jobs
    assert res.usd_per_job == pytest.approx(res.sim.usd_per_job, rel=0.01)


def test_same_defaults_as_the_backend() -> None:
    """Left to its default, the backend keeps no more jobs out than the endpoint has workers, as the
    simulator does."""
    from fleet.settings import RunpodOptions

    assert RunpodOptions.model_fields["max_in_flight"].default is None


def test_the_simulated_server_drives_the_real_backend(tmp_path: Path) -> None:
    """The simulated server is a ServerlessClientLike: the real RunpodBackend, its poller's sweep called by
    hand on the simulated clock, sends, polls, journals and bills a job through it."""
    from ait_env.backends.runpod import RunpodBackend
    from tests.backends.test_runpod_backend import settings

    clock = SimClock()
    sls = SimulatedServerless(clock, ServerlessConfig(workers_max=1, flashboot=False, cold_start_s=10.0))
    b = RunpodBackend(settings(require_revision=None, idle_timeout_s=5, workers_min=0), tmp_path / "runs",
                      show_progress=False, client=sls, clock=lambda: clock.now, threads=False)
    try:   # threads=False: the test is the submitters and the poller (pump), on the simulated clock
        entry = b.dispatch.track("k:0", "baseline", "sim-job", None, lambda: {"job_id": "sim-job", "exec_s": 30.0})
        b.pump()
        assert entry.job_id in sls.requests
        clock.drain()
        b.pump()
        row = b.journal.get("k:0")
        assert row is not None and row.status == "completed" and entry.done.is_set()
        assert (row.delay_time_ms, row.execution_time_ms) == (10_000, 30_000)
        st = sls.status(row.job_id)
        assert row.cost_usd == b.billing(st, st.output["result"]["worker"]).cost_usd > 0
    finally:
        b.close()


def test_the_skypilot_pool_scales_as_its_queue_length_autoscaler_does():
    """fleet.simulate's SkyPilot pool (sky/serve/autoscalers.py QueueLengthAutoscaler): from 0 workers the
    first decision (5 s) asks for one at once, then one more per upscale delay while jobs wait, never above
    max_workers; with nothing pending the idle workers go after the downscale delay; every job runs once."""
    from fleet.simulate import (SimClock, SimulatedSkyPilotPool, SkyPoolConfig, Workload, draw_jobs,
                                run_outer_loop)

    cfg = SkyPoolConfig(gpus=1, max_workers=4, upscale_delay_s=20, downscale_delay_s=300)
    clock = SimClock()
    pool = SimulatedSkyPilotPool(clock, cfg)
    w = Workload(steps=2, jobs_per_step=10, fail_frac=0.0)
    run_outer_loop(pool, clock, draw_jobs(w, 0), w.gap_s)
    pool.close()
    starts = sorted(x.started for x in pool.workers)
    assert len(pool.workers) >= 4 and starts[:4] == [5.0, 25.0, 45.0, 65.0]   # +1 per 20 s decision
    assert all(r.runs == 1 and r.finished is not None for r in pool.requests.values())
    assert max(sum(1 for x in pool.workers if x.started <= t < (x.stopped or 1e18))
               for t in starts) <= cfg.max_workers
    assert all(x.stopped is not None for x in pool.workers) and pool.ideal_usd() < pool.realised_usd()
