"""fleet.runpod_api against the fake Runpod (tests/gpu/fake_runpod.py): the job API, retries and their
budget, error messages, expired results, endpoint management, and a real job through two worker
processes running the local tiny-model executor."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator

import pytest

from fleet.runpod_api import ResultExpired, RetryPolicy, RunpodAPIError, ServerlessClient, SubmitUncertain
from fleet.runpod_management import EndpointSpec, ManagementClient, delete_endpoint, upsert_endpoint
from tests.gpu.fake_runpod import FakeRunpod, fakes, start_fake_runpod
from tests.gpu.helpers import local_settings, make_job, needs_tiny_model, worker_env

@pytest.fixture
def fake_runpod() -> Iterator[Callable[..., FakeRunpod]]:
    with fakes() as make:
        yield make


FAST = RetryPolicy(attempts=4, max_seconds=5.0, base_s=0.01, cap_s=0.05)


def client(fake: FakeRunpod, retry: RetryPolicy = FAST, key: str | None = None) -> ServerlessClient:
    return ServerlessClient(fake.endpoint_id, key or fake.api_key, base_url=fake.job_base_url, retry=retry)


def test_run_status_health_purge_cancel_on_queued_jobs(fake_runpod):
    fake = fake_runpod()          # no workers: jobs stay queued
    with client(fake) as c:
        a, b, d = (c.run({"n": i}) for i in range(3))
        job = c.status(a)
        assert job.id == a and job.status == "IN_QUEUE" and not job.final and job.delay_time_ms is None
        assert c.health()["jobs"]["inQueue"] == 3 and c.health()["workers"] == {"idle": 0, "running": 0}
        assert c.cancel(a).status == "CANCELLED" and c.status(a).final
        assert c.purge_queue() == {"removed": 2, "status": "completed"}
        assert c.status(b).status == c.status(d).status == "CANCELLED"
        assert c.health()["jobs"]["inQueue"] == 0
        assert c.stream(b) == []


def test_instant_jobs_complete_with_times_worker_and_output(fake_runpod):
    fake = fake_runpod(instant=True)
    with client(fake) as c:
        ids = [c.run({"n": i}, execution_timeout_s=60, ttl_s=3600) for i in range(20)]
        jobs = c.status_many(ids + ids[:1])
        assert list(jobs) == ids
        for j in jobs.values():
            assert not isinstance(j, RunpodAPIError)
            assert j.status == "COMPLETED" and j.output["result"]["status"] == "succeeded"
            assert j.delay_time_ms == 0 and j.execution_time_ms == 0 and j.worker_id == "fake-worker-0"


def test_retry_requeues_a_failed_job_under_its_id(fake_runpod):
    fake = fake_runpod()
    with client(fake) as c:
        jid = c.run({})
        with pytest.raises(RunpodAPIError, match="only FAILED or TIMED_OUT") as e:
            c.retry(jid)
        assert e.value.status == 400
        with fake.cond:
            fake.jobs[jid].status, fake.jobs[jid].error = "FAILED", "boom"
        again = c.retry(jid)
        assert again.id == jid and again.status == "IN_QUEUE" and c.status(jid).error is None


def test_429_is_retried_after_retry_after_then_succeeds(fake_runpod):
    fake = fake_runpod(instant=True)
    fake.fail_next("status", 429, count=2, retry_after=0.3)
    fake.fail_next("run", 429, count=1, retry_after=0.2)
    with client(fake) as c:
        t = time.monotonic()
        jid = c.run({})                                     # a 429 queued nothing: safe to resend
        assert c.status(jid).status == "COMPLETED"
        assert time.monotonic() - t >= 0.8                 # 0.2 + 0.3 + 0.3: Retry-After honoured


def test_5xx_is_retried_within_the_budget_then_a_clear_error(fake_runpod):
    fake = fake_runpod(instant=True)
    with client(fake) as c:
        jid = c.run({})
        fake.fail_next("status", 503, count=3)
        assert c.status(jid).status == "COMPLETED"          # 3 failures, 4 attempts
        fake.fail_next("health", 500, count=10)
        with pytest.raises(RunpodAPIError, match="HTTP 500.*server error past the retry budget") as e:
            c.health()
        assert e.value.status == 500 and fake._injected("health") == (500, None)   # 4 of 10 were used
    slow = RetryPolicy(attempts=50, max_seconds=0.5, base_s=0.2, cap_s=0.2)
    fake.fail_next("status", 502, count=100)
    with client(fake, retry=slow) as c:
        t = time.monotonic()
        with pytest.raises(RunpodAPIError, match="HTTP 502"):
            c.status(jid)
        assert time.monotonic() - t < 1.0                    # the seconds budget, not the 50 attempts


def test_a_5xx_on_run_is_uncertain_not_resent(fake_runpod):
    fake = fake_runpod()
    fake.fail_next("run", 500, count=1)
    with client(fake) as c:
        with pytest.raises(SubmitUncertain, match="may be queued"):
            c.run({})
        assert fake._injected("run") is None                 # sent once: no second job could be queued
        fake.fail_next("run", 500, count=1)
        assert c.run({}, retry_ambiguous=True)               # the caller accepts a possible duplicate


def test_401_says_to_check_the_key_and_no_key_is_refused(fake_runpod):
    fake = fake_runpod(instant=True)
    with client(fake, key="rp-wrong-key-000000") as c:
        with pytest.raises(RunpodAPIError, match="HTTP 401.*check RUNPOD_API_KEY") as e:
            c.run({})
        assert e.value.status == 401 and "rp-wrong-key" not in str(e.value)
    with pytest.raises(RunpodAPIError, match="set RUNPOD_API_KEY"):
        ServerlessClient("ep", "", base_url=fake.job_base_url)


def test_connection_refused_is_retried_then_reported():
    c = ServerlessClient("ep", "k", base_url="http://127.0.0.1:9", retry=FAST)
    with pytest.raises(RunpodAPIError, match="cannot connect") as e:
        c.health()
    assert e.value.status == 0


def test_an_expired_result_is_resultexpired(fake_runpod):
    fake = fake_runpod(instant=True, result_ttl_s=0.3)
    with client(fake) as c:
        kept, early, ttl = c.run({}), c.run({}), c.run({}, ttl_s=0.2)
        fake.expire(early)
        with pytest.raises(ResultExpired, match="expired"):
            c.status(early)
        time.sleep(0.8)
        for jid in (kept, ttl):
            with pytest.raises(ResultExpired) as e:
                c.status(jid)
            assert e.value.status == 404
        assert isinstance(c.status_many([kept])[kept], ResultExpired)


def test_a_stuck_job_stays_queued_and_fifo_order_holds(fake_runpod):
    fake = fake_runpod(instant=True)
    fake.stick_next(1)
    with client(fake) as c:
        stuck, ok = c.run({}), c.run({})
        time.sleep(0.2)
        assert c.status(stuck).status == "IN_QUEUE" and c.status(ok).status == "COMPLETED"


# ------------------------------------------------------------------------------------------ management
SPEC = EndpointSpec(name="ait-worker-test", image="registry.example/ait-worker:abc123",
                    gpu_type_ids=["AMPERE_24", "ADA_24"], gpu_count=2, workers_min=1, workers_max=4,
                    idle_timeout_s=60, execution_timeout_s=7200,
                    env={"AIT_SECRETS_JSON": "{{ RUNPOD_SECRET_ait_seeds }}", "AIT_EXECUTOR": "gpu"})


def test_endpoint_spec_refuses_secret_values():
    with pytest.raises(ValueError, match="Runpod secret reference"):
        EndpointSpec.model_validate({**SPEC.model_dump(), "env": {"HF_TOKEN": "hf_x"}})
    with pytest.raises(ValueError):
        EndpointSpec.model_validate({**SPEC.model_dump(), "gpu_type_ids": ["A", "B", "C", "D"]})


def test_create_update_find_and_delete_an_endpoint(fake_runpod):
    fake = fake_runpod(scale_down_s=0.3)
    with ManagementClient(fake.api_key, base_url=fake.rest_base_url, retry=FAST) as m:
        ep, created = upsert_endpoint(m, SPEC)
        assert created and ep["name"] == SPEC.name and ep["gpu"]["pools"] == ["AMPERE_24", "ADA_24"]
        assert ep["gpu"]["count"] == 2 and ep["workers"] == {"min": 1, "max": 4, "idleTimeout": 60}
        assert ep["timeout"] == 7_200_000 and ep["flashboot"] == "FLASHBOOT" and ep["type"] == "QUEUE"
        ep2, created = upsert_endpoint(m, SPEC.model_copy(update={"workers_max": 8}))
        assert not created and ep2["id"] == ep["id"] and ep2["workers"]["max"] == 8
        assert m.find(SPEC.name)["id"] == ep["id"] and m.workers(ep["id"])["summary"]["total"] == 1
        t = time.monotonic()
        delete_endpoint(m, ep["id"], poll_s=0.05)
        assert time.monotonic() - t >= 0.3                  # waited for the worker to go
        assert m.find(SPEC.name) is None and m.list_endpoints() == []
        with pytest.raises(RunpodAPIError, match="HTTP 404"):
            m.get(ep["id"])


def test_a_body_the_api_rejects_is_a_clear_error(fake_runpod):
    fake = fake_runpod()
    with ManagementClient(fake.api_key, base_url=fake.rest_base_url, retry=FAST) as m:
        with pytest.raises(RunpodAPIError, match="HTTP 400.*additional properties 'bogus'"):
            m._http.request("POST", "/serverless", json={**SPEC.body(), "bogus": 1})


# --------------------------------------------------------------------------------------- real workers
@pytest.mark.slow  # the default suite keeps a real job through the real handler (tests/backends/test_runpod_backend.py)
@needs_tiny_model
def test_a_real_job_runs_through_two_worker_processes(tmp_path):
    """A tiny-model job goes through the queue to a worker process that runs gpu.runpod_handler.handle_input. The
    first worker to take it is SIGKILLed mid-job with its whole tree: the queue retries the job (as
    Runpod's automatic retry), and it completes on a worker whose results carry other versions (a
    non-replica). Progress shows while it runs; a bad input FAILs; stopping the fake leaves no process."""
    pytest.importorskip("verifiers")
    from ait_env.jobs.wire import pack_bundle

    b = make_job(tmp_path)
    payload = {"executor": "local", "settings": local_settings(measure_pre=False).model_dump(mode="json"),
               "bundle": pack_bundle(b.root)}
    with start_fake_runpod(workers=2, worker_env=worker_env(tmp_path), log_dir=tmp_path) as fake:
        first_trees = [w.tree for w in fake.workers]
        for i in range(2):
            fake.skew_versions(i, {"ait-env": "0.0.0+other"})
        fake.kill_next(1, after_s=4.0)
        with client(fake) as c:
            jid = c.run(payload)                             # FIFO: the first take, the one killed
            bad = c.run({"kind": "job"})                     # no settings: the worker raises -> FAILED
            seen: list[str] = []
            deadline = time.monotonic() + 400
            while time.monotonic() < deadline:
                job = c.status(jid)
                if job.progress:
                    seen.append(str(job.progress))
                if job.final:
                    break
                time.sleep(0.2)
            logs = "".join(p.read_text()[-1500:] for p in tmp_path.glob("worker-*.log"))
            assert job.status == "COMPLETED", (job, logs)
            assert job.output["result"]["status"] == "succeeded", job.output["result"]["error"]
            assert job.output["result"]["worker"]["versions"]["ait-env"] == "0.0.0+other"
            assert job.worker_id in ("fake-worker-0", "fake-worker-1") and job.execution_time_ms > 0
            assert seen and all(s.startswith("[") for s in seen)
            assert c.health()["jobs"]["retried"] == 1
            failed = c.status(bad)
            assert failed.status == "FAILED" and "ValidationError" in failed.error
            now = [w.tree for w in fake.workers]
            killed = [t for t in first_trees if all(t is not n for n in now)]
            assert len(killed) == 1 and not killed[0].alive()     # the killed worker left nothing
            trees = [w.tree for w in fake.workers]
    assert not any(t.alive() for t in trees)


# ------------------------------------------------------------------------------------ python -m fleet.endpoint
def test_endpoint_cli_up_status_down(fake_runpod, tmp_path, monkeypatch, capsys):
    from fleet import endpoint

    fake = fake_runpod(scale_down_s=0.2)
    cfg = tmp_path / "ep.yaml"
    cfg.write_text("name: ait-cli-test\nworkers_min: 1\ngpu_type_ids: [AMPERE_48]\n")
    urls = ["--config", str(cfg), "--rest-url", fake.rest_base_url, "--job-url", fake.job_base_url]
    monkeypatch.delenv("RUNPOD_API_KEY", raising=False)
    with pytest.raises(SystemExit, match="RUNPOD_API_KEY is not set"):
        endpoint.main(["status", *urls])
    monkeypatch.setenv("RUNPOD_API_KEY", fake.api_key)
    assert endpoint.main(["up", *urls]) == 2 and "no image" in capsys.readouterr().err
    assert endpoint.main(["up", *urls, "--image", "reg.example/ait-worker:abc"]) == 0
    out = capsys.readouterr().out
    assert "created endpoint" in out and "AMPERE_48" in out
    assert endpoint.main(["status", *urls, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    # 1 active worker x 2 GPUs x $0.00034/s x 3600 s (fleet/prices.py; the active rate is the flex one)
    assert info["idle_usd_per_hour"] == pytest.approx(2.448) and "one price since 2026-05-13" in info["idle_cost_basis"]
    assert info["max_usd_per_hour"] == pytest.approx(12 * 2 * 0.00034 * 3600, rel=1e-3)
    # the rest from fleet/fleet_defaults.yaml (the simulator's pick) and fleet/endpoint.yaml
    assert info["workers_min"] == 1 and info["workers_max"] == 12 and info["gpus_per_worker"] == 2
    assert info["workers"]["total"] == 1 and info["queue"]["jobs"]["inQueue"] == 0
    assert info["execution_timeout_s"] == 7200 and info["idle_timeout_s"] == 5
    assert endpoint.main(["down", *urls, "--poll-s", "0.05"]) == 0
    assert "no longer listed" in capsys.readouterr().out and not fake.endpoints
    assert endpoint.main(["down", *urls]) == 0 and "nothing to remove" in capsys.readouterr().out


def test_down_refuses_to_leave_workers_behind_silently(fake_runpod, monkeypatch, capsys):
    from fleet import endpoint

    fake = fake_runpod(scale_down_s=60)
    monkeypatch.setenv("RUNPOD_API_KEY", fake.api_key)
    with ManagementClient(fake.api_key, base_url=fake.rest_base_url, retry=FAST) as m:
        ep = m.create(SPEC)
    rc = endpoint.main(["down", "--id", ep["id"], "--rest-url", fake.rest_base_url, "--wait-s", "0.3",
                        "--poll-s", "0.05"])
    assert rc == 1 and "still allocated" in capsys.readouterr().err
    assert ep["id"] in fake.endpoints and fake.endpoints[ep["id"]]["workers"]["max"] == 0


@pytest.mark.slow
@needs_tiny_model
def test_cancel_and_execution_timeout_stop_real_jobs(tmp_path):
    """A running job cancelled through the API and one past its executionTimeout both stop on the worker
    (the handler's cancel flag), and the freed worker then runs the next job to the end."""
    pytest.importorskip("verifiers")
    from ait_env.jobs.wire import pack_bundle

    slow = make_job(tmp_path, "job-slow", env_edit=lambda t: t.replace(
        "    dataset = build_dataset(num_examples, seed)\n", "    import time\n    time.sleep(300)\n"))
    ok = make_job(tmp_path, "job-ok")
    settings = local_settings(measure_pre=False).model_dump(mode="json")
    with start_fake_runpod(workers=1, worker_env=worker_env(tmp_path), log_dir=tmp_path) as fake:
        with client(fake) as c:
            a = c.run({"executor": "local", "settings": settings, "bundle": pack_bundle(slow.root)})
            b = c.run({"executor": "local", "settings": settings, "bundle": pack_bundle(slow.root)},
                      execution_timeout_s=8)
            d = c.run({"executor": "local", "settings": settings, "bundle": pack_bundle(ok.root)})
            fake.wait_for(a, {"IN_PROGRESS"}, timeout_s=60)
            time.sleep(3)
            assert c.cancel(a).status == "CANCELLED"
            assert fake.wait_for(b, timeout_s=120)["status"] == "TIMED_OUT"
            done = fake.wait_for(d, timeout_s=300)
            assert done["status"] == "COMPLETED" and done["output"]["result"]["status"] == "succeeded"
            assert c.status(a).status == "CANCELLED" and c.health()["jobs"]["retried"] == 0


@pytest.mark.parametrize("value, expected", [("3", 3.0), ("0.5", 0.5), ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),
                                             ("soon", None)])
