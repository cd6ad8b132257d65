"""The skypilot backend: the task and pool YAML it generates pass SkyPilot's own parser (skipped without the
``skypilot`` extra); against a fake of SkyPilot's SDK boundary (tests/fakes/fake_sky.py), jobs complete
exactly once, real tiny-model jobs equal backend=local's results, and faults (a worker lost mid-job with and
without SkyPilot's recovery, a pool that cannot scale, a lost launch answer, an orchestrator killed
mid-batch, budgets) keep the dispatch core's guarantees: nothing lost, nothing paid twice."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ait_env.backends import make_backend
from ait_env.backends.skypilot import SkypilotBackend
from ait_env.config import load_group
from ait_env.jobs.gpus import gpus_for_job
from ait_env.jobs.settings import BackendSettings
from fleet import prices
from fleet.settings import SkypilotOptions
from fleet.skypilot_engine import (
    INSTALL_HINT,
    REQUEST_ENV,
    SkySDK,
    decode_request,
    job_yaml,
    parse_result,
    pool_yaml,
    result_lines,
)
from tests.backends.test_runpod_backend import bundles
from tests.fakes.fake_sky import FakeSky
from tests.fakes.runpod_client import instant_output

ROOT = Path(__file__).resolve().parents[2]


def settings(**options: Any) -> BackendSettings:
    base = load_group("backend", "skypilot")
    opts = {**base["options"], "poll_interval_s": 0.01, "require_revision": "rev-1", **options}
    return BackendSettings.model_validate({**base, "options": opts})


def fake(workers: int = 3, **kw: Any) -> FakeSky:
    return FakeSky(workers, instant=True, instant_output=lambda body: instant_output(body, "ok", "rev-1"), **kw)


def backend(tmp_path: Path, sky: FakeSky, **options: Any) -> SkypilotBackend:
    return SkypilotBackend(settings(**options), tmp_path / "runs", show_progress=False, sdk=SkySDK(sky))


# ---------------------------------------------------------------------------------------------- SkyPilot's parser
#: parses each task config on stdin (a JSON list) with SkyPilot's own parser and prints what it made of it
PARSE = r"""
import json, sys
import sky
out = []
for cfg in json.load(sys.stdin):
    try:
        t = sky.Task.from_yaml_config(cfg)
    except Exception as exc:
        out.append({"error": f"{type(exc).__name__}: {exc}"})
        continue
    out.append({"run": t.run, "envs": dict(t.envs), "resources": sorted(str(r) for r in t.resources),
                "pool": bool(t.service is not None and t.service.pool), "version": sky.__version__})
print(json.dumps(out))
"""


def skypilot_python() -> str:
    """An interpreter with the skypilot extra: this one, $AIT_SKYPILOT_PYTHON, or .venv-sky (scripts/test_skypilot.sh
    makes it: skypilot 0.14.1 needs click<8.2 and runpod 1.12.0 click>=8.4.2, so they cannot share .venv)."""
    import importlib.util
    import os

    if importlib.util.find_spec("sky") is not None:
        return sys.executable
    for cand in (os.environ.get("AIT_SKYPILOT_PYTHON"), str(ROOT / ".venv-sky" / "bin" / "python")):
        if cand and Path(cand).exists():
            return cand
    pytest.skip(f"{INSTALL_HINT}; or make .venv-sky: bash scripts/test_skypilot.sh")


def sky_parse(configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = subprocess.run([skypilot_python(), "-c", PARSE], input=json.dumps(configs), capture_output=True,
                         text=True, timeout=300, check=False, env={"PATH": "/usr/bin:/bin", "HOME": str(ROOT / ".venv-sky"),
                                                                   "SKYPILOT_DISABLE_USAGE_COLLECTION": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_job_and_pool_yaml_pass_skypilots_own_parser():
    pool = SkypilotOptions.model_validate(settings().options).pool.model_copy(
        update={"image": "docker:ghcr.io/example/ait-worker:rev1"})
    body = {"kind": "job", "executor": "gpu", "settings": {"name": "skypilot"}, "bundle": "x" * 5000, "tag": "t1"}
    job = job_yaml(body, name="ait-t1", pool=pool, gpus=1)
    bad_job = {**job, "gpus_per_node": 2}
    bad_pool = {**pool_yaml(pool, 2), "pool": {"min_workers": 3, "max_workers": 1}}
    got = sky_parse([job, job_yaml(body, name="ait-t2", pool=pool, gpus=2, secrets={"AIT_SECRETS_JSON": "{}"}),
                     pool_yaml(pool, 2),
                     pool_yaml(pool.model_copy(update={"workers": 4}), 1), bad_job, bad_pool])
    assert [g.get("error") for g in got[:4]] == [None] * 4, got
    assert got[0]["version"] == "0.14.1"
    assert got[0]["run"] == f"python -m gpu.worker --request-env {REQUEST_ENV}"
    assert decode_request(got[0]["envs"][REQUEST_ENV]) == body
    assert len(got[0]["resources"]) == 3 and all(": 1}" in r for r in got[0]["resources"]), got[0]["resources"]
    assert all(": 2}" in r for r in got[1]["resources"])
    assert got[2]["pool"] and got[3]["pool"] and not got[0]["pool"]
    assert "gpus_per_node" in got[4]["error"]                          # it really validates
    assert "min_workers" in got[5]["error"], got[5]


#: what SkyPilot's API server runs on a pool and on a managed job before it starts anything (skypilot 0.14.1):
#: a pool, ``sky/serve/server/impl.py`` ``up``: ``serve_utils.validate_service_task(task, pool=True)``, the name
#: against ``CLUSTER_NAME_VALID_REGEX``, ``dag_utils.convert_entrypoint_to_dag``; a job, ``sky/jobs/server/core.py``
#: ``_launch``: the DAG a single-task chain; then the pool's scheduler,
#: ``serve_utils.get_next_cluster_name``: a job goes to a worker whose free resources it fits
#: (``_task_fits``), the free resources being the worker's minus its running jobs' (``Resources.__sub__``).
#: Not run: ``task.validate()`` / ``dag.validate()``, which canonicalize accelerator names against SkyPilot's
#: catalog, fetched from raw.githubusercontent.com at first use (sky/catalog/common.py): not reachable here
SERVER_SIDE = r"""
import json, re, sys
import sky
from sky.serve import serve_utils
from sky.skylet import constants
from sky.utils import dag_utils
from sky import resources as resources_lib

