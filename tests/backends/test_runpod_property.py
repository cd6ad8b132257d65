"""Issue 32's property: over random fault schedules (hypothesis, 200 of them, on a simulated clock), the
runpod backend keeps the money rules and ends every job.

Each schedule draws 1-4 jobs, what happens to each attempt on Runpod (it completes, its worker dies, its
result expires, it times out, it sticks in the queue, the job fails by itself, a non-replica worker answers),
its queue/cold-start delay and execution time, billing fields garbled in its final status (missing, null,
text, negative, NaN, absurd, a boolean, a negative delay: issue 47), /status and /cancel outages, run calls refused (429,
with a Retry-After within the send window, past it, or unusable: issue 47) or
answered 5xx with or without the job queued, run calls answered with an id given before (issue 47), a short result retention, max_in_flight, retry_budget and a run
budget. The real :class:`RunpodBackend` runs it with ``threads=False``: the test pumps its submitters and
poller on the fake's clock (tests/fakes/runpod_client.py, time mode), so a schedule of minutes takes
milliseconds. For every schedule:

- **jobs run on the fake == jobs charged in the journal, attempt by attempt**: every job the fake queued
  has exactly one journal attempt (matched by the tag the attempt put in the input), charged at least what
  the fake bills for it; an attempt that reached no job on the fake is charged nothing unless its run call
  had no clear answer (then its bound, estimated);
- the journal's total (jobs + idle) >= the fake's bill, once every run on the fake has ended, and at most
  the bill plus the attempts charged at bounds and the idle estimates (a bill read is never above Runpod's);
  no charge is negative; a garbled bill is charged at its bound, marked estimated;
- no job is left in flight (``in_progress`` or any state but final), within its time bound, and no job
  gets another job's result;
- with a run budget, spending never passes it by more than one running job's bound, at any step.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ait_env.backends.runpod import RunpodBackend
from fleet.runpod_api import RunpodAPIError
from tests.backends.property_rules import check_money, drive
from tests.backends.test_runpod_backend import bundles
from tests.backends.test_runpod_backend import settings as backend_settings
from tests.fakes.runpod_client import BILLING_FAULTS, FakeServerlessClient, bundle_job_id

OUTCOMES = ["ok", "ok", "ok", "lost", "expired", "timed_out", "stuck", "job_failed", "non_replica"]
LIMITS = {"execution_timeout_s": 12, "startup_allowance_s": 4, "ttl_margin_s": 4, "poll_interval_s": 2,
          "status_backoff_max_s": 8, "idle_timeout_s": 5, "workers_min": 0, "read_endpoint": False}
BOUND_S = 12 + 4 + 4            # an attempt's ttl: its deadline (16 s) plus the margin
RATE = 0.00019 * 2              # $/s of one 2 x RTX A5000 worker: the backend's and the fake's
DT = 1.0                        # seconds of simulated time between two pumps


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


@st.composite
def schedules(draw: Any) -> dict[str, Any]:
    n = draw(st.integers(1, 4))
    window = st.tuples(st.integers(0, 120), st.integers(1, 60))      # seconds: start, length
    tenths = st.integers(0, 60), st.integers(5, 150)                # delay, execution, in 0.1 s
    return {
        "jobs": n,
        "outcomes": [[draw(st.sampled_from(OUTCOMES)) for _ in range(3)] for _ in range(n)],
        "billing_faults": [draw(st.sampled_from([None, None, None, *BILLING_FAULTS])) for _ in range(n)],
        "timing": [[(draw(tenths[0]) / 10, draw(tenths[1]) / 10) for _ in range(3)] for _ in range(n)],
        "status_outages": draw(st.lists(window, max_size=2)),
        "cancel_outages": draw(st.lists(window, max_size=1)),
        "run_outages": draw(st.lists(window, max_size=1)),
        "run_refused": draw(st.sets(st.integers(1, 8), max_size=2)),      # run calls answered 429
        "retry_after": draw(st.sampled_from([None, 0.0, 2.0, 3.5, 30.0, float("nan"), -1.0])),   # their header
        "answers_lost": draw(st.sets(st.integers(1, 4), max_size=2)),     # queued, then a 5xx
        "ids_reused": draw(st.sets(st.integers(2, 6), max_size=1)),       # queued, answered with a used id
        "result_ttl_s": draw(st.sampled_from([3.0, 30.0, 1800.0])),
        "max_in_flight": draw(st.integers(1, 3)),
        "retry_budget": draw(st.integers(0, 2)),
        "budget_bounds": draw(st.sampled_from([None, None, 1.0, 1.5, 2.5, 4.0])),
        "stagger": draw(st.lists(st.integers(0, 20), min_size=n, max_size=n)),
    }


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> list[Any]:
    return bundles(tmp_path_factory.mktemp("property"), 4)


@pytest.fixture(scope="module")
def base_settings() -> Any:
    return backend_settings(**LIMITS)   # conf/backend/runpod.yaml read once, not per schedule


def make_fake(s: dict[str, Any], ids: list[str], clock: Clock) -> tuple[FakeServerlessClient, Callable[[dict[str, Any]], int]]:
    """The fake Runpod of schedule ``s`` (its plan, timings, billing faults, outages) and ``which``: a run
    input's job index."""
    calls = {"run": 0}
    index: dict[str, int] = {}        # a payload's bundle -> the job's index (decoded once per bundle)

    def which(inp: dict[str, Any]) -> int:
        if inp["bundle"] not in index:
            index[inp["bundle"]] = ids.index(bundle_job_id(inp))
        return index[inp["bundle"]]

    def plan(inp: dict[str, Any], n: int) -> str:
        calls["run"] += 1
        if calls["run"] in s["run_refused"]:
            raise RunpodAPIError("run: HTTP 429 (property: rate limited, nothing queued)", 429, "",
                                 retry_after_s=s["retry_after"])
        if calls["run"] in s["answers_lost"]:
            fake.lose_answers(1)
        if calls["run"] in s["ids_reused"]:
            fake.reused_ids += 1
        return s["outcomes"][which(inp)][min(n, 3) - 1]

    def timing(inp: dict[str, Any], n: int) -> tuple[float, float]:
        return s["timing"][which(inp)][min(n, 3) - 1]

    fake = FakeServerlessClient(clock=clock, plan=plan, timing=timing, result_ttl_s=s["result_ttl_s"],
                                idle_timeout_s=5.0, rate_usd_per_s=RATE)
    fake.billing_fault = lambda inp: s["billing_faults"][which(inp)]
    t0 = clock.t
    for route, key in (("status", "status_outages"), ("cancel", "cancel_outages"), ("run", "run_outages")):
        for start, length in s[key]:
            fake.outage(route, t0 + start, t0 + start + length)
    return fake, which