def test_retry_after_in_seconds_or_an_http_date(value, expected):
    import httpx

    from fleet.runpod_api import _retry_after

    assert _retry_after(httpx.Response(429, headers={"Retry-After": value})) == expected


@pytest.mark.parametrize("raw, ms, problem", [
    (61_000, 61_000, ""), (61_000.2, 61_001, ""), ("61000", 61_000, ""), (None, None, ""),
    (-5, None, "negative"), ("about a minute", None, "not a number"), (float("nan"), None, "not finite"),
    (float("inf"), None, "not finite"), (True, None, "not a number"), ([1], None, "not a number"),
    ({"ms": 1}, None, "not a number"), (10 ** 400, 10 ** 400, ""), ("1e400", None, "not finite"),
])
def test_a_status_is_never_refused_for_its_billing_fields_and_unusable_ones_are_noted(raw, ms, problem) -> None:
    from fleet.billing import billing_problem
    from fleet.runpod_api import RunpodJob

    job = RunpodJob.model_validate({"id": "j", "status": "COMPLETED", "executionTime": raw, "delayTime": 1_000,
                                    "workerId": "w"})
    assert job.execution_time_ms == ms
    assert (problem in " ".join(job.billing_notes)) and bool(job.billing_notes) == bool(problem)
    why = billing_problem(job, bound_s=600)
    # a COMPLETED attempt without a usable executionTime is never billed as given (it was billed $0 before)
    assert bool(why) == (ms is None or ms > 601_000), why