def pool_check(cfg):
    name = cfg["name"]   # the pool's name, which fleet.pool passes as pool_name (from_yaml_config consumes cfg)
    task = sky.Task.from_yaml_config(dict(cfg))
    serve_utils.validate_service_task(task, pool=True)
    assert re.fullmatch(constants.CLUSTER_NAME_VALID_REGEX, name), name
    dag_utils.convert_entrypoint_to_dag(task)
    return task

def job_check(cfg):
    dag = dag_utils.convert_entrypoint_to_dag(sky.Task.from_yaml_config(dict(cfg)))
    assert dag.is_chain() and len(dag.tasks) == 1
    return dag.tasks[0]

def jobs_on_a_worker(worker, job):
    # how many copies of the job SkyPilot's scheduler places on one idle worker of the pool
    placed, free = 0, worker
    while placed < 16 and any(serve_utils._task_fits(r, free) for r in job.resources):
        r = next(r for r in job.resources if serve_utils._task_fits(r, free))
        free, placed = free - r, placed + 1
    return placed

inp = json.load(sys.stdin)
out = {"pools": [], "jobs": {}}
for cfg in inp["pools"]:
    try:
        task = pool_check(cfg)
    except Exception as exc:
        out["pools"].append({"error": f"{type(exc).__name__}: {exc}"})
        continue
    workers = [resources_lib.Resources(infra=inp["infra"], accelerators=r.accelerators)
               for r in task.resources]
    placed = {}
    for name, jcfg in inp["jobs"].items():
        job = job_check(jcfg)
        placed[name] = [jobs_on_a_worker(w, job) for w in workers]
    out["pools"].append({"error": None, "placed": placed,
                         "workers": sorted(str(a) for w in workers for a in w.accelerators.items())})
