"""Issue 47, item 5 for the second engine: the skypilot backend keeps the dispatch core's money rules over
random fault schedules (hypothesis, on a simulated clock), as test_runpod_property.py does for Runpod.

:class:`SimSky` is a small SkyPilot SDK boundary (the calls :class:`fleet.skypilot_engine.SkySDK` makes:
``task``, ``launch``, ``queue``, ``cancel``, ``logs``) whose managed jobs live on the test's clock, written
from skypilot 0.14.1's source as tests/fakes/fake_sky.py is: a job is PENDING until a worker takes it,
RUNNING for its execution time, then SUCCEEDED (its log has the handler's result between the markers),
FAILED, FAILED_CONTROLLER (a worker lost, no recovery left) or CANCELLED; a job whose worker is lost with a
recovery left goes RUNNING -> RECOVERING -> PENDING -> RUNNING on another worker -> SUCCEEDED (``recovery_count``
1); ``job_duration`` is its running time summed over its runs (sky/jobs/state.py "total_job_duration"); a job
the queue no longer lists is gone. Faults drawn per schedule: the API server unreachable at a
launch (``ApiServerConnectionError``, nothing launched), a launch whose answer is lost after the job was
queued (found again by name, or not yet listed), queue outages, a SUCCEEDED job whose log has no result,
a job the queue forgets after it ended, billing times garbled (negative, absurd), max_in_flight,
retry_budget and a run budget. For every schedule:

- every job SimSky launched has exactly one journal attempt (matched by the tag in its request), charged at
  least SimSky's bill for it (its GPUs x its running time at the pod price), and none is negative;
- the journal's total >= SimSky's bill and <= it plus what is charged at bounds and the idle estimates (a
  bill read is never above the pool's); no job is left in flight; no job gets another job's result;
- with a run budget, spending never passes it by more than one running job's bound, at any step.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ait_env.backends.skypilot import SkypilotBackend
from fleet import prices
from fleet.skypilot_engine import REQUEST_ENV, decode_request, result_lines
from tests.backends.property_rules import check_money, drive
from tests.backends.test_runpod_backend import bundles
from tests.backends.test_skypilot_backend import settings as backend_settings
from tests.fakes.runpod_client import bundle_job_id, instant_output

OUTCOMES = ["ok", "ok", "ok", "failed", "lost", "recovered", "no_markers", "forgotten", "stuck"]
#: a recovered job: its worker is lost halfway through, RECOVERING this long, then PENDING this long
RECOVERING_S, REQUEUED_S = 2.0, 1.0
LIMITS = {"execution_timeout_s": 12, "startup_allowance_s": 4, "ttl_margin_s": 4, "poll_interval_s": 2,
          "status_backoff_max_s": 8, "idle_per_job_s": 5, "gpus_per_job": 1, "gpu_type": "NVIDIA RTX A5000",
          "pool": {"accelerators": ["RTXA5000"], "gpus_per_worker": 1}}
BOUND_S = 12 + 4 + 4
DT = 1.0


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


class ApiServerConnectionError(RuntimeError):
    """The SDK's health check failed before the request was sent (sky/exceptions.py: the engine reads the
    class name)."""


class SimSky:
    """The SkySDK calls the engine makes, on a simulated clock (module docstring)."""

    def __init__(self, clock: Clock, plan: Any, timing: Any, rate: float) -> None:
        self.clock, self.plan, self.timing, self.rate = clock, plan, timing, rate
        self.jobs: dict[int, dict[str, Any]] = {}
        self.calls = 0
        self.unreachable: set[int] = set()
        self.lose_answer: set[int] = set()
        self.outages: list[tuple[float, float]] = []
        self.garble: Any = lambda body: None

    # -- the SkySDK surface
    def task(self, config: dict[str, Any]) -> bool:
        return True

    def launch(self, config: dict[str, Any], name: str, pool: str) -> int:
        self.calls += 1
        if self.calls in self.unreachable:
            raise ApiServerConnectionError("Could not connect to SkyPilot API server (sim)")
        body = decode_request(config["envs"][REQUEST_ENV])
        sent = sum(1 for j in self.jobs.values() if j["bundle"] == bundle_job_id(body)) + 1
        outcome = self.plan(body, sent)
        delay, execution = self.timing(body, sent)
        jid = len(self.jobs) + 1
        now = self.clock()
        self.jobs[jid] = {"id": jid, "name": name, "body": body, "bundle": bundle_job_id(body), "tag": body.get("tag"),
                          "outcome": outcome, "start": now + delay, "exec": execution, "cancelled_at": None,
                          "gpus": int(config["resources"]["accelerators"]["RTXA5000"]), "created": now}
        if self.calls in self.lose_answer:
            raise TimeoutError("the launch request's answer was lost (sim)")
        return jid

    def queue(self, job_ids: list[int] | None = None, name_match: str | None = None) -> list[dict[str, Any]]:
        now = self.clock()
        if any(a <= now < b for a, b in self.outages):
            raise ConnectionError("the API server did not answer (sim)")
        out = []
        for j in self.jobs.values():
            if job_ids is not None and j["id"] not in job_ids:
                continue
            if name_match is not None and name_match not in j["name"]:
                continue
            rec = self._record(j, now)
            if rec is not None:
                out.append(rec)
        return out

    def cancel(self, job_ids: list[int]) -> None:
        now = self.clock()
        if any(a <= now < b for a, b in self.outages):
            raise ConnectionError("the API server did not answer (sim)")
        for jid in job_ids:
            j = self.jobs.get(jid)
            if j is not None and j["cancelled_at"] is None and self._state(j, now)[0] in ("PENDING", "RUNNING",
                                                                                            "RECOVERING"):
                j["cancelled_at"] = now

    def logs(self, job_id: int) -> str:
        j = self.jobs[job_id]
        if j["outcome"] != "ok":
            return "setup done\nno result here"
        return "\n".join(["setup done", *result_lines(instant_output(j["body"], "ok", "rev-1"))])

    # -- the sim
    def _runs(self, j: dict[str, Any]) -> list[tuple[float, float]]:
        """The spans the job runs on a worker: one, or two for a recovered job (its worker lost halfway)."""
        if j["outcome"] == "stuck":
            return [(j["start"], math.inf)]
        if j["outcome"] != "recovered":
            return [(j["start"], j["start"] + j["exec"])]
        lost = j["start"] + j["exec"] / 2
        again = lost + RECOVERING_S + REQUEUED_S
        return [(j["start"], lost), (again, again + j["exec"])]

    def _end(self, j: dict[str, Any]) -> float:
        return self._runs(j)[-1][1]

    def _ran(self, j: dict[str, Any], t: float) -> float:
        """Running seconds up to ``t`` (summed over the job's runs)."""
        return sum(max(0.0, min(t, b) - a) for a, b in self._runs(j))

    def _state(self, j: dict[str, Any], now: float) -> tuple[str, float | None]:
        """(status, running seconds so far) of a job now."""
        if j["outcome"] == "stuck" and j["cancelled_at"] is None:
            return "PENDING", None             # the pool cannot take it (no worker)
        end = self._end(j)
        if j["cancelled_at"] is not None and j["cancelled_at"] < end:
            ran = self._ran(j, j["cancelled_at"])
            return ("CANCELLED" if now >= j["cancelled_at"] else "CANCELLING"), ran or None
        if now < j["start"]:
            return "PENDING", None
        if now < end:
            runs = self._runs(j)
            if any(a <= now < b for a, b in runs):
                return "RUNNING", self._ran(j, now)
            lost = runs[0][1]                  # between the runs: the worker was lost
            return ("RECOVERING" if now < lost + RECOVERING_S else "PENDING"), self._ran(j, now)
        final = {"ok": "SUCCEEDED", "no_markers": "SUCCEEDED", "forgotten": "SUCCEEDED", "recovered": "SUCCEEDED",
                 "failed": "FAILED", "lost": "FAILED_CONTROLLER"}[j["outcome"]]
        return final, self._ran(j, end)

    def _record(self, j: dict[str, Any], now: float) -> dict[str, Any] | None:
        status, ran = self._state(j, now)
        if j["outcome"] == "forgotten" and status == "SUCCEEDED" and now >= self._end(j) + 3:
            return None                        # the queue no longer lists it
        duration: Any = ran
        if status in ("SUCCEEDED", "FAILED", "FAILED_CONTROLLER", "CANCELLED") and ran is not None:
            duration = self.garble(j["body"]) or ran
        lost = self._runs(j)[0][1] if j["outcome"] == "recovered" else math.inf
        cut = j["cancelled_at"] if j["cancelled_at"] is not None else math.inf
        return {"job_id": j["id"], "job_name": j["name"], "status": status, "job_duration": duration,
                "recovery_count": int(lost <= min(now, cut)), "failure_reason": "the job failed (sim)" if status.startswith("FAILED") else None,
                "current_cluster_name": "ait-workers-1" if ran else None, "pool": "ait-workers"}

    def bill(self, j: dict[str, Any]) -> float:
        """What the pool cost for this job: its GPUs x its running time (whole seconds) at the pod rate."""
        _, ran = self._state(j, math.inf)
        return math.ceil((ran or 0.0) - 1e-9) * self.rate * j["gpus"]

    def running(self) -> bool:
        """Some job still runs on the pool, or will again (a recovered job between its runs)."""
        now = self.clock()
        return any(self._state(j, now)[0] in ("RUNNING", "CANCELLING", "RECOVERING")
                   or (j["outcome"] == "recovered" and self._state(j, now)[0] == "PENDING" and self._ran(j, now) > 0)
                   for j in self.jobs.values())


@st.composite
def schedules(draw: Any) -> dict[str, Any]:
    n = draw(st.integers(1, 4))
    tenths = st.integers(0, 60), st.integers(5, 150)
    return {
        "jobs": n,
        "outcomes": [[draw(st.sampled_from(OUTCOMES)) for _ in range(3)] for _ in range(n)],
        "timing": [[(draw(tenths[0]) / 10, draw(tenths[1]) / 10) for _ in range(3)] for _ in range(n)],
        "garbled": [draw(st.sampled_from([None, None, None, -5.0, 1e12])) for _ in range(n)],
        "unreachable": draw(st.sets(st.integers(1, 8), max_size=2)),
        "lose_answer": draw(st.sets(st.integers(1, 8), max_size=2)),
        "outages": draw(st.lists(st.tuples(st.integers(0, 120), st.integers(1, 60)), max_size=2)),
        "max_in_flight": draw(st.integers(1, 3)),
        "retry_budget": draw(st.integers(0, 2)),
        "budget_bounds": draw(st.sampled_from([None, None, 1.5, 2.5, 4.0])),
        "stagger": draw(st.lists(st.integers(0, 20), min_size=n, max_size=n)),
    }


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> list[Any]:
    return bundles(tmp_path_factory.mktemp("sky-property"), 4)


def run_schedule(s: dict[str, Any], jobs: list[Any], root: Path) -> None:
    clock = Clock()
    ids = [j.job_id for j in jobs[: s["jobs"]]]
    rate = prices.pod_price_per_s("NVIDIA RTX A5000")
    sky = SimSky(clock, plan=lambda body, n: s["outcomes"][ids.index(bundle_job_id(body))][min(n, 3) - 1],
                 timing=lambda body, n: s["timing"][ids.index(bundle_job_id(body))][min(n, 3) - 1], rate=rate)
    sky.unreachable, sky.lose_answer = set(s["unreachable"]), set(s["lose_answer"])
    sky.outages = [(clock.t + a, clock.t + a + b) for a, b in s["outages"]]
    sky.garble = lambda body: s["garbled"][ids.index(bundle_job_id(body))]
    per_job = (BOUND_S + 5) * rate       # one job's bound plus its idle bound (1 GPU)
    budget = None if s["budget_bounds"] is None else round(s["budget_bounds"] * per_job, 6)
    base = backend_settings(**LIMITS)
    opts = {**base.options, "max_in_flight": s["max_in_flight"], "retry_budget": s["retry_budget"],
            "run_budget_usd": budget, "poll_interval_s": 2}
    # SimSky stands where SkySDK does (the engine's calls on the API server), not below it at ``sky``
    b = SkypilotBackend(base.model_copy(update={"options": opts}), root / "runs", show_progress=False,
                        sdk=sky, clock=clock, threads=False)   # type: ignore[arg-type]
    try:
        assert b.estimate_cost_usd(jobs[0]) == pytest.approx(per_job, rel=1e-6)
        limit_s = max(s["stagger"]) + s["jobs"] * (s["retry_budget"] + 1) * (BOUND_S + 2 * 8 + 4 + 2 * DT) + 120
        handles, _ = drive(b, jobs, s, clock, dt=DT, limit_s=limit_s, budget=budget, per_job=per_job)
        for _ in range(int(BOUND_S / DT) + 30):          # every run on the pool ends
            if not sky.running():
                break
            clock.t += DT
        assert not sky.running()
        attempts = check_money(b, [(j["tag"], str(j["id"]), sky.bill(j)) for j in sky.jobs.values()])
        costs = b.run_costs()
        event(f"attempts charged at their bound: {'yes' if costs.estimated else 'no'}")
        event(f"launch answers lost: {'yes' if s['lose_answer'] & set(range(1, sky.calls + 1)) else 'no'}")
        event(f"jobs sent again: {'yes' if len(attempts) > len(handles) else 'no'}")
        event(f"cancels: {'yes' if any(j['cancelled_at'] for j in sky.jobs.values()) else 'no'}")
        event(f"recovered jobs: {'yes' if any(j['outcome'] == 'recovered' for j in sky.jobs.values()) else 'no'}")
    finally:
        b.close()


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(s=schedules())
def test_random_fault_schedules_on_a_skypilot_pool_keep_the_money_rules_and_end_every_job(pool, s):
    with tempfile.TemporaryDirectory(prefix="ait-sky-property-") as tmp:
        run_schedule(s, pool, Path(tmp))
