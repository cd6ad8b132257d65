"""Issue 32: the runpod backend under faults never pays twice, never under-counts, never overruns a budget
and never blocks. One test (or two) per item of the issue, against the project's fakes
(tests/fakes/runpod_client.py in its time mode, tests/gpu/fake_runpod.py over HTTP); the money items
compare the journal with the fake's own bill (Runpod's rule). The budget items (3) are in
test_runpod_backend.py, the prices (4) in tests/fleet/test_prices.py; the property test over random fault
schedules is test_runpod_property.py. docs/fleet.md, "Guarantees under faults", names each."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from ait_env.backends.runpod import RunpodBackend
from ait_env.jobs.bundle import JobBundle
from tests.backends.test_runpod_backend import ROOT, backend, bundles, settings
from tests.fakes.runpod_client import FakeServerlessClient, bundle_job_id


def timed(**kw: Any) -> FakeServerlessClient:
    """The fake in time mode on the wall clock (the backend's default clock)."""
    return FakeServerlessClient(clock=time.time, **{"delay_ms": 50, "execution_ms": 300, **kw})


def by_creation(fake: FakeServerlessClient) -> list[dict[str, Any]]:
    return sorted(fake.store.all(), key=lambda j: j["created"])


def journal_covers_the_bill(b: RunpodBackend, fake: FakeServerlessClient) -> None:
    """Attempt by attempt, and in all: what the journal charged covers what the fake bills."""
    bills = fake.bills()
    charged = {a["job_id"]: a["cost_usd"] + a["idle_usd"] for a in b.journal.attempts() if a["job_id"]}
    tags = {a["tag"]: a["cost_usd"] + a["idle_usd"] for a in b.journal.attempts() if a["tag"]}
    for job in fake.store.all():
        mine = charged.get(job["id"], tags.get(job["tag"]))
        assert mine is not None, f"fake job {job['id']} ran with no journal attempt"
        assert mine >= bills[job["id"]] - 1e-9, (job["id"], mine, bills[job["id"]])
    costs = b.run_costs()
    assert costs.jobs + costs.idle >= fake.bill() - 1e-9


# ---------------------------------------------------------------------------------------------- item 1
def test_a_status_outage_is_not_a_lost_job_and_nothing_is_sent_again(tmp_path):
    """Item 1: /status answers 503 for 1.5 s while the job runs 0.35 s. The id is kept and read with backoff
    until it answers: one run on Runpod, no cancel, the journal's bill equals the fake's."""
    fake = timed()
    (job,) = bundles(tmp_path, 1)
    t0 = time.time()
    fake.outage("status", t0, t0 + 1.5)
    with backend(tmp_path, fake, poll_interval_s=0.02, deadline_s=30) as b:
        r = b.run(job, timeout=30)
        assert r.status == "succeeded", r.error
        assert fake.total_runs() == 1 and fake.calls["cancel"] == 0
        assert fake.calls["status"] >= 3                   # unreadable several times, and read again
        journal_covers_the_bill(b, fake)
        assert b.run_costs().estimated == 0                 # it was read in the end: nothing estimated


def test_an_attempt_unreadable_up_to_its_deadline_is_cancelled_before_it_is_sent_again(tmp_path):
    """Item 1: the outage outlasts the first attempt's deadline. That attempt is cancelled (and Runpod
    confirms) before the second is sent, and both are charged: the first, unread, up to its cancel and
    marked estimated."""
    (job,) = bundles(tmp_path, 1)
    fake = timed(timing=lambda inp, n: (0.05, 30.0 if n == 1 else 0.2))
    fake.outage_until_resend("status")   # outlasts the deadline however busy the machine (issue 46)
    with backend(tmp_path, fake, poll_interval_s=0.02, deadline_s=1.5) as b:
        r = b.run(job, timeout=30)
        row = b.journal.get(b._key(job), history=True)
        assert r.status == "succeeded", r.error
        first, second = by_creation(fake)
        assert first["cancel_at"] is not None and first["cancel_at"] <= second["created"]   # cancel, then send
        assert [a["status"] for a in row.history] == ["timed_out", "completed"]
        assert [a["estimated"] for a in row.history] == [1, 0] and "within its deadline" in row.history[0]["error"]
        journal_covers_the_bill(b, fake)
        assert r.cost_usd == pytest.approx(sum(a["cost_usd"] for a in row.history))


# ---------------------------------------------------------------------------------------------- item 2
def test_an_expired_result_is_charged_at_its_bound_and_marked_estimated(tmp_path):
    """Item 2: a result that is gone (404) before it was read was an attempt that ran: it is charged at its
    bound (the time from its send to the 404: it was seen in flight under its id), marked estimated, and the job
    is sent again."""
    fake = timed(plan=lambda inp, n: "expired" if n == 1 else "ok")
    (job,) = bundles(tmp_path, 1)
    with backend(tmp_path, fake, poll_interval_s=0.02) as b:
        r = b.run(job, timeout=30)
        row = b.journal.get(b._key(job), history=True)
        first = row.history[0]
        assert r.status == "succeeded" and fake.total_runs() == 2
        assert first["status"] == "expired" and first["cost_usd"] > 0 and first["estimated"] == 1
        assert fake.bills()[first["job_id"]] > 0                       # Runpod bills it
        journal_covers_the_bill(b, fake)
        costs = b.run_costs()
        assert costs.estimated == pytest.approx(first["cost_usd"] + first["idle_usd"])
        assert r.timings["runpod_estimated_usd"] == pytest.approx(first["cost_usd"])


def test_a_404_for_an_id_never_seen_in_flight_is_charged_the_whole_bound(tmp_path):
    """Issue 47: a 404 says the job behind an id ended by now only when that id was seen in flight for this
    attempt; here the first read comes after the result is gone, so nothing says when (or whether) this
    attempt's own job ran (an id given twice, an adopted attempt): its whole bound, estimated."""
    import math

    fake = timed(plan=lambda inp, n: "expired" if n == 1 else "ok")
    (job,) = bundles(tmp_path, 1)
    with backend(tmp_path, fake, poll_interval_s=1.5) as b:
        r = b.run(job, timeout=60)
        first = b.journal.get(b._key(job), history=True).history[0]
        assert r.status == "succeeded" and first["status"] == "expired" and first["estimated"] == 1
        assert first["execution_time_ms"] == math.ceil(b.dispatch.limits().bound_s - 1e-9) * 1000
        journal_covers_the_bill(b, fake)


# ---------------------------------------------------------------------------------------------- item 5
def test_a_slow_run_call_never_delays_status_reads_or_submit(tmp_path):
    """Item 5: the resend of a lost job hangs in /run (a Retry-After being slept out) and so does a new
    job's first send. Meanwhile the job whose result is ready at ~1 s is returned at once, and submit()
    returns at once."""
    jobs = bundles(tmp_path, 3)
    slow, lost, _ = (j.job_id for j in jobs)
    fake = timed(timing=lambda inp, n: (0.05, 1.0 if bundle_job_id(inp) == slow else 0.1),
                 plan=lambda inp, n: "lost" if bundle_job_id(inp) == lost and n == 1 else "ok")
    fake.delays["run"] = [0.0, 0.0, 60.0, 60.0]      # the 3rd and 4th run calls hang until released
    b = backend(tmp_path, fake, poll_interval_s=0.02, max_in_flight=8)
    try:
        t0 = time.time()
        h_slow, h_lost = b.submit(jobs[0]), b.submit(jobs[1])
        while fake.calls["run"] < 3 and time.time() - t0 < 20:     # the lost job's resend is hanging
            time.sleep(0.01)
        assert fake.calls["run"] == 3
        sent: list[float] = []
        submitter = threading.Thread(target=lambda: (b.submit(jobs[2]), sent.append(time.time() - t0)))
        s0 = time.time()
        submitter.start()
        submitter.join(5)
        assert sent and sent[0] - (s0 - t0) < 1.0               # submit() returned at once
        r = b.wait(h_slow, timeout=20)
        assert r.status == "succeeded" and time.time() - t0 < 4.0   # read as soon as it ended (~1 s)
    finally:
        fake.release()
        b.close()
    assert h_lost.job_id == lost


# ---------------------------------------------------------------------------------------------- item 6
def test_a_job_adopted_from_a_closed_backend_ends_when_runpod_fails_it(tmp_path):
    """Item 6: backend A sends a job and closes; backend B, in the same process, adopts it (A's session is
    closed: no owner polls it). Runpod then marks it FAILED: B ends it (infra_failed, billed), and its
    waiter wakes."""
    fake = FakeServerlessClient(polls_to_finish=10**9, plan=lambda inp, n: "lost")
    (job,) = bundles(tmp_path, 1)
    a = backend(tmp_path, fake)
    h = a.submit(job)
    t0 = time.time()
    while a.journal.get(h.meta["key"]).job_id is None and time.time() - t0 < 20:
        time.sleep(0.01)
    a.close()
    b = backend(tmp_path, fake)
    try:
        fake.polls_to_finish = 1                           # the next status read: FAILED
        got: list[Any] = []
        waiter = threading.Thread(target=lambda: got.append(b.wait(h)))
        waiter.start()
        waiter.join(15)
        assert got, "the adopted job never ended"
        row = b.journal.get(h.meta["key"])
        assert got[0].status == "infra_failed" and "failed without a result" in got[0].error
        assert row.final and row.owner == b.dispatch._owner and got[0].cost_usd > 0
        assert fake.total_runs() == 1
    finally:
        b.close()


def test_wait_has_a_default_bound_from_the_jobs_wall_clock_and_ends_the_job_there(tmp_path):
    """Item 6: wait() without a timeout is bounded: every attempt's ttl (the job's wall clock plus the evals'
    allowance and the allowances) plus the status backoff. Past it (here a poller that never ends anything,
    with a 1 s bound) the job is cancelled, charged at its bound and ended infra_failed: no waiter hangs."""
    fake = FakeServerlessClient(polls_to_finish=10**9)
    (job,) = bundles(tmp_path, 1)
    with backend(tmp_path / "default", fake) as b:
        lim = b.limits()
        assert lim.execution_s == 60 * 60 + 1800 + 300        # wall clock 60 min + evals + worker overhead
        assert lim.bound_s == 600 + lim.execution_s + 300     # + startup allowance + ttl margin
        assert b.wait_bound_s() == 3 * (lim.bound_s + 2 * 60) + 60
    with backend(tmp_path, fake, wait_timeout_s=1.0) as b:
        b.dispatch._sweep = lambda: None                               # type: ignore[method-assign]  # a stuck poller
        h = b.submit(job)
        t0 = time.time()
        r = b.wait(h)
        assert time.time() - t0 < 10
        assert r.status == "infra_failed" and "wait()'s bound" in r.error
        assert fake.calls["cancel"] == 1 and r.cost_usd > 0 and not b.journal.in_flight()


# ---------------------------------------------------------------------------------------------- item 7
def test_a_job_queued_unseen_after_a_5xx_on_run_is_journaled_and_charged_at_its_bound(tmp_path):
    """Item 7: /run queues the job and answers 502. The attempt was recorded before the send, with the tag
    that is in the queued job's input; it is charged at its bound (covering what the unseen job bills),
    marked estimated, and not sent again, also not when the same job is submitted again within its bound."""
    fake = timed()
    fake.lose_answers(1)
    (job,) = bundles(tmp_path, 1)
    with backend(tmp_path, fake, poll_interval_s=0.02) as b:
        r = b.run(job, timeout=30)
        (queued,) = fake.store.all()
        row = b.journal.get(b._key(job), history=True)
        attempt = row.history[0]
        assert r.status == "infra_failed" and "not resent" in r.error and r.cost_usd > 0   # charged
        assert attempt["tag"] and attempt["tag"] == queued["tag"] and attempt["job_id"] is None
        assert attempt["estimated"] == 1 and r.cost_usd == pytest.approx(attempt["cost_usd"])
        assert "queued unseen" in r.error
        t0 = time.time()
        while fake.running() and time.time() - t0 < 10:     # it runs to its end on Runpod, unseen
            time.sleep(0.02)
        assert fake.bills()[queued["id"]] > 0
        journal_covers_the_bill(b, fake)
        again = b.run(bundles(tmp_path / "again", 1)[0], timeout=30)   # the same job, another bundle
        assert again.status == "infra_failed" and fake.total_runs() == 1


CHILD7 = """
import sys, time
from pathlib import Path
from ait_env.jobs.settings import BackendSettings
from ait_env.backends.runpod import RunpodBackend
from ait_env.jobs.bundle import JobBundle
from tests.fakes.runpod_client import FakeServerlessClient

fake = FakeServerlessClient(Path(sys.argv[2]), clock=time.time, delay_ms=50, execution_ms=300)

class DiesAfterQueueing:   # /run queued the job; the orchestrator dies before it records the id
    def run(self, input, **kw):
        fake.run(input, **kw)
        print("queued", flush=True)
        time.sleep(600)
    def status(self, job_id):
        return fake.status(job_id)
    def cancel(self, job_id):
        return fake.cancel(job_id)

settings = BackendSettings.model_validate_json(Path(sys.argv[1]).read_text())
b = RunpodBackend(settings, sys.argv[3], show_progress=False, client=DiesAfterQueueing())
b.submit(JobBundle.load(Path(sys.argv[4])))
time.sleep(600)
"""


def test_an_orchestrator_killed_between_run_and_recording_the_id_is_charged_not_resent(tmp_path):
    """Item 7: the orchestrator is SIGKILLed after /run queued the job and before the journal has its id.
    The next orchestrator finds the attempt (recorded before the send, with its tag), charges its bound and
    does not send it again, also not when the same bundle is submitted again."""
    (job,) = bundles(tmp_path, 1)
    state, runs, cfg = tmp_path / "runpod_state.sqlite", tmp_path / "runs", tmp_path / "settings.json"
    cfg.write_text(settings(poll_interval_s=0.02).model_dump_json())
    FakeServerlessClient(state)
    child = subprocess.Popen([sys.executable, "-c", CHILD7, str(cfg), str(state), str(runs), str(job.root)],
                             stdout=subprocess.PIPE, text=True, cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "queued"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    fake = FakeServerlessClient(state, clock=time.time, delay_ms=50, execution_ms=300)
    with RunpodBackend(settings(poll_interval_s=0.02), runs, show_progress=False, client=fake) as b:
        r = b.run(JobBundle.load(job.root), timeout=30)
        row = b.journal.get(b._key(job), history=True)
    (queued,) = fake.store.all()
    assert r.status == "infra_failed" and "never recorded" in r.error and fake.total_runs() == 1
    assert row.history[0]["tag"] == queued["tag"] and row.history[0]["estimated"] == 1
    assert row.history[0]["cost_usd"] > 0


# ---------------------------------------------------------------------------------------------- item 8
def _tiny_settings(executor: str) -> Any:
    from ait_env.jobs.settings import BackendSettings

    base = settings(executor=executor, require_revision=None)
    return BackendSettings.model_validate({**base.model_dump(), "models": [{"name": "ait-tiny-s",
                                                                            "role": "small"}]})


def test_the_renderer_map_comes_from_the_executor_the_backend_runs(tmp_path):
    """Item 8: backend=runpod (and gpu-local) with the local executor can validate a tiny-model job: the
    renderer map is the executor's, for every backend."""
    from ait_env.backends import make_backend
    from ait_env.jobs.settings import BackendSettings
    from ait_env.config import load_group

    fake = FakeServerlessClient()
    with RunpodBackend(_tiny_settings("local"), tmp_path / "l", show_progress=False, client=fake) as b:
        assert b.model_renderers() == {"ait-tiny-s": "default"}
    with RunpodBackend(_tiny_settings("gpu"), tmp_path / "g", show_progress=False, client=fake) as b:
        assert b.model_renderers() == {}                      # prime-rl's own map decides
    gl = load_group("backend", "gpu-local")
    cfg = BackendSettings.model_validate({**gl, "options": {**gl["options"], "executor": "local"},
                                          "models": [{"name": "ait-tiny-s", "role": "small"}]})
    with make_backend(cfg, tmp_path / "gl") as b:
        assert b.model_renderers() == {"ait-tiny-s": "default"}
    local = make_backend(BackendSettings.model_validate(load_group("backend", "local")), tmp_path / "lo")
    assert set(local.model_renderers().values()) == {"default"}


def test_a_tiny_model_episode_on_backend_runpod_with_the_local_executor_validates_and_runs(make_env, runs_dir):
    """Item 8, as the issue found it: backend=runpod with the local executor, base model ait-tiny-s. The job
    validates (no "no chat renderer" against the agent) and reaches Runpod; the episode is scored."""
    from ait_env.agents.reference import ScriptedReferenceAgent
    from tests.helpers import play
    from tests.backends.test_runpod_backend import _pin_base, _real_settings

    pytest.importorskip("verifiers")
    fake = FakeServerlessClient()
    with RunpodBackend(_real_settings(), runs_dir, show_progress=False, client=fake) as b:
        _pin_base(b)
        env = make_env(family="arithmetic", backend=b)
        obs, _, _, _, info = play(env, ScriptedReferenceAgent(), seed=1)
    assert "no chat renderer" not in obs and info["reward"]["status"] == "scored", obs
    assert fake.total_runs() == 1 and "ait-tiny-s" in info["base_models"][0]["name"]


def test_a_model_the_backends_executor_cannot_render_is_infra_failed_not_the_agents(make_env, runs_dir):
    """Item 8: a backend that offers a model its executor has no renderer for is our configuration: the
    episode is dropped (infra_failed, unscored), never 'invalid' with reward 0 against the agent."""
    from ait_env.agents.reference import ScriptedReferenceAgent
    from tests.helpers import play

    fake = FakeServerlessClient()
    with RunpodBackend(_tiny_settings("gpu"), runs_dir, show_progress=False, client=fake) as b:
        env = make_env(family="arithmetic", backend=b)
        obs, _, terminated, _, info = play(env, ScriptedReferenceAgent(), seed=1)
    assert terminated and info["reward"]["status"] == "infra_failed", info["reward"]
    assert "configuration" in obs and "not counted against you" in obs and fake.total_runs() == 0
    assert info["reward"]["total"] is None and info["reward"]["drop"] and "no chat renderer" in info["reward"]["reason"]


# ---------------------------------------------------------------------------------------------- item 9
def test_the_rest_api_follows_base_url_and_a_lost_answer_over_http_is_charged(tmp_path, monkeypatch):
    """Item 9: with base_url pointing at a fake, the endpoint's settings are read from the fake too (the
    conftest guard fails any test that reaches another host). Item 7 over HTTP: the real client turns the
    fake's 502 after queueing into SubmitUncertain, and the queued job's input carries the journal's tag."""
    from fleet.runpod_management import EndpointSpec, ManagementClient
    from tests.gpu.fake_runpod import start_fake_runpod

    output = {"kind": "job", "baselines": [], "result": {
        "job_id": "w", "backend": "runpod", "status": "succeeded", "post_score": 0.5,
        "worker": {"image_revision": "rev-1", "versions": {}, "gpus": ["NVIDIA RTX A5000 (24564 MiB)"] * 2}}}
    (job,) = bundles(tmp_path, 1)
    with start_fake_runpod(instant=True, instant_output=output) as fake:
        monkeypatch.setenv("RUNPOD_API_KEY", fake.api_key)
        monkeypatch.delenv("AIT_RUNPOD_REST_BASE_URL", raising=False)
        with ManagementClient(fake.api_key, base_url=fake.rest_base_url) as mgmt:
            ep = mgmt.create(EndpointSpec(name="ait-test", image="img:1", gpu_type_ids=["AMPERE_24"],
                                          gpu_count=2, workers_max=3, idle_timeout_s=17))
        with RunpodBackend(settings(endpoint_id=ep["id"], base_url=fake.job_base_url, poll_interval_s=0.02),
                           tmp_path / "runs", show_progress=False) as b:
            assert b.rest_base_url() == fake.job_base_url
            assert b.endpoint_costs.idle_timeout_s == 17 and b.max_in_flight == 3
            assert f"idle_timeout_s: endpoint {ep['id']}" in b.endpoint_costs.source
            fake.lose_answers(1)
            r = b.run(job, timeout=30)
            attempt = b.journal.get(b._key(job), history=True).history[0]
        (queued,) = fake.jobs.values()
    assert r.status == "infra_failed" and "queued unseen" in r.error
    assert queued.input["tag"] == attempt["tag"] and attempt["estimated"] == 1 and attempt["cost_usd"] > 0


def test_no_test_reaches_runpods_real_hosts(tmp_path, monkeypatch):
    """Item 9: the guard itself: a backend pointed at Runpod's real REST host with a test key fails loudly
    in tests (it never sends the key there)."""
    import httpx

    with pytest.raises(AssertionError, match="tests talk to fakes on 127.0.0.1 only"):
        httpx.get("https://api.runpod.io/v2/serverless", headers={"Authorization": "Bearer rp-test"})


# ---------------------------------------------------------------------------------------------- issue 47: Retry-After
class _Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def _throttled(tmp_path, retry_after: list[float | None], **options: Any):
    """One job on a simulated clock whose first run calls are answered 429 with these ``Retry-After``s (past
    the client's own retry time, as fleet.runpod_api raises them), then queued; pumped to its end."""
    from fleet.runpod_api import RunpodAPIError

    clock, calls, sent_at = _Clock(), {"run": 0}, []
    (job,) = bundles(tmp_path, 1)

    def plan(inp: dict[str, Any], n: int) -> str:
        calls["run"] += 1
        sent_at.append(clock.t)
        if calls["run"] <= len(retry_after):
            raise RunpodAPIError("POST /run: HTTP 429 (rate limited)", 429, "", "POST", "/run",
                                 retry_after_s=retry_after[calls["run"] - 1])
        return "ok"

    fake = FakeServerlessClient(clock=clock, plan=plan, timing=lambda inp, n: (0.5, 3.0), rate_usd_per_s=0.00038)
    opts = {**settings().options, "poll_interval_s": 1.0, "status_backoff_max_s": 8.0, "startup_allowance_s": 600,
            "retry_budget": 0, **options}
    b = RunpodBackend(settings().model_copy(update={"options": opts}), tmp_path / "runs", show_progress=False,
                      client=fake, clock=clock, threads=False)
    try:
        h = b.submit(job)
        for _ in range(2000):
            b.pump()
            if b.dispatch._entries[h.meta["key"]].done.is_set():
                break
            clock.t += 1.0
        return b.wait(h, timeout=0), sent_at, fake, b.journal.attempts()
    finally:
        b.close()


def test_a_retry_after_within_the_send_window_is_waited_out_and_is_not_a_retry(tmp_path):
    """Issue 47: two 429s with Retry-After 120 s and 200 s (past the client's 60 s) with retry_budget=0: the job
    is sent again after each wait, runs once and succeeds; the refused sends are free attempts."""
    r, sent_at, fake, attempts = _throttled(tmp_path, [120.0, 200.0])
    assert r.status == "succeeded", r.error
    assert sent_at[1] - sent_at[0] >= 120 and sent_at[2] - sent_at[1] >= 200
    assert sent_at[1] - sent_at[0] <= 122 and sent_at[2] - sent_at[1] <= 202     # no longer than asked
    assert fake.total_runs() == 1
    assert [a["cost_usd"] for a in attempts[:2]] == [0, 0] and attempts[2]["cost_usd"] > 0


def test_a_retry_after_past_the_send_window_ends_the_job_at_once_and_says_why(tmp_path):
    r, sent_at, fake, attempts = _throttled(tmp_path, [120.0, 900.0])
    assert r.status == "infra_failed" and "send window" in r.error and "startup_allowance_s=600" in r.error, r.error
    assert len(sent_at) == 2 and fake.total_runs() == 0 and all(a["cost_usd"] == 0 for a in attempts)


@pytest.mark.parametrize("garbled", [None, float("nan"), -5.0, float("inf")])
def test_a_429_without_a_usable_retry_after_backs_off(tmp_path, garbled):
    """No header, or one that is no wait (NaN, negative, infinite): the dispatcher's own backoff (1, 2, 4 s...),
    never an immediate resend."""
    r, sent_at, fake, _ = _throttled(tmp_path, [garbled, garbled, garbled])
    assert r.status == "succeeded", r.error
    gaps = [b - a for a, b in zip(sent_at, sent_at[1:])]
    assert gaps[0] >= 1 and gaps[1] >= 2 and gaps[2] >= 4, gaps


# ---------------------------------------------------------------------------------------------- issue 47: torn charge
CHILD_TORN = """
import sys, time
from pathlib import Path
from ait_env.jobs.settings import BackendSettings
from ait_env.backends.runpod import RunpodBackend
from ait_env.jobs.bundle import JobBundle
from ait_env.observe.ledger import CostLedger
from tests.fakes.runpod_client import FakeServerlessClient

fake = FakeServerlessClient(Path(sys.argv[2]), clock=time.time, delay_ms=50, execution_ms=300)
settings = BackendSettings.model_validate_json(Path(sys.argv[1]).read_text())
job = JobBundle.load(Path(sys.argv[4]))
ledger = CostLedger(Path(sys.argv[5]), episode_budget_usd=5.0)
hold = ledger.reserve(job.manifest.episode_id, 1.5, what=job.job_id)   # as the episode holds a job's bound
b = RunpodBackend(settings, sys.argv[3], show_progress=False, client=fake)
r = b.run(job, timeout=60)          # the journal hands the charge to this process (collect) ...
print(f"charged {r.cost_usd}", flush=True)
time.sleep(600)                     # ... which is killed before the episode writes it to the ledger
"""


def _episode_bundle(folder, i: int) -> JobBundle:
    from task_families import reference_files

    from tests.helpers import make_bundle

    files = reference_files("arithmetic", "Qwen/Qwen3-0.6B")
    (folder / f"b{i}").mkdir(parents=True)
    return make_bundle({**files, "job.toml": files["job.toml"] + f"\n# torn {i}\n"}, folder / f"b{i}",
                       episode_id=f"ep-{i}")


def test_a_charge_torn_from_the_ledger_by_a_sigkill_is_written_once_by_the_next_process(tmp_path):
    """Issue 47: an episode process is SIGKILLed after the journal handed it a job's charge and before it wrote
    the charge to the cost ledger. The next backend on the run dir writes it (the episode's record, marked
    recovered, closing the job's reservation: the budget is not held for a day), once, however often and by
    however many processes it is asked; a charge the episode did write is never written again."""
    from ait_env.observe.ledger import CostLedger

    job = _episode_bundle(tmp_path, 0)
    state, runs, cfg, path = (tmp_path / "runpod_state.sqlite", tmp_path / "runs", tmp_path / "settings.json",
                              tmp_path / "costs.jsonl")
    cfg.write_text(settings(poll_interval_s=0.02).model_dump_json())
    FakeServerlessClient(state)
    child = subprocess.Popen([sys.executable, "-c", CHILD_TORN, str(cfg), str(state), str(runs), str(job.root),
                              str(path)], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert child.stdout is not None
        line = child.stdout.readline().strip()
        assert line.startswith("charged "), line
        charge = float(line.split()[1])
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    assert charge > 0
    ledger = CostLedger(path, episode_budget_usd=5.0)
    assert ledger.spent("ep-0") == 0 and ledger.reserved("ep-0") == pytest.approx(1.5)   # torn
    fake = FakeServerlessClient(state, clock=time.time, delay_ms=50, execution_ms=300)
    with RunpodBackend(settings(poll_interval_s=0.02), runs, show_progress=False, client=fake) as b:
        assert b.recover_torn_charges(ledger) == 1
        b.charge_run_costs(ledger)                        # what every episode calls: nothing more
        assert b.recover_torn_charges(ledger) == 0
    with RunpodBackend(settings(poll_interval_s=0.02), runs, show_progress=False, client=fake) as b2:
        assert b2.recover_torn_charges(ledger) == 0       # another process later: still once
    (rec,) = [r for r in ledger.records() if r.kind == "gpu_job"]
    assert rec.episode_id == "ep-0" and rec.usd == pytest.approx(charge) and rec.meta["recovered"] is True
    assert ledger.spent("ep-0") == pytest.approx(charge) and ledger.reserved("ep-0") == 0   # hold closed


def test_a_charge_the_episode_wrote_or_a_live_process_holds_is_not_recovered(tmp_path):
    from ait_env.observe.ledger import CostLedger, CostRecord

    written, held = (_episode_bundle(tmp_path, i) for i in range(2))
    ledger = CostLedger(tmp_path / "costs.jsonl")
    fake = timed()
    a = backend(tmp_path, fake)
    r1, r2 = a.run(written, timeout=30), a.run(held, timeout=30)
    assert r1.cost_usd > 0 and r2.cost_usd > 0
    ledger.append(CostRecord(kind="gpu_job", episode_id="ep-0", usd=r1.cost_usd, meta={"job_id": r1.job_id}))
    with backend(tmp_path, fake) as b:
        assert b.recover_torn_charges(ledger) == 0        # ep-1's process (this one) is alive, its session open
    a.close()                                             # closed without writing ep-1's charge
    with backend(tmp_path, fake) as b:
        assert b.recover_torn_charges(ledger) == 1        # ep-1's only; ep-0's is in the ledger already
    assert sorted(r.episode_id for r in ledger.records() if r.kind == "gpu_job") == ["ep-0", "ep-1"]