print(json.dumps(out))
"""


def sky_server_side(pools: list[dict[str, Any]], jobs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    out = subprocess.run([skypilot_python(), "-c", SERVER_SIDE], input=json.dumps({"pools": pools, "jobs": jobs, "infra": "runpod"}),
                         capture_output=True, text=True, timeout=300, check=False,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(ROOT / ".venv-sky"),
                              "SKYPILOT_DISABLE_USAGE_COLLECTION": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_skypilots_api_server_accepts_the_pool_and_places_1_and_2_gpu_jobs_on_its_workers():
    """The default pool (2-GPU workers: the allowed Qwen3-1.7B needs 2), a fixed 1-GPU pool and a one-accelerator
    pool pass the checks SkyPilot's API server runs when a pool is created; 1- and 2-GPU jobs pass a managed
    job launch's; and SkyPilot's scheduler puts two 1-GPU jobs or one 2-GPU job on a default worker (what
    the per-share bill assumes). A pool in ``ordered`` form, as the engine once wrote it, is refused."""
    opts = SkypilotOptions.model_validate(settings().options)
    pool = opts.pool.model_copy(update={"image": "docker:ghcr.io/example/ait-worker:rev1"})
    default_gpus = max(gpus_for_job(m.name, settings().bounds.seq_len).gpus for m in settings().models)
    assert default_gpus == 2
    one = pool.model_copy(update={"accelerators": ["L40S"]})
    body = {"kind": "job", "executor": "gpu", "settings": {"name": "skypilot"}, "bundle": "x" * 500, "tag": "t1"}
    jobs = {"1gpu": job_yaml(body, name="ait-t1", pool=pool, gpus=1),
            "2gpu": job_yaml(body, name="ait-t2", pool=pool, gpus=2, secrets={"AIT_SECRETS_JSON": "{}"})}
    ordered = pool_yaml(pool, 2)
    ordered["resources"] = {k: v for k, v in ordered["resources"].items() if k != "any_of"}
    ordered["resources"]["ordered"] = [{"accelerators": {a: 2}} for a in pool.accelerators]
    got = sky_server_side([pool_yaml(pool, default_gpus), pool_yaml(pool.model_copy(update={"workers": 4}), 1),
                           pool_yaml(one, 2), ordered], jobs)
    default, fixed1, single, refused = got["pools"]
    assert [p["error"] for p in (default, fixed1, single)] == [None] * 3, got
    assert "Ordered resources are not supported for pools" in refused["error"]
    assert default["workers"] == sorted(f"('{a}', 2)" for a in pool.accelerators)
    assert default["placed"] == {"1gpu": [2, 2, 2], "2gpu": [1, 1, 1]}, default   # two 1-GPU jobs share a worker
    assert fixed1["placed"] == {"1gpu": [1, 1, 1], "2gpu": [0, 0, 0]}, fixed1     # a 2-GPU job never fits
    assert single["placed"] == {"1gpu": [2], "2gpu": [1]}, single


#: the SDK calls SkySDK makes, with the keyword arguments it passes (fleet/skypilot_engine.py)
CALLS = {"jobs.launch": ["task", "name", "pool"], "jobs.queue_v2": ["refresh", "skip_finished", "job_ids",
         "fields", "name_match"], "jobs.cancel": ["job_ids"], "jobs.tail_logs": ["job_id", "follow", "output_stream"],
         "jobs.pool_apply": ["task", "pool_name", "mode"], "jobs.pool_status": ["pool_names"],
         "jobs.pool_down": ["pool_names"], "get": ["request_id"]}
SIGNATURES = r"""
import inspect, json, sys
import sky
calls = json.load(sys.stdin)
out = {}
for name, want in calls.items():
    fn = sky
    for part in name.split("."):
        fn = getattr(fn, part)
    params = inspect.signature(inspect.unwrap(fn)).parameters
    out[name] = [p for p in want if p not in params]
