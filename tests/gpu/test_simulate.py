"""gpu/simulate.py invariants on small workloads, and gpu/bench_matrix.py's dry run."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from gpu import bench_matrix
from gpu.prices import PRICE_SHEET
from gpu.simulate import (PodPoolConfig, ServerlessConfig, SimClock, SimulatedServerless, Workload, draw_jobs,
                          pick, pod_factory, serverless_factory, simulate, sweep, write_defaults)

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
    for j in jobs:
        fleet.submit({"input": {"job_id": j.job_id, "exec_s": j.exec_s, "failed": j.failed}})
    clock.drain()
    assert sorted(fleet.requests) == sorted(j.job_id for j in jobs)
    assert all(r.runs == 1 and r.finished is not None for r in fleet.requests.values())
    states = {fleet.status(j.job_id)["status"] for j in jobs}
    assert states <= {"COMPLETED", "FAILED"}
    assert {fleet.status(j.job_id)["status"] for j in jobs if j.failed} <= {"FAILED"}
    with pytest.raises(ValueError, match="already"):
        fleet.submit({"input": {"job_id": jobs[0].job_id, "exec_s": 1.0}})


def test_status_shape() -> None:
    clock = SimClock()
    sls = SimulatedServerless(clock, ServerlessConfig(workers_max=1, flashboot=False, cold_start_s=10.0))
    a = sls.submit({"input": {"job_id": "a", "exec_s": 5.0}})
    b = sls.submit({"input": {"job_id": "b", "exec_s": 5.0}})
    assert sls.status(a)["status"] == "IN_QUEUE"
    clock.advance_to(12.0)
    assert sls.status(a)["status"] == "IN_PROGRESS" and sls.status(b)["status"] == "IN_QUEUE"
    clock.drain()
    st = sls.status(b)
    assert st == {"id": "b", "status": "COMPLETED", "delayTime": 15000, "executionTime": 5000}


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
    write_defaults(out, chosen, w, ["NVIDIA RTX A5000"], "python -m gpu.simulate")
    data = yaml.safe_load(out.read_text())
    assert data["workers_max"] == chosen.cfg.workers_max and data["gpu_priority"] == ["NVIDIA RTX A5000"]
    assert "python -m gpu.simulate" in out.read_text()


def test_committed_defaults_are_valid() -> None:
    text = (ROOT / "gpu" / "fleet_defaults.yaml").read_text()
    data = yaml.safe_load(text)
    assert "python -m gpu.simulate" in text
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