def test_a_reported_time_longer_than_the_attempts_ttl_is_not_taken() -> None:
    from fleet.billing import billing_problem
    from fleet.runpod_api import RunpodJob

    ok = RunpodJob.model_validate({"id": "j", "status": "FAILED", "delayTime": 2_000, "executionTime": 590_000})
    assert billing_problem(ok, bound_s=600) == ""
    huge = RunpodJob.model_validate({"id": "j", "status": "COMPLETED", "delayTime": 2_000, "executionTime": 10 ** 15})
    assert "over the attempt's bound" in billing_problem(huge, bound_s=600)
    queued = RunpodJob.model_validate({"id": "j", "status": "CANCELLED"})   # no worker took it: nothing to bill
    assert billing_problem(queued, bound_s=600) == ""


def test_a_run_answered_late_is_not_abandoned_but_other_calls_keep_their_timeout():
    """Issue 47: /run queues the job and answers after the client's 0.2 s timeout (here 1 s, a real HTTP
    server on 127.0.0.1): run() waits up to run_timeout_s (by default Runpod's proxy limit, 100 s) for the
    answer and gets the id; a status call as slow still times out at the client's timeout, and a run answered
    later than run_timeout_s is SubmitUncertain (it may be queued)."""
    import http.server
    import threading

    queued: list[str] = []

    class Slow(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            time.sleep(1.0)
            if self.path.endswith("/run"):
                queued.append(f"job-{len(queued)}")
            body = json.dumps({"id": queued[-1] if queued else "none", "status": "IN_QUEUE"}).encode()
            try:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except OSError:
                pass   # the client gave up

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self._answer()

        def do_GET(self) -> None:  # noqa: N802
            self._answer()

        def log_message(self, *a: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v2"
    once = RetryPolicy(attempts=1, max_seconds=0.0)
    try:
        with ServerlessClient("ep1", "key", base_url=url, timeout_s=0.2, retry=once) as c:
            assert c.run_timeout_s == 100.0
            assert c.run({"n": 1}) == "job-0"                        # answered after 1 s: kept
            with pytest.raises(RunpodAPIError, match="no answer"):
                c.status("job-0")
        with ServerlessClient("ep1", "key", base_url=url, timeout_s=0.2, retry=once, run_timeout_s=0.2) as c, \
                pytest.raises(SubmitUncertain):
            c.run({"n": 2})
    finally:
        server.shutdown()