fields = set(sky.jobs.ManagedJobStatus.__members__.values())
out["statuses"] = sorted(s.value for s in fields)
out["update_mode"] = sky.serve.UpdateMode.ROLLING.value
from sky.schemas.api import responses
out["record_fields"] = sorted(responses.ManagedJobRecord.model_fields)
print(json.dumps(out))
"""


def test_the_sdk_calls_and_statuses_match_the_pinned_skypilot():
    """Every call SkySDK (and so the fake) makes exists with those arguments in skypilot 0.14.1, and the
    status map covers exactly its ManagedJobStatus values."""
    from fleet.skypilot_engine import QUEUE_FIELDS, STATUS_MAP

    out = subprocess.run([skypilot_python(), "-c", SIGNATURES], input=json.dumps(CALLS), capture_output=True,
                         text=True, timeout=300, check=False, env={"PATH": "/usr/bin:/bin", "HOME": str(ROOT / ".venv-sky"),
                                                                   "SKYPILOT_DISABLE_USAGE_COLLECTION": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert {k: v for k, v in got.items() if k in CALLS and v} == {}
    assert sorted(STATUS_MAP) == got["statuses"]
    assert got["update_mode"] == "rolling"
    assert set(QUEUE_FIELDS) <= set(got["record_fields"]), set(QUEUE_FIELDS) - set(got["record_fields"])


def test_the_result_travels_through_the_log_intact():
    out = {"kind": "job", "result": {"status": "succeeded", "curves": list(range(5000))}}
    log = "\n".join(["setup noise", *(f"(worker1, pid=7) {ln}" for ln in result_lines(out)), "tail"])
    assert parse_result(log) == out
    broken = log.replace(result_lines(out)[1][:10], "AAAAAAAAAA", 1)
    assert parse_result(broken) is None                                 # a damaged blob is no result


def test_gpus_per_job_come_from_one_rule():
    assert gpus_for_job("Qwen/Qwen3-0.6B", 2048).gpus == 1
    assert gpus_for_job("Qwen/Qwen3-1.7B", 2048).gpus == 2
    assert gpus_for_job("Some/Unknown-7B", 2048).gpus == 2
    sky = fake()
    try:
        with backend(Path("/tmp/unused-skypilot"), sky) as b:
            (job,) = bundles(Path(b.runs_dir).parent / f"g{time.time_ns()}", 1)
            assert b.gpus_for(job) == gpus_for_job(job.manifest.base_model, job.job.prime_rl.seq_len).gpus
            assert b._payload(job)["_gpus"] == b.gpus_for(job)
    finally:
        sky.close()


def test_options_are_typed_and_a_missing_sdk_says_how_to_install(tmp_path, monkeypatch):
    from ait_env.backends import BackendOptionsError

    with pytest.raises(BackendOptionsError, match="endpoint_id: unknown option"):
        make_backend(settings(endpoint_id="x"), tmp_path)
    monkeypatch.setitem(sys.modules, "sky", None)    # as if the skypilot extra were not installed
    with pytest.raises(RuntimeError, match=r"pip install -e '\.\[skypilot\]'"):
        make_backend(settings(), tmp_path)


# ---------------------------------------------------------------------------------------------- happy path
def run_all(b: SkypilotBackend, jobs: list[Any], timeout: float = 60) -> list[Any]:
    handles = [b.submit(j) for j in jobs]
    return [b.wait(h, timeout=timeout) for h in handles]


def test_jobs_complete_exactly_once_with_pod_priced_bills(tmp_path):
    sky = fake(3, job_s=0.3)
    jobs = bundles(tmp_path, 6)
    try:
        with backend(tmp_path, sky, gpus_per_job=1) as b:
            results = run_all(b, jobs)
            rows, spent = b.journal.rows(), b.spent_usd()
            costs = b.run_costs()
        again = bundles(tmp_path / "again", 1)[0]            # identical content: served from the journal
        with backend(tmp_path, sky, gpus_per_job=1) as b:
            served = b.run(again)
    finally:
        sky.close()
    assert [r.status for r in results] == ["succeeded"] * 6, [(r.status, r.error) for r in results]
    assert sky.launches() == 6 and len(rows) == 6 and all(sky.runs_of(i) == 1 for i in sky.jobs_by_id)
    rate = prices.pod_price_per_s("NVIDIA RTX A5000")
    for r, row in zip(results, rows):
        assert r.timings["skypilot_attempts"] == 1
    assert spent == pytest.approx(sum(r.cost_usd for r in results))
    # each 1-GPU job pays its share, one GPU, though its (2-GPU) worker reports two: SkyPilot may run another
    # 1-GPU job on the other (test_skypilots_api_server_accepts_the_pool_and_places_1_and_2_gpu_jobs_...)
    assert spent == pytest.approx(sum(round(max(1, -(-row.execution_time_ms // 1000)) * rate * 1, 6)
                                      for row in rows), rel=1e-6)
    assert all(row.gpus_per_worker == 1 for row in rows)
    assert costs.idle == pytest.approx(6 * 181 * rate * 1, rel=1e-6)
    assert served.cache_hit and served.cost_usd == 0 and sky.launches() == 6


def test_a_job_is_billed_for_its_share_of_its_worker():
    """Its GPUs: what it was launched with, else what its worker reports visible to it (an adopted attempt),
    else the whole worker; never more than a worker has; the GPU type the worker reports prices them."""
    from fleet.skypilot_engine import SkyJobStatus, SkypilotEngine

    opts = SkypilotOptions.model_validate({**settings().options, "pool": {"gpus_per_worker": 2}})
    eng = SkypilotEngine(opts, sdk=SkySDK(SimpleNamespace()))
    eng._job_gpus["7"] = 1
    a5000, l40s = prices.pod_price_per_s("NVIDIA RTX A5000"), prices.pod_price_per_s("NVIDIA L40S")
    two = {"gpus": ["NVIDIA L40S (46068 MiB)", "NVIDIA L40S (46068 MiB)"]}
    st = SkyJobStatus(id="7", status="COMPLETED", execution_time_ms=100_500, worker_id="ait-workers-1")
    assert eng.bill(st, two).cost_usd == pytest.approx(101 * l40s * 1, abs=1e-6)           # launched with 1 of 2
    adopted = SkyJobStatus(id="8", status="COMPLETED", execution_time_ms=100_000, worker_id="ait-workers-1")
    assert eng.bill(adopted, {"gpus": two["gpus"][:1]}).cost_usd == pytest.approx(100 * l40s, abs=1e-6)
    assert eng.bill(adopted, None).cost_usd == pytest.approx(100 * a5000 * 2, abs=1e-6)     # nothing known: the worker
    assert eng.bill(adopted, {"gpus": two["gpus"] * 3}).gpus_per_worker == 2      # never over a worker
    assert eng.bill(adopted, None).idle_usd == pytest.approx(181 * a5000 * 2, abs=1e-6)


def test_closing_the_backend_says_the_pool_keeps_billing_and_how_to_stop_it(tmp_path, caplog):
    import logging

    sky = fake(1)
    try:
        with caplog.at_level(logging.INFO, logger="fleet.dispatch"):
            with backend(tmp_path, sky):
                pass
    finally:
        sky.close()
    said = "\n".join(r.getMessage() for r in caplog.records)
    assert "pool ait-workers stays up after this run" in said and "python -m fleet.pool down" in said
    assert "python -m fleet.reconcile_pool --runs-dir" in said                    # not Runpod's reconcile
    assert f"--runs-dir {tmp_path / 'runs'} --correct" in said and "jobs controller" in said


# ---------------------------------------------------------------------------------------------- faults
def test_the_hidden_evals_seeds_go_as_task_secrets_not_envs(tmp_path, monkeypatch):
    # a seed no base64 blob of the envs holds by chance ("123" once matched a bundle's encoding in CI)
    monkeypatch.setenv("AIT_SECRETS_JSON", '{"arithmetic": 918273645546372819}')
    sky = fake(1)
    try:
        with backend(tmp_path, sky) as b:
            (r,) = run_all(b, bundles(tmp_path, 1))
    finally:
        sky.close()
    (job,) = sky.jobs_by_id.values()
    assert r.status == "succeeded" and job.config["secrets"] == {"AIT_SECRETS_JSON": '{"arithmetic": 918273645546372819}'}
    assert "918273645546372819" not in json.dumps(job.config["envs"])


def test_a_worker_lost_mid_job_is_recovered_by_skypilot_in_one_attempt(tmp_path):
    sky = fake(2, job_s=0.6)
    sky.kill_next(1, after_s=0.2, recover=True)
    try:
        with backend(tmp_path, sky) as b:
            (r,) = run_all(b, bundles(tmp_path, 1))
    finally:
        sky.close()
    (job,) = sky.jobs_by_id.values()
    assert r.status == "succeeded" and job.recovery_count == 1 and job.runs == 2
    assert r.timings["skypilot_attempts"] == 1 and sky.launches() == 1
    assert r.timings["skypilot_execution_s"] >= 0.7      # both runs' pod time is billed


def test_a_worker_lost_without_recovery_is_retried_by_the_backend(tmp_path):
    sky = fake(2, job_s=0.6)
    sky.kill_next(1, after_s=0.2, recover=False)
    try:
        with backend(tmp_path, sky) as b:
            h = b.submit(bundles(tmp_path, 1)[0])
            r = b.wait(h, timeout=60)
            row = b.journal.get(h.meta["key"], history=True)
    finally:
        sky.close()
    assert r.status == "succeeded" and sky.launches() == 2
    assert [a["status"] for a in row.history] == ["failed", "completed"]
    assert "cluster was lost" in row.history[0]["error"]
    assert r.cost_usd > 0 and r.timings["skypilot_attempts"] == 2


def test_a_pool_that_cannot_scale_ends_jobs_infra_failed_unpaid_and_cancelled(tmp_path):
    sky = fake(2)
    sky.set_capacity(0)
    try:
        with backend(tmp_path, sky, deadline_s=0.5, retry_budget=1) as b:
            (r,) = run_all(b, bundles(tmp_path, 1))
    finally:
        sky.close()
    assert r.status == "infra_failed" and "deadline" in r.error and r.cost_usd == 0
    assert sky.launches() == 2 and {j.status for j in sky.jobs_by_id.values()} == {"CANCELLED"}


def test_a_lost_launch_answer_is_found_by_name_and_not_sent_twice(tmp_path):
    sky = fake(2)
    sky.lose_launch_answers(1)
    try:
        with backend(tmp_path, sky) as b:
            (r,) = run_all(b, bundles(tmp_path, 1))
    finally:
        sky.close()
    assert r.status == "succeeded" and sky.launches() == 1


def test_an_unreachable_api_server_is_retried_as_a_new_attempt(tmp_path):
    sky = fake(2)
    sky.refuse_connection(1)
    try:
        with backend(tmp_path, sky) as b:
            h = b.submit(bundles(tmp_path, 1)[0])
            r = b.wait(h, timeout=60)
            row = b.journal.get(h.meta["key"], history=True)
    finally:
        sky.close()
    assert r.status == "succeeded" and sky.launches() == 1
    assert [a["status"] for a in row.history] == ["failed", "completed"] and "sky api info" in row.history[0]["error"]


def test_budget_exhaustion_refuses_jobs_before_they_are_launched(tmp_path):
    sky = fake(2)
    try:
        with backend(tmp_path, sky, run_budget_usd=0.01) as b:
            (r,) = run_all(b, bundles(tmp_path, 1))
    finally:
        sky.close()
    assert r.status == "infra_failed" and "run budget exceeded" in r.error and sky.launches() == 0


def test_an_orchestrator_killed_mid_batch_is_replaced_and_nothing_is_lost_or_paid_twice(tmp_path):
    """Orchestrator A launches 6 jobs and dies (its threads stop, its session is never closed: its heartbeat
    goes stale); B on the same run dir adopts every job in flight by id, records each result once, and the
    same bundles submitted to B are served or attached, never launched again."""
    sky = fake(2, job_s=1.0)
    jobs = bundles(tmp_path, 6)
    try:
        a = backend(tmp_path, sky, owner_stale_s=1.0)
        for j in jobs:
            a.submit(j)
        t0 = time.time()
        while sky.launches() < 6 and time.time() - t0 < 30:
            time.sleep(0.05)
        a.dispatch._stop.set()                       # killed: no close, no more beats or polls
        a.dispatch._wake.set()
        time.sleep(1.5)
        with backend(tmp_path, sky, owner_stale_s=1.0) as b:
            results = run_all(b, jobs, timeout=60)
            rows, spent = b.journal.rows(), b.spent_usd()
    finally:
        sky.close()
    assert [r.status for r in results] == ["succeeded"] * 6, [(r.status, r.error) for r in results]
    assert sky.launches() == 6 and len(rows) == 6 and all(sky.runs_of(i) == 1 for i in sky.jobs_by_id)
    assert all(row.attempt == 1 for row in rows)
    assert spent == pytest.approx(sum(row.cost_usd for row in rows)) and spent > 0


#: the orchestrator as its own process: a SkypilotBackend whose SDK is the test's fake, reached over a
#: multiprocessing manager (the fake's pool and queue live in the test process, as SkyPilot's live in its
#: API server); it submits the bundles and waits to be killed
ORCHESTRATOR = """
import sys, time
from multiprocessing.managers import BaseManager
from pathlib import Path
from ait_env.backends.skypilot import SkypilotBackend
from ait_env.jobs.bundle import JobBundle
from ait_env.jobs.settings import BackendSettings

