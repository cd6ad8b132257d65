"""The runpod backend against a fake Serverless endpoint (tests/fakes/runpod_client.py): jobs complete
exactly once with the worker's results and bills; identical jobs are served from the journal; an
orchestrator SIGKILLed mid-batch is replaced by one that re-attaches and pays nothing twice; Runpod-side
failures (a lost worker, an expired result, 429/5xx, a non-replica worker) are retried within a budget and
then infra_failed; budgets stop dispatch; baselines go through the same handler; one real job runs
through the real handler."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from task_families import reference_files
from ait_env.backends import BackendOptionsError, make_backend
from ait_env.jobs.settings import BackendSettings
from ait_env.jobs.result import JobResult
from ait_env.backends.runpod import RunpodBackend
from ait_env.config import load_group
from ait_env.jobs.bundle import JobBundle
from fleet.journal import Billing, Journal
from tests.helpers import make_bundle
from tests.fakes.runpod_client import (DELAY_MS, EXECUTION_MS, FakeServerlessClient, bundle_job_id,
                                      instant_output)

ROOT = Path(__file__).resolve().parents[2]
A5000 = 0.00019
#: one instant job's bill: (delay + execution) seconds x $/GPU-s of an A5000 x 2 GPUs
PER_JOB = round((DELAY_MS + EXECUTION_MS) / 1000 * A5000 * 2, 6)


def settings(**options: Any) -> BackendSettings:
    base = load_group("backend", "runpod")
    opts = {**base["options"], "poll_interval_s": 0.01, "require_revision": "rev-1", **options}
    return BackendSettings.model_validate({**base, "options": opts})


def bundles(folder: Path, n: int, start: int = 0) -> list[JobBundle]:
    """``n`` different jobs (the reference job, one comment apart)."""
    files = reference_files("arithmetic", "Qwen/Qwen3-0.6B")
    out = []
    for i in range(start, start + n):
        d = folder / f"b{i}"
        d.mkdir(parents=True)
        out.append(make_bundle({**files, "job.toml": files["job.toml"] + f"\n# variant {i}\n"}, d))
    return out


def backend(tmp_path: Path, fake: FakeServerlessClient, **options: Any) -> RunpodBackend:
    return RunpodBackend(settings(**options), tmp_path / "runs", show_progress=False, client=fake)


def run_all(b: RunpodBackend, jobs: list[JobBundle], timeout: float = 60) -> list[JobResult]:
    handles = [b.submit(j) for j in jobs]
    return [b.wait(h, timeout=timeout) for h in handles]


# ---------------------------------------------------------------------------------------------- options
def test_options_are_typed_and_a_missing_key_says_what_to_set(tmp_path, monkeypatch):
    monkeypatch.delenv("RUNPOD_API_KEY", raising=False)
    monkeypatch.delenv("RUNPOD_ENDPOINT_ID", raising=False)
    with pytest.raises(BackendOptionsError,
                       match=r"pool_size: unknown option\. Allowed options: .*endpoint_id"):
        make_backend(settings(pool_size=16), tmp_path)
    with pytest.raises(ValueError, match="RUNPOD_API_KEY and an endpoint id"):
        make_backend(settings(), tmp_path)
    monkeypatch.setenv("RUNPOD_API_KEY", "rp-secret-key-123")
    monkeypatch.setenv("RUNPOD_ENDPOINT_ID", "ep123")
    with make_backend(settings(read_endpoint=False), tmp_path) as b:   # the real client, never called here
        assert type(b.client).__name__ == "ServerlessClient"
    journal = (tmp_path / "runpod_journal.sqlite").read_bytes()
    assert b"rp-secret-key-123" not in journal


# -------------------------------------------------------------------------------------------- the happy path
def test_jobs_complete_exactly_once_with_the_workers_results_and_bills(tmp_path, capsys):
    fake = FakeServerlessClient(polls_to_finish=3)
    jobs = bundles(tmp_path, 6)
    twin = bundles(tmp_path / "twin", 1)[0]   # the same job as jobs[0], another bundle (another episode)
    results: dict[str, JobResult] = {}
    with backend(tmp_path, fake, max_in_flight=4) as b:
        b.show_progress = True
        threads = [threading.Thread(target=lambda j=j: results.__setitem__(j.job_id, b.run(j)))
                   for j in [*jobs, twin]]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        spent = b.spent_usd()
    assert fake.total_runs() == 6 and all(fake.runs_of(j.job_id) <= 1 for j in jobs)
    assert fake.runs_of(jobs[0].job_id) + fake.runs_of(twin.job_id) == 1   # the twin was not sent again
    for j in jobs:
        r = results[j.job_id]
        ids = (j.job_id, twin.job_id) if j is jobs[0] else (j.job_id,)
        sent = next(s["input"] for s in fake.store.all() if bundle_job_id(s["input"]) in ids)
        want = instant_output(sent, "ok", "rev-1")["result"]
        assert r.status == "succeeded" and r.post_score == want["post_score"] and r.worker == want["worker"]
    pair = [results[jobs[0].job_id], results[twin.job_id]]
    assert sorted(r.cost_usd for r in pair) == [0.0, PER_JOB] and sum(r.cache_hit for r in pair) == 1
    assert sum(r.cost_usd for r in results.values()) == pytest.approx(spent) == pytest.approx(6 * PER_JOB)
    err = capsys.readouterr().err
    for word in ("submitted as", "in queue", "running", "done ("):
        assert word in err


def test_a_finished_job_is_served_from_the_journal_and_rerun_trains_it_again(tmp_path):
    fake = FakeServerlessClient()
    (job,) = bundles(tmp_path, 1)
    with backend(tmp_path, fake) as b:
        first = b.run(job)
    again = bundles(tmp_path / "again", 1)[0]   # identical content, a new bundle and job id
    with backend(tmp_path, fake) as b:          # a new orchestrator on the same run dir
        served = b.run(again)
    assert fake.total_runs() == 1
    assert served.cache_hit and served.cost_usd == 0 and served.cached_from == job.job_id
    assert served.post_score == first.post_score and served.job_id == again.job_id
    with backend(tmp_path, fake, rerun=True) as b:
        rerun = b.run(again)
    assert fake.total_runs() == 2 and not rerun.cache_hit and rerun.cost_usd == pytest.approx(PER_JOB)


# ---------------------------------------------------------------------------------------------- restarts
CHILD = """
import sys, time
from pathlib import Path
from ait_env.jobs.settings import BackendSettings
from ait_env.backends.runpod import RunpodBackend
from ait_env.jobs.bundle import JobBundle
from fleet.journal import Billing, Journal
from tests.fakes.runpod_client import FakeServerlessClient