def run_schedule(s: dict[str, Any], jobs: list[Any], root: Path, base: Any) -> None:
    clock = Clock()
    ids = [j.job_id for j in jobs[: s["jobs"]]]
    fake, which = make_fake(s, ids, clock)
    per_job = (BOUND_S + 5) * RATE      # what one job holds: its bound plus the idle bound
    budget = None if s["budget_bounds"] is None else round(s["budget_bounds"] * per_job, 6)
    opts = {**base.options, "max_in_flight": s["max_in_flight"], "retry_budget": s["retry_budget"],
            "run_budget_usd": budget}
    b = RunpodBackend(base.model_copy(update={"options": opts}), root / "runs", show_progress=False,
                      client=fake, clock=clock, threads=False)
    try:
        assert b.estimate_cost_usd(jobs[0]) == pytest.approx(per_job)
        # every job ends within its attempts' bounds, its backoff and its wait for a slot
        limit_s = max(s["stagger"]) + s["jobs"] * (s["retry_budget"] + 1) * (BOUND_S + 2 * 8 + 2 * DT) + 60
        handles, results = drive(b, jobs, s, clock, dt=DT, limit_s=limit_s, budget=budget, per_job=per_job)
        for _ in range(int(BOUND_S / DT) + 2):                       # every run on the fake ends (its ttl)
            if not fake.running():
                break
            clock.t += DT
        assert not fake.running()
        # jobs run on the fake == jobs charged in the journal, attempt by attempt (matched by tag). An attempt's
        # id is its job's, except when the engine gave it an id first given to a job queued unseen and the
        # result was gone before it could be read (open, docs/fleet.md): then it is charged at its bound
        bills = fake.bills()
        attempts = check_money(b, [(job["tag"], job["id"], bills[job["id"]]) for job in fake.store.all()],
                               wrong_id_allowed=lambda a: a["estimated"] == 1 and bool(s["ids_reused"]))
        by_tag = {a["tag"]: a for a in attempts if a["tag"]}
        for job in fake.store.all():
            a = by_tag[job["tag"]]
            if s["billing_faults"][which(job["input"])] and a["job_id"] and a["cost_usd"] > 0:
                assert a["estimated"] == 1, (a, s)   # a garbled bill is never taken as given
        queued = {job["tag"] for job in fake.store.all()}
        costs = b.run_costs()
        if budget is not None:
            assert fake.bill() <= budget + per_job + 1e-9
        # what the schedule exercised (pytest --hypothesis-show-statistics)
        event(f"attempts charged at their bound: {'yes' if costs.estimated else 'no'}")
        event(f"an id answered twice: {'yes' if fake.reused_ids == 0 and s['ids_reused'] and len(fake._given) > 1 else 'no'}")
        event(f"billing fields garbled: {'yes' if any(s['billing_faults']) else 'no'}")
        event(f"cancels sent: {'yes' if fake.calls['cancel'] else 'no'}")
        event(f"jobs sent again: {'yes' if len(attempts) > len(handles) else 'no'}")
        event(f"jobs queued unseen: {'yes' if any(a['job_id'] is None and a['tag'] in queued for a in attempts) else 'no'}")
        refused = {a["key"] for a in attempts if "HTTP 429" in (a["error"] or "")}
        event(f"a job refused 429 then run: {'yes' if refused & {a['key'] for a in attempts if a['tag'] in queued} else 'no'}")
        event(f"refused by the budget: {'yes' if any('budget exceeded' in r.error for r in results) else 'no'}")
    finally:
        b.close()


@settings(max_examples=200, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(s=schedules())
def test_random_fault_schedules_keep_the_money_rules_and_end_every_job(pool, base_settings, s):
    with tempfile.TemporaryDirectory(prefix="ait-property-") as tmp:
        run_schedule(s, pool, Path(tmp), base_settings)