class Manager(BaseManager):
    pass

Manager.register("sdk")
host, port, key = sys.argv[3].split(":")
m = Manager(address=(host, int(port)), authkey=key.encode())
m.connect()
settings = BackendSettings.model_validate_json(Path(sys.argv[1]).read_text())
b = SkypilotBackend(settings, sys.argv[2], show_progress=False, sdk=m.sdk())
for path in sys.argv[4:]:
    b.submit(JobBundle.load(Path(path)))
print("submitted", flush=True)
time.sleep(600)
"""


def serve_sdk(sdk: SkySDK) -> str:
    """Serve ``sdk`` to child processes over a multiprocessing manager on 127.0.0.1 (as SkyPilot's pool and
    queue live in its API server); ``host:port:authkey`` for :data:`ORCHESTRATOR`."""
    import secrets
    import threading
    from multiprocessing.managers import BaseManager

    class Manager(BaseManager):
        pass

    Manager.register("sdk", callable=lambda: sdk)
    key = secrets.token_hex(8)
    server = Manager(address=("127.0.0.1", 0), authkey=key.encode()).get_server()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host, port = server.address
    return f"{host}:{port}:{key}"


def test_an_orchestrator_process_sigkilled_mid_batch_loses_nothing_and_pays_nothing_twice(tmp_path):
    """The orchestrator runs as a child process and is SIGKILLed once SkyPilot has all six launches (two
    workers: most jobs still queued or running, none journaled as ended by it). A new orchestrator on the same
    run dir adopts every attempt by its recorded id (the journal row written before each launch, its id
    after) or, where the kill came before the id was recorded, by the job's name; the same bundles are served
    or attached, never launched again."""
    import os
    import signal

    sky = fake(2, job_s=1.0)
    address = serve_sdk(SkySDK(sky))
    jobs = bundles(tmp_path, 6)
    cfg = tmp_path / "settings.json"
    cfg.write_text(settings(owner_stale_s=1.0).model_dump_json())
    child = subprocess.Popen([sys.executable, "-c", ORCHESTRATOR, str(cfg), str(tmp_path / "runs"),
                              address, *[str(j.root) for j in jobs]],
                             stdout=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        t0 = time.time()
        while sky.launches() < 6 and time.time() - t0 < 60 and child.poll() is None:
            time.sleep(0.02)
        assert sky.launches() == 6, f"the orchestrator launched {sky.launches()} of 6 (exit {child.poll()})"
        # some launches' ids may not be journaled yet (written just after each launch returns): the next
        # orchestrator finds those by their names (test_an_orchestrator_killed_between_launch_and_recording...)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        unfinished = [i for i, j in sky.jobs_by_id.items() if j.status not in ("SUCCEEDED",)]
        assert unfinished, "every job had ended before the kill: the test no longer kills mid-batch"
        time.sleep(1.2)                                       # its heartbeat goes stale (owner_stale_s=1.0)
        with backend(tmp_path, sky, owner_stale_s=1.0) as b:
            results = run_all(b, jobs, timeout=60)
            rows, spent = b.journal.rows(), b.spent_usd()
    finally:
        if child.poll() is None:
            child.kill()
        sky.close()
    assert [r.status for r in results] == ["succeeded"] * 6, [(r.status, r.error) for r in results]
    assert sky.launches() == 6 and len(rows) == 6 and all(sky.runs_of(i) == 1 for i in sky.jobs_by_id)
    assert all(row.attempt == 1 for row in rows)
    assert spent == pytest.approx(sum(row.cost_usd for row in rows)) and spent > 0


#: the orchestrator as its own process whose launch reaches SkyPilot and never returns: it prints "launched"
#: and hangs there, so the test kills it after the launch and before the journal has the job's id
LAUNCH_THEN_HANG = ORCHESTRATOR.replace("sdk=m.sdk())", "sdk=Hangs(m.sdk()))").replace(
    "settings = BackendSettings", """class Hangs:
    def __init__(self, sdk):
        self.sdk = sdk
    def __getattr__(self, name):
        return getattr(self.sdk, name)
    def launch(self, *args, **kwargs):
        self.sdk.launch(*args, **kwargs)
        print("launched", flush=True)
        time.sleep(600)