settings = BackendSettings.model_validate_json(Path(sys.argv[1]).read_text())
fake = FakeServerlessClient(Path(sys.argv[2]), polls_to_finish=10**9)  # nothing ends while this one lives
b = RunpodBackend(settings, sys.argv[3], show_progress=False, client=fake)
handles = [b.submit(JobBundle.load(Path(p))) for p in sys.argv[4:]]
while len(b.journal.in_flight()) < len(handles) or any(r.job_id is None for r in b.journal.in_flight()):
    time.sleep(0.05)
print("sent", flush=True)
time.sleep(600)
"""


def test_an_orchestrator_killed_mid_batch_is_reattached_and_nothing_is_paid_twice(tmp_path):
    jobs = bundles(tmp_path, 5)
    state, runs = tmp_path / "runpod_state.sqlite", tmp_path / "runs"
    cfg = tmp_path / "settings.json"
    cfg.write_text(settings().model_dump_json())
    FakeServerlessClient(state)   # create the shared state before two processes open it
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(cfg), str(state), str(runs),
                              *[str(j.root) for j in jobs]], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "sent"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    fake = FakeServerlessClient(state, polls_to_finish=2)
    assert fake.total_runs() == 5
    assert len(Journal.in_run_dir(runs).in_flight()) == 5
    with RunpodBackend(settings(), runs, show_progress=False, client=fake) as b:
        results = run_all(b, [JobBundle.load(j.root) for j in jobs])
        spent = b.spent_usd()
        again = run_all(b, [JobBundle.load(j.root) for j in jobs])
    assert fake.total_runs() == 5                       # never sent again
    assert all(r.status == "succeeded" and r.cost_usd == pytest.approx(PER_JOB) for r in results)
    assert all(r.cache_hit and r.cost_usd == 0 for r in again)
    assert spent == pytest.approx(5 * PER_JOB)


# ---------------------------------------------------------------------------------------------- failures
def test_a_lost_worker_is_retried_and_then_infra_failed(tmp_path):
    once = FakeServerlessClient(plan=lambda inp, n: "lost" if n == 1 else "ok")
    (job,) = bundles(tmp_path / "a", 1)
    with backend(tmp_path / "a", once) as b:
        r = b.run(job)
        row = b.journal.get(b._key(job), history=True)
    assert r.status == "succeeded" and once.total_runs() == 2
    assert [a["status"] for a in row.history] == ["failed", "completed"]
    assert r.cost_usd == pytest.approx(2 * PER_JOB)      # the lost attempt was billed too
    always = FakeServerlessClient(plan=lambda inp, n: "lost")
    with backend(tmp_path / "b", always, retry_budget=2) as b:
        r = b.run(job)
    assert r.status == "infra_failed" and always.total_runs() == 3
    assert "failed without a result from our handler" in r.error and "gave up after 3 attempt(s)" in r.error


def test_an_expired_result_is_resubmitted_within_the_budget(tmp_path):
    fake = FakeServerlessClient(plan=lambda inp, n: "expired" if n == 1 else "ok")
    (job,) = bundles(tmp_path, 1)
    with backend(tmp_path, fake) as b:
        r = b.run(job)
        row = b.journal.get(b._key(job), history=True)
    assert r.status == "succeeded" and fake.total_runs() == 2
    assert row.history[0]["status"] == "expired" and "expired before it was read" in row.history[0]["error"]


def test_a_job_stuck_in_the_queue_past_its_deadline_is_cancelled_and_sent_again(tmp_path):
    fake = FakeServerlessClient(plan=lambda inp, n: "stuck" if n == 1 else "ok")
    with backend(tmp_path, fake, deadline_s=0.5) as b:
        (job,) = bundles(tmp_path, 1)
        h = b.submit(job)
        r = b.wait(h, timeout=30)
        row = b.journal.get(h.meta["key"], history=True)
    assert r.status == "succeeded", r.error
    assert [a["status"] for a in row.history] == ["timed_out", "completed"]
    assert fake.calls["cancel"] == 1 and fake.total_runs() == 2
    assert r.timings["runpod_attempts"] == 2


def test_a_non_replica_worker_fails_once_with_the_reason_and_is_never_retried_or_served(tmp_path):
    """Issue 32, item 10: a result from a worker that fails require_revision / expected_versions is
    deterministic (the endpoint's image answers the same every time): one attempt, charged once, then
    infra_failed with the reason; never retried at full cost, never served."""
    fake = FakeServerlessClient(plan=lambda inp, n: "non_replica")
    (job,) = bundles(tmp_path, 1)
    with backend(tmp_path, fake, retry_budget=2) as b:
        r = b.run(job)
        assert r.status == "infra_failed" and "non-replica worker: image revision 'other-image'" in r.error
        assert "Not retried" in r.error and "fleet.endpoint up" in r.error
        assert fake.total_runs() == 1 and r.cost_usd == pytest.approx(PER_JOB)   # one attempt, paid once
        assert r.timings["runpod_attempts"] == 1
        b.run(job)                                       # an infra_failed row is claimed again, not served
        assert fake.total_runs() == 2
    pinned = FakeServerlessClient()
    with backend(tmp_path / "v", pinned, expected_versions={"train:verifiers": "0.3.0"}, retry_budget=2) as b:
        r = b.run(job)
    assert r.status == "infra_failed" and "train:verifiers 0.2.0, pinned 0.3.0" in r.error
    assert pinned.total_runs() == 1


def test_a_job_that_fails_by_itself_is_job_failed_and_not_retried(tmp_path):
    fake = FakeServerlessClient(plan=lambda inp, n: "job_failed")
    (job,) = bundles(tmp_path, 1)
    with backend(tmp_path, fake) as b:
        r = b.run(job)
    assert r.status == "job_failed" and "rubric" in r.error and fake.total_runs() == 1
    assert r.cost_usd == pytest.approx(PER_JOB)


def test_429_and_5xx_past_the_clients_retries_are_retried_and_a_401_is_not(tmp_path):
    fake = FakeServerlessClient()
    jobs = bundles(tmp_path, 4)
    with backend(tmp_path, fake) as b:
        fake.errors["run"] = [429, 0]                    # a 429 and no connection, past the client's retries
        r = b.run(jobs[0])
        assert r.status == "succeeded" and r.timings["runpod_attempts"] == 3 and fake.total_runs() == 1
        fake.errors["status"] = [503, 503, 503]          # three status reads fail: under status_error_budget
        assert b.run(jobs[1]).status == "succeeded" and fake.total_runs() == 2 and not fake.errors["status"]
        fake.errors["run"] = [503]                       # the client's SubmitUncertain: maybe queued
        r = b.run(jobs[2])
        assert r.status == "infra_failed" and "not resent" in r.error and fake.calls["run"] == 5
        fake.errors["run"] = [401]
        r = b.run(jobs[3])
    assert r.status == "infra_failed" and "Runpod refused the job" in r.error and "RUNPOD_API_KEY" in r.error
    assert fake.calls["run"] == 6 and fake.total_runs() == 2


#: limits whose bound is exactly one instant job's bill: deadline 2 + 60 s, no ttl margin, no idle
EXACT_BOUND = {"execution_timeout_s": 60, "startup_allowance_s": 2, "ttl_margin_s": 0, "idle_timeout_s": 0}


def test_budgets_stop_dispatch_with_a_clear_message(tmp_path):
    fake = FakeServerlessClient()
    jobs = bundles(tmp_path, 4)
    with backend(tmp_path, fake, run_budget_usd=2.5 * PER_JOB, **EXACT_BOUND) as b:
        assert b.estimate_cost_usd(jobs[0]) == pytest.approx(PER_JOB)   # the bound: 62 s x $/s x 2 GPUs
        done = [b.run(j) for j in jobs[:3]]
    assert [r.status for r in done] == ["succeeded", "succeeded", "infra_failed"]
    assert "run budget exceeded" in done[2].error and "backend.options.run_budget_usd" in done[2].error
    assert fake.total_runs() == 2 and done[2].cost_usd == 0
    fake2 = FakeServerlessClient()
    for j in jobs:
        j.manifest.episode_id = "ep-1"
    with backend(tmp_path / "ep", fake2, episode_budget_usd=1.5 * PER_JOB, **EXACT_BOUND) as b:
        first, second = b.run(jobs[0]), b.run(jobs[1])
    assert first.status == "succeeded" and second.status == "infra_failed"
    assert "episode budget exceeded: episode ep-1" in second.error and fake2.total_runs() == 1


def test_the_run_budget_reserves_each_jobs_bound_including_the_local_queue(tmp_path):
    """Issue 32, item 3: six jobs submitted at once with max_in_flight=1 against a budget of 2.5 bounds: the
    queued ones count (each reserves its bound when accepted), so exactly two run and spending stays within
    the budget; the refused ones say why and cost nothing."""
    fake = FakeServerlessClient(polls_to_finish=10**9)   # no job ends until the reservation is read
    jobs = bundles(tmp_path, 6)
    with backend(tmp_path, fake, max_in_flight=1, run_budget_usd=2.5 * PER_JOB, **EXACT_BOUND) as b:
        handles = [b.submit(j) for j in jobs]
        assert b.run_costs().reserved == pytest.approx(2 * PER_JOB)      # two bounds held, nothing spent
        fake.polls_to_finish = 3   # (with 3 from the start, a fast poller had ended the first job here: flaky)
        results = [b.wait(h, timeout=30) for h in handles]
        costs = b.run_costs()
    assert [r.status for r in results] == ["succeeded"] * 2 + ["infra_failed"] * 4
    assert all("run budget exceeded" in r.error and r.cost_usd == 0 for r in results[2:])
    assert fake.total_runs() == 2 and costs.total <= 2.5 * PER_JOB and costs.reserved == 0


def test_a_job_leaving_the_local_queue_is_checked_again(tmp_path):
    """The reservation is re-checked when a job leaves the local queue: spending that its bound did not
    foresee (here another orchestrator's job on the same run dir, billed meanwhile) stops the queued job."""
    fake = FakeServerlessClient(polls_to_finish=10**9)
    jobs = bundles(tmp_path, 2)
    with backend(tmp_path, fake, max_in_flight=1, run_budget_usd=2.5 * PER_JOB, **EXACT_BOUND) as b:
        first, second = b.submit(jobs[0]), b.submit(jobs[1])      # both accepted: 2 bounds <= 2.5
        while b.journal.get(first.meta["key"]).job_id is None:    # the first one is out
            time.sleep(0.01)
        other = Journal.in_run_dir(tmp_path / "runs")
        other.claim("elsewhere", claimant="x", owner="another-host:1:s")
        other.finish("elsewhere", None, "infra_failed", "billed", Billing(cost_usd=PER_JOB))
        fake.polls_to_finish = 1
        r1, r2 = b.wait(first, timeout=30), b.wait(second, timeout=30)
    assert r1.status == "succeeded" and r2.status == "infra_failed" and "run budget exceeded" in r2.error
    assert fake.total_runs() == 1


# ---------------------------------------------------------------------------------------------- baselines
def test_a_baseline_goes_through_the_same_handler_and_journal(tmp_path):
    fake = FakeServerlessClient()
    with backend(tmp_path, fake) as b:
        entry = b.measure_baseline("arithmetic", "Qwen/Qwen3-0.6B")
        again = b.measure_baseline("arithmetic", "Qwen/Qwen3-0.6B")
    assert entry.score == again.score == 0.25 and entry.backend == "runpod"
    sent = fake.store.all()
    assert len(sent) == 1 and sent[0]["input"]["kind"] == "baseline"


# ---------------------------------------------------------------------------------------------- real jobs
def _real_settings(**options: Any) -> BackendSettings:
    from tests.gpu.helpers import local_settings

    local = local_settings(name="runpod", measure_pre=False)
    opts = {"executor": "local", "require_revision": None, "poll_interval_s": 0.2,
            **{k: v for k, v in local.options.items() if k != "measure_pre"}, **options}
    return settings(**opts).model_copy(update={"models": local.models, "bounds": local.bounds})


def _pin_base(b: RunpodBackend) -> None:
    from ait_env.hidden.baselines import BaselineEntry
    from cpu.tiny_models.catalog import weights_hash

    b.baselines.put([BaselineEntry(backend="runpod", family="arithmetic", model="ait-tiny-s", score=0.1,
                                   model_hash=weights_hash("ait-tiny-s"), seeded_at=1.0)])


def test_a_real_job_through_the_real_handler(tmp_path):
    from tests.gpu.helpers import make_job, needs_tiny_model

    if needs_tiny_model.args[0]:
        pytest.skip("ait-tiny-s is not built (python -m cpu.tiny_models.build)")
    pytest.importorskip("verifiers")
    fake = FakeServerlessClient(mode="real", workers=1, store_input=False)
    try:
        with RunpodBackend(_real_settings(), tmp_path / "runs", show_progress=False, client=fake) as b:
            _pin_base(b)
            r = b.run(make_job(tmp_path, job_id="rp-real-1"), timeout=300)
        (job_id,) = fake._futures
        want = fake._futures[job_id].result()["result"]
    finally:
        fake.close()
    assert r.status == "succeeded", r.error
    assert r.post_score == want["post_score"] and r.curves == want["curves"] and r.worker == want["worker"]
    assert r.cost_usd == pytest.approx(PER_JOB) and r.baselines["ait-tiny-s"] == 0.1


@pytest.mark.slow
def test_a_worker_killed_mid_job_is_retried_and_succeeds(tmp_path):
    import time

    from tests.gpu.helpers import make_job, needs_tiny_model

    if needs_tiny_model.args[0]:
        pytest.skip("ait-tiny-s is not built (python -m cpu.tiny_models.build)")
    pytest.importorskip("verifiers")
    fake = FakeServerlessClient(mode="real", workers=1, store_input=False)
    try:
        with RunpodBackend(_real_settings(), tmp_path / "runs", show_progress=False, client=fake) as b:
            _pin_base(b)
            h = b.submit(make_job(tmp_path, job_id="rp-real-2"))
            time.sleep(5)
            fake.kill_workers()                          # the worker process dies mid-job
            fake._pool = type(fake._pool)(1, mp_context=fake._pool._mp_context)  # a fresh worker
            r = b.wait(h, timeout=300)
            row = b.journal.get(h.meta["key"], history=True)
    finally:
        fake.close()
    assert r.status == "succeeded", r.error
    assert [a["status"] for a in row.history] == ["failed", "completed"]


# ---------------------------------------------------------------------------------------------- prices
def test_bills_use_the_dated_price_of_the_gpu_type_that_ran_the_job():
    from fleet.billing import GpuPrices
    from fleet import prices

    p = GpuPrices()
    assert p.price("NVIDIA A100 80GB PCIe") == prices.FLEX_USD_PER_S["AMPERE_80"]
    assert p.price("NVIDIA L40S") == prices.FLEX_USD_PER_S["ADA_48_PRO"]          # not the L4's
    assert p.price("NVIDIA L4") == prices.FLEX_USD_PER_S["AMPERE_24"]
    assert p.price("Some Future GPU") == max(prices.FLEX_USD_PER_S.values())       # never under-billed
    assert GpuPrices(usd_per_gpu_s={"NVIDIA A40": 0.001}).price("NVIDIA A40") == 0.001

    class Status:
        delay_time_ms, execution_time_ms = 3_000, 117_000

    from fleet.runpod_engine import RunpodEngine

    b = RunpodEngine.__new__(RunpodEngine)
    b.options = RunpodBackend.Options.model_validate(settings().options)   # billing needs only the options
    bill = b.bill(Status(), {"gpus": ["NVIDIA H200 (143771 MiB)"] * 4})   # type: ignore[arg-type]
    assert (bill.gpu_type, bill.gpus_per_worker) == ("NVIDIA H200", 4)
    assert bill.cost_usd == pytest.approx(120 * prices.FLEX_USD_PER_S["HOPPER_141"] * 4)
    lost = b.bill(Status())                                            # no result: the endpoint's GPUs
    assert (lost.gpu_type, lost.gpus_per_worker) == ("NVIDIA RTX A5000", 2)


# ---------------------------------------------------------------------------------------------- the HTTP fake
def test_the_real_client_against_the_http_fake_endpoint(tmp_path, monkeypatch):
    """The backend builds fleet.runpod_api.ServerlessClient from RUNPOD_API_KEY and talks HTTP to
    tests/gpu/fake_runpod.py: 429s on run and 503s on status are absorbed by the client, a job stuck in
    the queue whose result expires is sent again, and nothing is sent twice."""
    from tests.gpu.fake_runpod import start_fake_runpod

    output = {"kind": "job", "baselines": [], "result": {
        "job_id": "w", "backend": "runpod", "status": "succeeded", "post_score": 0.5,
        "worker": {"image_revision": "rev-1", "versions": {}, "gpus": ["NVIDIA A40 (46068 MiB)"] * 2}}}
    jobs = bundles(tmp_path, 4)
    with start_fake_runpod(instant=True, instant_output=output) as fake:
        monkeypatch.setenv("RUNPOD_API_KEY", fake.api_key)
        with RunpodBackend(settings(endpoint_id=fake.endpoint_id, base_url=fake.job_base_url),
                           tmp_path / "runs", show_progress=False) as b:
            fake.fail_next("run", 429, count=1)
            fake.fail_next("status", 503, count=2)
            results = run_all(b, jobs[:3])
            fake.stick_next(1)                              # stays IN_QUEUE ...
            h = b.submit(jobs[3])
            first = b.journal.get(h.meta["key"])
            while first.job_id is None:
                first = b.journal.get(h.meta["key"])
            fake.expire(first.job_id)                        # ... until its result is gone (404)
            last = b.wait(h, timeout=30)
            row = b.journal.get(h.meta["key"], history=True)
            journal = b.journal.path.read_bytes()
        assert len(fake.jobs) == 4 and first.job_id not in fake.jobs   # 3 + the resend (expired: forgotten)
    assert all(r.status == "succeeded" and r.post_score == 0.5 for r in [*results, last])
    assert [a["status"] for a in row.history] == ["expired", "completed"]
    assert fake.api_key.encode() not in journal


def test_closing_the_backend_wakes_its_waiters_and_a_new_one_reattaches(tmp_path):
    fake = FakeServerlessClient(polls_to_finish=10**9)
    (job,) = bundles(tmp_path, 1)
    b = backend(tmp_path, fake)
    h = b.submit(job)
    got: list[JobResult] = []
    waiter = threading.Thread(target=lambda: got.append(b.wait(h)))
    waiter.start()
    b.close()
    waiter.join(10)
    assert got and got[0].status == "infra_failed" and "re-attaches it" in got[0].error
    assert got[0].cost_usd == 0
    fake.polls_to_finish = 1
    with backend(tmp_path, fake) as again:
        r = again.wait(h, timeout=30)
    assert r.status == "succeeded" and r.cost_usd == pytest.approx(PER_JOB) and fake.total_runs() == 1


def test_an_episode_on_the_runpod_backend_is_scored_and_its_job_is_in_the_cost_ledger(make_env, runs_dir):
    from ait_env.agents.reference import ScriptedReferenceAgent
    from ait_env.hidden.baselines import BaselineEntry

    pytest.importorskip("verifiers")
    fake = FakeServerlessClient()
    with RunpodBackend(settings(), runs_dir, show_progress=False, client=fake) as b:
        b.baselines.put([BaselineEntry(backend="runpod", family="arithmetic", model=m, score=s)
                         for m, s in (("Qwen/Qwen3-0.6B", 0.1), ("Qwen/Qwen3-1.7B", 0.2))])
        env = make_env(family="arithmetic", backend=b)
        agent = ScriptedReferenceAgent()
        obs, info = env.reset(seed=1)
        agent.reset(info)
        for _ in range(10):
            obs, reward, terminated, truncated, info = env.step(agent.act(obs, info))
            if terminated or truncated:
                break
        ledger = env.unwrapped.ledger.records()
        costs = b.run_costs()
    assert info["reward"]["status"] == "scored", obs
    jobs = [r for r in ledger if r.kind == "gpu_job"]
    assert len(jobs) == 1 and jobs[0].usd == pytest.approx(PER_JOB) and fake.total_runs() == 1
    assert jobs[0].episode_id == env.unwrapped.episode_id
    # the run's idle worker time reached the env's ledger after the job (the global budget sees it)
    idle = [r for r in ledger if r.kind == "gpu_idle"]
    assert len(idle) == 1 and idle[0].usd == pytest.approx(costs.idle) and costs.idle > 0
    assert idle[0].episode_id is None


def test_the_key_is_what_decides_the_result_not_how_it_is_dispatched(tmp_path):
    (job,) = bundles(tmp_path, 1)
    fake = FakeServerlessClient()
    keys = {}
    for name, opts in {"base": {},
                       "dispatch": {"poll_interval_s": 2.0, "max_in_flight": 3, "retry_budget": 5},
                       "executor": {"executor_options": {"max_model_len": 4096}},
                       "runner": {"eval_subset": 50}}.items():
        with backend(tmp_path / name, fake, **opts) as b:
            keys[name] = b._key(job)
    assert keys["dispatch"] == keys["base"]                          # orchestrator settings: same job
    assert len({keys["base"], keys["executor"], keys["runner"]}) == 3   # what the worker runs: another job


@pytest.mark.slow
def test_a_real_worker_of_the_http_fake_killed_mid_job_is_retried_by_the_backend(tmp_path, monkeypatch):
    """tests/gpu/fake_runpod.py with a real worker process, no queue retry of its own: the worker is
    SIGKILLed mid-job, Runpod reports FAILED, the backend sends attempt 2, which succeeds."""
    from tests.gpu.fake_runpod import start_fake_runpod
    from tests.gpu.helpers import make_job, needs_tiny_model, worker_env

    if needs_tiny_model.args[0]:
        pytest.skip("ait-tiny-s is not built (python -m cpu.tiny_models.build)")
    pytest.importorskip("verifiers")
    with start_fake_runpod(workers=1, worker_env=worker_env(tmp_path), log_dir=tmp_path,
                           max_worker_retries=0) as fake:
        monkeypatch.setenv("RUNPOD_API_KEY", fake.api_key)
        fake.kill_next(1, after_s=4.0)
        cfg = _real_settings(endpoint_id=fake.endpoint_id, base_url=fake.job_base_url, poll_interval_s=0.5)
        with RunpodBackend(cfg, tmp_path / "runs", show_progress=False) as b:
            _pin_base(b)
            h = b.submit(make_job(tmp_path, job_id="rp-http-1"))
            r = b.wait(h, timeout=400)
            row = b.journal.get(h.meta["key"], history=True)
    assert r.status == "succeeded", r.error
    assert [a["status"] for a in row.history] == ["failed", "completed"]
    assert r.cost_usd > 0 and r.timings["runpod_attempts"] == 2


@pytest.mark.slow
def test_twenty_real_jobs_through_four_workers_match_backend_local(tmp_path, monkeypatch):
    """Issue #25's acceptance: 20 distinct real jobs (the tiny model, the local executor) through the HTTP
    fake's 4 worker processes running the real handler: each completes exactly once, its result equals what
    ``python -m ait_env.runner`` (backend=local) gives for the same bundle, and the bills add up."""
    import json
    import subprocess
    import sys
    import time

    from ait_env.hidden.baselines import BaselineEntry
    from cpu.tiny_models.catalog import weights_hash
    from tests.gpu.fake_runpod import start_fake_runpod
    from tests.gpu.helpers import local_settings, make_job, needs_tiny_model, worker_env

    if needs_tiny_model.args[0]:
        pytest.skip("ait-tiny-s is not built (python -m cpu.tiny_models.build)")
    pytest.importorskip("verifiers")
    env = worker_env(tmp_path)
    jobs = [make_job(tmp_path / "rp", job_id=f"rp-{i:02d}", seed=1000 + i) for i in range(20)]
    t0 = time.time()
    with start_fake_runpod(workers=4, worker_env=env, log_dir=tmp_path) as fake:
        monkeypatch.setenv("RUNPOD_API_KEY", fake.api_key)
        cfg = _real_settings(endpoint_id=fake.endpoint_id, base_url=fake.job_base_url, poll_interval_s=0.5)
        with RunpodBackend(cfg, tmp_path / "runs", show_progress=False) as b:
            _pin_base(b)
            results = run_all(b, jobs, timeout=1800)
            spent, rows = b.journal.spent_usd(), b.journal.rows()
        sent = dict(fake.jobs)
    fleet_s = time.time() - t0
    assert [r.status for r in results] == ["succeeded"] * 20, [r.error for r in results]
    assert len(sent) == 20 and len(rows) == 20                      # exactly once: 20 runs, 20 journal rows
    assert sum(r.cost_usd for r in results) == pytest.approx(spent) and spent > 0
    # the same bundles through the runner as backend=local runs them, with the same secret seeds and pin
    from ait_env.hidden.baselines import BaselineStore

    pins = tmp_path / "pins"
    BaselineStore("local", user_dir=pins).put([BaselineEntry(
        backend="local", family="arithmetic", model="ait-tiny-s", score=0.1,
        model_hash=weights_hash("ait-tiny-s"), seeded_at=1.0)])
    (tmp_path / "local.json").write_text(local_settings(measure_pre=False).model_dump_json())
    t1 = time.time()
    for job, res in zip(jobs, results):
        twin = make_job(tmp_path / "local", job_id=job.job_id, seed=1000 + int(job.job_id[3:]))
        out = subprocess.run([sys.executable, "-m", "ait_env.runner", str(twin.root), "--backend-settings",
                              str(tmp_path / "local.json"), "--baselines-dir", str(pins), "--no-progress"],
                             env=env, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
        assert out.returncode == 0, out.stderr[-2000:]
        ref = json.loads((twin.root / "result.json").read_text())
        assert (res.post_score, res.post_ci95) == (ref["post_score"], ref["post_ci95"]), job.job_id
        assert res.curves["train_reward"] == pytest.approx(ref["curves"]["train_reward"], rel=1e-12, abs=1e-15), job.job_id
    print(f"20 jobs through 4 fake Runpod workers: {fleet_s:.0f} s; the same 20 one by one as backend=local: "
          f"{time.time() - t1:.0f} s; billed ${spent:.4f}")


def test_seed_baselines_pins_a_baseline_through_runpod(tmp_path):
    """``python scripts/seed_baselines.py backend=runpod`` through the HTTP fake, whose worker runs the real
    handler (the tiny model's baseline on 8 hidden questions, the local executor): the entry lands in the
    user store and the bill in the journal."""
    import json
    import subprocess
    import sys

    from tests.gpu.fake_runpod import start_fake_runpod
    from tests.gpu.helpers import needs_tiny_model, worker_env

    if needs_tiny_model.args[0]:
        pytest.skip("ait-tiny-s is not built (python -m cpu.tiny_models.build)")
    pytest.importorskip("verifiers")
    env = worker_env(tmp_path)
    with start_fake_runpod(workers=1, worker_env=env, log_dir=tmp_path) as fake:
        out = subprocess.run(
            [sys.executable, "scripts/seed_baselines.py", "backend=runpod", "families=arithmetic",
             f"backend.options.base_url={fake.job_base_url}", "backend.options.executor=local",
             "backend.options.require_revision=null", "+backend.options.eval_limit=8",
             "backend.models=[{name: ait-tiny-s, role: small}]", f"env.runs_dir={tmp_path / 'runs'}"],
            env={**env, "RUNPOD_API_KEY": fake.api_key, "RUNPOD_ENDPOINT_ID": fake.endpoint_id}, cwd=ROOT,
            capture_output=True, text=True, timeout=600, check=False)
        sent = len(fake.jobs)
    assert out.returncode == 0, out.stderr[-3000:]
    entries = json.loads((Path(env.get("AIT_DATA_DIR") or os.environ["AIT_DATA_DIR"]) / "baselines" / "runpod.json").read_text())["entries"]
    assert [(e["family"], e["model"], e["n"]) for e in entries] == [("arithmetic", "ait-tiny-s", 8)]
    assert sent == 1 and "wrote 1 baselines" in out.stdout and "python -m fleet.reconcile" in out.stderr
