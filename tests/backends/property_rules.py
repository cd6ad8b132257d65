"""The money rules both engines' property tests check (test_runpod_property.py, test_skypilot_property.py),
in one place: driving a backend on a simulated clock through a schedule, and checking the journal against
the provider's own bill, attempt by attempt and in all."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def drive(b: Any, jobs: list[Any], s: dict[str, Any], clock: Any, *, dt: float, limit_s: float,
          budget: float | None, per_job: float) -> tuple[dict[int, Any], list[Any]]:
    """Submit each job at its ``s["stagger"]`` second and pump until every job ended (within ``limit_s``);
    with a budget, spending stays within it plus one job's bound at every step. Then: nothing in flight, every
    status final, and no job with another job's result. Returns the handles and results."""
    handles: dict[int, Any] = {}
    steps = 0
    while True:
        for i, at in enumerate(s["stagger"]):
            if i not in handles and steps * dt >= at:
                handles[i] = b.submit(jobs[i])
        b.pump()
        if budget is not None:
            c = b.run_costs()
            assert c.jobs + c.idle + c.active <= budget + per_job + 1e-9, (c, budget)
        if len(handles) == s["jobs"] and all(b.dispatch._entries[h.meta["key"]].done.is_set()
                                             for h in handles.values()):
            break
        clock.t += dt
        steps += 1
        assert steps * dt <= limit_s, f"jobs still in flight after {limit_s:.0f} s: {b.journal.in_flight()}"
    assert b.journal.in_flight() == []
    results = [b.wait(h, timeout=0) for h in handles.values()]
    assert {r.status for r in results} <= {"succeeded", "job_failed", "infra_failed"}
    for i, r in zip(handles, results):
        assert r.status == "infra_failed" or r.job_id == jobs[i].job_id, (i, r.job_id, jobs[i].job_id, s)
    return handles, results


def check_money(b: Any, provider_jobs: list[tuple[str, str, float]],
                wrong_id_allowed: Callable[[dict[str, Any]], bool] = lambda a: False) -> list[dict[str, Any]]:
    """``provider_jobs``: (tag, provider id, bill) of every job the provider ran. Each has exactly one journal
    attempt (by tag) with its id, charged at least its bill and, when the bill was read (not estimated), at
    most it; no charge is negative; an attempt that reached no job is free unless charged at its bound; the
    journal's total is at least the provider's bill and at most it plus the bounds and idle estimates charged.
    Returns the journal's attempts."""
    attempts = b.journal.attempts()
    by_tag = {a["tag"]: a for a in attempts if a["tag"]}
    assert len(by_tag) == sum(1 for a in attempts if a["tag"])          # tags are unique
    for tag, job_id, bill in provider_jobs:
        a = by_tag.get(tag)
        assert a is not None, f"provider job {job_id} has no journal attempt"
        assert a["job_id"] in (job_id, None) or wrong_id_allowed(a), (a, job_id)
        assert a["cost_usd"] + a["idle_usd"] >= bill - 1e-9, (a, bill)
        if not a["estimated"]:          # a bill read is taken as the provider bills it, never above
            assert a["cost_usd"] <= bill + 1e-6, (a, bill)
        assert a["cost_usd"] >= 0 and a["idle_usd"] >= 0, a
    reached = {tag for tag, _, _ in provider_jobs}
    for a in attempts:
        if a["tag"] not in reached:     # never reached the provider: free, unless the send had no clear answer
            assert a["cost_usd"] == 0 or a["estimated"] == 1, a
    costs, total = b.run_costs(), sum(bill for _, _, bill in provider_jobs)
    assert costs.jobs + costs.idle >= total - 1e-9
    slack = sum(a["cost_usd"] + a["idle_usd"] if a["estimated"] else a["idle_usd"] for a in attempts)
    assert costs.jobs + costs.idle <= total + slack + 1e-6
    return attempts