settings = BackendSettings""")


def test_an_orchestrator_killed_between_launch_and_recording_the_id_is_found_by_its_name(tmp_path):
    """SIGKILL after ``sky.jobs.launch`` reached SkyPilot and before the journal recorded the job's id. The next
    orchestrator adopts the attempt (sent, no id), finds the managed job by the name its tag gave it
    (``ait-<tag>``), follows it to its end and bills what it ran: one launch, one run, no bound charged (on
    Runpod, which cannot list jobs, the same attempt is charged at its bound: test_runpod_faults.py)."""
    import os
    import signal

    from ait_env.jobs.bundle import JobBundle

    sky = fake(1, job_s=0.5)
    address = serve_sdk(SkySDK(sky))
    (job,) = bundles(tmp_path, 1)
    cfg = tmp_path / "settings.json"
    cfg.write_text(settings(owner_stale_s=1.0).model_dump_json())
    child = subprocess.Popen([sys.executable, "-c", LAUNCH_THEN_HANG, str(cfg), str(tmp_path / "runs"),
                              address, str(job.root)],
                             stdout=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert child.stdout is not None
        lines = [child.stdout.readline().strip() for _ in range(2)]
        assert "launched" in lines, lines
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        from fleet.journal import Journal
        from fleet.skypilot_engine import JOURNAL_NAME

        (before,) = Journal(tmp_path / "runs" / JOURNAL_NAME).rows()
        assert before.job_id is None and sky.launches() == 1   # sent, its id never recorded
        time.sleep(1.2)                                        # its heartbeat goes stale (owner_stale_s=1.0)
        with backend(tmp_path, sky, owner_stale_s=1.0) as b:
            r = b.run(JobBundle.load(job.root), timeout=60)
            row = b.journal.get(b._key(job), history=True)
            spent = b.spent_usd()
    finally:
        if child.poll() is None:
            child.kill()
        sky.close()
    assert r.status == "succeeded", r.error
    assert sky.launches() == 1 and all(sky.runs_of(i) == 1 for i in sky.jobs_by_id)
    assert row.attempt == 1 and row.job_id == str(next(iter(sky.jobs_by_id)))
    assert not any(h.get("estimated") for h in row.history) and spent == pytest.approx(r.cost_usd) and spent > 0


# ---------------------------------------------------------------------------------------------- real jobs
def _real(tmp_path: Path, n: int, workers: int) -> None:
    """``n`` distinct real jobs (the tiny model, the local executor) through ``workers`` fake pool workers that
    run the job's real ``run`` command (``python -m gpu.worker --request-env``): each completes exactly once
    and equals ``python -m ait_env.runner`` (backend=local) on the same bundle."""
    from ait_env.hidden.baselines import BaselineEntry, BaselineStore
    from cpu.tiny_models.catalog import weights_hash
    from tests.backends.test_runpod_backend import _real_settings
    from tests.gpu.helpers import local_settings, make_job, needs_tiny_model, worker_env

    if needs_tiny_model.args[0]:
        pytest.skip("ait-tiny-s is not built (python -m cpu.tiny_models.build)")
    pytest.importorskip("verifiers")
    env = worker_env(tmp_path)
    jobs = [make_job(tmp_path / "sp", job_id=f"sp-{i:02d}", seed=1000 + i) for i in range(n)]
    rp = _real_settings()
    cfg = settings(**{**{k: v for k, v in rp.options.items() if k in SkypilotOptions.model_fields},
                      "poll_interval_s": 0.5, "gpus_per_job": 1})
    cfg = cfg.model_copy(update={"models": rp.models, "bounds": rp.bounds})
    sky = FakeSky(workers, worker_env=env)
    t0 = time.time()
    try:
        with SkypilotBackend(cfg, tmp_path / "runs", show_progress=False, sdk=SkySDK(sky)) as b:
            b.baselines.put([BaselineEntry(backend="skypilot", family="arithmetic", model="ait-tiny-s", score=0.1,
                                           model_hash=weights_hash("ait-tiny-s"), seeded_at=1.0)])
            results = run_all(b, jobs, timeout=1800)
            spent, rows = b.journal.spent_usd(), b.journal.rows()
    finally:
        sky.close()
    fleet_s = time.time() - t0
    assert [r.status for r in results] == ["succeeded"] * n, [r.error for r in results]
    assert sky.launches() == n and len(rows) == n and all(sky.runs_of(i) == 1 for i in sky.jobs_by_id)
    assert sum(r.cost_usd for r in results) == pytest.approx(spent) and spent > 0
    pins = tmp_path / "pins"
    BaselineStore("local", user_dir=pins).put([BaselineEntry(
        backend="local", family="arithmetic", model="ait-tiny-s", score=0.1,
        model_hash=weights_hash("ait-tiny-s"), seeded_at=1.0)])
    (tmp_path / "local.json").write_text(local_settings(measure_pre=False).model_dump_json())
    for job, res in zip(jobs, results):
        twin = make_job(tmp_path / "local", job_id=job.job_id, seed=1000 + int(job.job_id[3:]))
        out = subprocess.run([sys.executable, "-m", "ait_env.runner", str(twin.root), "--backend-settings",
                              str(tmp_path / "local.json"), "--baselines-dir", str(pins), "--no-progress"],
                             env=env, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
        assert out.returncode == 0, out.stderr[-2000:]
        ref = json.loads((twin.root / "result.json").read_text())
        assert (res.post_score, res.post_ci95) == (ref["post_score"], ref["post_ci95"]), job.job_id
        assert res.curves["train_reward"] == pytest.approx(ref["curves"]["train_reward"], rel=1e-12, abs=1e-15)
    print(f"{n} real jobs through {workers} fake SkyPilot pool workers: {fleet_s:.0f} s; billed ${spent:.4f}")


@pytest.mark.slow  # twin in the default run: a baseline through a pool worker running the real worker (below)
def test_two_real_jobs_through_two_pool_workers_match_backend_local(tmp_path):
    _real(tmp_path, 2, 2)


@pytest.mark.slow
def test_twenty_real_jobs_through_four_pool_workers_match_backend_local(tmp_path):
    _real(tmp_path, 20, 4)


def test_a_baseline_is_measured_through_a_pool_worker_as_seed_baselines_does(tmp_path):
    """``SkypilotBackend.measure_baseline`` (what ``scripts/seed_baselines.py backend=skypilot`` calls per model):
    a ``kind: baseline`` request through a fake pool worker running the real worker (8 hidden questions)."""
    from tests.backends.test_runpod_backend import _real_settings
    from tests.gpu.helpers import needs_tiny_model, worker_env

    if needs_tiny_model.args[0]:
        pytest.skip("ait-tiny-s is not built (python -m cpu.tiny_models.build)")
    pytest.importorskip("verifiers")
    rp = _real_settings()
    cfg = settings(**{**{k: v for k, v in rp.options.items() if k in SkypilotOptions.model_fields},
                      "poll_interval_s": 0.5, "gpus_per_job": 1})
    cfg = cfg.model_copy(update={"models": rp.models, "bounds": rp.bounds})
    sky = FakeSky(1, worker_env=worker_env(tmp_path))
    try:
        with SkypilotBackend(cfg, tmp_path / "runs", show_progress=False, sdk=SkySDK(sky)) as b:
            entry = b.measure_baseline("arithmetic", "ait-tiny-s")
            spent = b.spent_usd()
    finally:
        sky.close()
    assert (entry.family, entry.model, entry.n) == ("arithmetic", "ait-tiny-s", 8) and sky.launches() == 1
    assert spent > 0


def test_seed_baselines_accepts_backend_skypilot(tmp_path):
    """The script composes backend=skypilot and builds the backend; here, without the extra, it stops on
    the missing SDK with the install hint (with it, it measures through the pool as the test above)."""
    import importlib.util

    if importlib.util.find_spec("sky") is not None:
        pytest.skip("skypilot is installed here: the script would try a real API server")
    out = subprocess.run([sys.executable, "scripts/seed_baselines.py", "backend=skypilot", "families=arithmetic",
                          f"env.runs_dir={tmp_path / 'runs'}"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, check=False)
    assert out.returncode != 0 and "pip install -e '.[skypilot]'" in out.stderr, out.stderr[-2000:]
