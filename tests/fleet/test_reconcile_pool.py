"""python -m fleet.reconcile_pool: a skypilot run's journal against SkyPilot's cost report of the pool's worker
clusters (tests/fakes/fake_sky.py, ``sky.cost_report``): only the pool's clusters count, costs are spread over
their usage intervals and split across bucket boundaries, an open interval runs to now, the verdicts and exit
statuses (0 agree, 1 not, 2 no journal, 3 no SkyPilot SDK)."""

from __future__ import annotations

import json
import math
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet import reconcile_pool as rp
from fleet.reconcile import journal_buckets
from fleet.skypilot_engine import JOURNAL_NAME, SkySDK
from tests.backends.test_runpod_backend import bundles
from tests.backends.test_skypilot_backend import backend, fake, run_all

DAY = 86400


def _run(tmp_path: Path, n: int = 3):
    sky = fake(2, job_s=0.2)
    try:
        with backend(tmp_path, sky) as b:
            results = run_all(b, bundles(tmp_path, n))
            spent = b.dispatch.run_costs().total              # jobs + the per-job idle estimate
    finally:
        sky.close()
    assert all(r.status == "succeeded" for r in results)
    return sky, tmp_path / "runs", spent


def test_only_the_pools_workers_count_and_the_journal_side_is_the_runs_spend(tmp_path):
    sky, runs, spent = _run(tmp_path)
    sky.other_clusters = [
        {"name": "sky-jobs-controller-1a2b", "usage_intervals": [(int(sky.up_at), None)], "total_cost": 5.0},
        {"name": "ait-workers2-1", "usage_intervals": [(int(sky.up_at), int(sky.up_at) + 60)], "total_cost": 7.0},
        {"name": "ait-workers-x", "usage_intervals": [(int(sky.up_at), int(sky.up_at) + 60)], "total_cost": 9.0}]
    report = rp.reconcile_pool(SkySDK(sky), [runs], "ait-workers", bucket="hour")
    assert report.workers == ["ait-workers-1", "ait-workers-2"]
    workers = [r for r in SkySDK(sky).cost_report() if rp.is_worker(r["name"], "ait-workers")]
    assert report.total.skypilot_usd == pytest.approx(sum(r["total_cost"] for r in workers), abs=1e-4)
    assert report.total.journal_usd == pytest.approx(spent, abs=1e-4) and spent > 0
    assert report.total.difference_usd == pytest.approx(report.total.skypilot_usd - report.total.journal_usd,
                                                        abs=2e-4)


def test_costs_follow_usage_intervals_across_buckets_and_an_open_one_runs_to_now():
    t0 = 10 * DAY + DAY - 3600                                # one hour before a day's end
    now = 11 * DAY + 7200                                     # two hours into the next
    records = [{"name": "p-1", "usage_intervals": [(t0, t0 + 7200)], "total_cost": 2.0},   # 1 h each side
               {"name": "p-2", "usage_intervals": [(t0, t0 + 1800), (11 * DAY, None)], "total_cost": 5.0},
               {"name": "q-1", "usage_intervals": [(t0, t0 + 60)], "total_cost": 100.0}]
    buckets, names = rp.worker_buckets(records, "p", DAY, now=now)
    assert names == ["p-1", "p-2"]
    # p-2: 1,800 s before midnight, 7,200 s after it (open, to now): 5 x 1800/9000 and 5 x 7200/9000
    assert buckets[10 * DAY] == pytest.approx(1.0 + 1.0)
    assert buckets[11 * DAY] == pytest.approx(1.0 + 4.0)


def test_verdicts_and_exit_statuses(tmp_path, capsys):
    sky, runs, spent = _run(tmp_path, 2)
    ours = journal_buckets([runs], DAY, journal_name=JOURNAL_NAME)
    (day, parts), = ours.items()
    mid = day + DAY // 2
    # SkyPilot's figure equal to the journal's: ok, exit 0
    sky.capacity = 0
    sky.other_clusters = [{"name": "ait-workers-1", "usage_intervals": [(mid, mid + 10)], "total_cost": parts.total}]
    assert rp.main(["--runs-dir", str(runs), "--pool", "ait-workers", "--json"], sdk=SkySDK(sky)) == 0
    report = rp.PoolReport.model_validate_json(capsys.readouterr().out)
    assert report.agrees and report.total.verdict == "ok"
    # a worker kept up an extra hour: SKYPILOT HIGHER, exit 1, and the table says what usually causes it
    sky.other_clusters.append({"name": "ait-workers-2", "usage_intervals": [(mid, mid + 3600)], "total_cost": 0.27})
    assert rp.main(["--runs-dir", str(runs), "--pool", "ait-workers"], sdk=SkySDK(sky)) == 1
    out = capsys.readouterr().out
    assert "SKYPILOT HIGHER" in out and "python -m fleet.pool down" in out and "ait-workers (2 worker clusters)" in out
    # no journal in the run dir: exit 2, which backend writes one
    assert rp.main(["--runs-dir", str(tmp_path / "empty"), "--pool", "ait-workers"], sdk=SkySDK(sky)) == 2
    assert "backend=skypilot" in capsys.readouterr().err


def test_without_skypilots_sdk_it_says_which_extra_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "sky", None)
    assert rp.main(["--runs-dir", str(tmp_path), "--pool", "p"]) == 3
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "'skypilot' extra" in err and "VENV=.venv-sky" in err


def test_the_sdk_call_is_the_pinned_cost_report():
    calls = []

    class Sky:
        def cost_report(self, days=None):
            calls.append(days)
            return "r1"

        def get(self, rid):
            assert rid == "r1"
            return [{"name": "p-1", "total_cost": 1.0}]

    assert SkySDK(Sky()).cost_report(7) == [{"name": "p-1", "total_cost": 1.0}] and calls == [7]


# ------------------------------------------------------------------------------------------------ --correct
def _ledger_parts(path: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        rec = json.loads(line)
        assert rec["usd"] >= 0 and rec["episode_id"] is None
        out[rec["kind"]] = out.get(rec["kind"], 0.0) + rec["usd"]
    return out


def test_correct_makes_the_ledger_total_what_skypilot_says_the_pool_cost_in_the_run(tmp_path, capsys):
    """The pool was up exactly the run's window (its workers, 2 of them, from the run's first session to its
    last job + the tail) and the jobs controller in it: after --correct the run's costs (jobs + idle +
    controller) and its ledger's run parts + jobs equal SkyPilot's report; a second --correct charges nothing;
    a later report with more controller time charges only the difference."""
    from fleet.journal import Journal

    sky, runs, _ = _run(tmp_path, 3)
    journal = Journal(runs / JOURNAL_NAME)
    start, end = rp.run_window(journal, tail_s=120.0)
    sky.up_at, sky.down_at = math.ceil(start), math.floor(end)   # the workers: up in the window (whole seconds)
    sky.other_clusters = [{"name": "sky-jobs-controller-1a2b", "usage_intervals": [(sky.up_at, int(end) + 300)],
                           "total_cost": 0.5}]
    report = SkySDK(sky).cost_report()
    pool_usd = sum(r["total_cost"] for r in report)
    jobs = journal.spent_usd()
    assert 0 < jobs < pool_usd
    argv = ["--runs-dir", str(runs), "--pool", "ait-workers", "--correct", "--tail-s", "120"]
    rp.main(argv, sdk=SkySDK(sky))
    out = capsys.readouterr().out
    assert "charged now" in out and "idle $" in out and "controller $" in out
    costs = journal.run_costs()
    assert costs.measured and costs.total == pytest.approx(pool_usd, abs=1e-5)
    ledger = _ledger_parts(runs / "costs.jsonl")
    assert set(ledger) == {"gpu_idle", "gpu_controller"}
    assert jobs + sum(ledger.values()) == pytest.approx(pool_usd, abs=1e-5)
    rp.main(argv, sdk=SkySDK(sky))                             # again: nothing new
    assert "nothing new" in capsys.readouterr().out
    assert _ledger_parts(runs / "costs.jsonl") == pytest.approx(ledger)
    sky.other_clusters[0]["total_cost"] = 0.7                  # a later report: the controller billed more
    rp.main(argv, sdk=SkySDK(sky))
    capsys.readouterr()
    after = _ledger_parts(runs / "costs.jsonl")
    assert after["gpu_controller"] == pytest.approx(0.7, abs=1e-5) and after["gpu_idle"] == pytest.approx(
        ledger["gpu_idle"])
    # the comparison now holds SkyPilot's idle: the total agrees
    assert rp.reconcile_pool(SkySDK(sky), [runs], "ait-workers").total.verdict == "ok"


def test_correct_never_takes_a_charge_back_and_says_where_the_pool_was_not_a_run(tmp_path, capsys):
    """The per-job idle estimate was already charged and SkyPilot's workers cost less than it: the ledger keeps
    the estimate (never a negative record), the note says so; workers up before the run are not the run's."""
    from ait_env.observe.ledger import CostLedger
    from fleet.journal import Journal
    from fleet.run_charges import charge_run_parts

    sky, runs, _ = _run(tmp_path, 2)
    journal = Journal(runs / JOURNAL_NAME)
    estimate = journal.run_costs().idle
    assert estimate > 0
    charge_run_parts(journal, CostLedger(runs / "costs.jsonl"), journal.run_costs(), {})   # the env did this
    start, end = rp.run_window(journal, tail_s=0.0)
    sky.capacity = 0
    jobs = journal.spent_usd()
    sky.other_clusters = [  # the run's window costs jobs + a tenth of the estimate; an hour before it is extra
        {"name": "ait-workers-1", "usage_intervals": [(start, end)], "total_cost": jobs + estimate / 10},
        {"name": "ait-workers-2", "usage_intervals": [(start - 3600, start - 1800)], "total_cost": 3.0}]
    rp.main(["--runs-dir", str(runs), "--pool", "ait-workers", "--correct", "--tail-s", "0"], sdk=SkySDK(sky))
    out = capsys.readouterr().out
    assert "ledger keeps the estimate" in out and "$3.0000 of the pool's workers falls in no run's window" in out
    assert journal.run_costs().idle == pytest.approx(estimate / 10, rel=1e-3)
    assert _ledger_parts(runs / "costs.jsonl") == pytest.approx({"gpu_idle": estimate})


@settings(max_examples=300, deadline=None)
@given(spans=st.lists(st.tuples(st.floats(0, 100), st.floats(0, 50), st.floats(0, 10)), max_size=6),
       windows=st.lists(st.tuples(st.floats(0, 120), st.floats(0, 60), st.floats(0, 5)), max_size=4))
def test_attribution_conserves_money_and_respects_windows(spans, windows):
    """Whatever the spans and run windows: every dollar goes to exactly one place (a run or uncovered), no
    share is negative, and a run gets nothing of a span outside its window."""
    cost = [(a, a + d, usd) for a, d, usd in spans]
    win = {f"r{i}": (a, a + d) for i, (a, d, _) in enumerate(windows)}
    weights = {f"r{i}": w for i, (_, _, w) in enumerate(windows)}
    out, uncovered = rp.attribute(cost, win, weights)
    assert sum(out.values()) + uncovered == pytest.approx(sum(u for _, _, u in cost), abs=1e-6)
    assert uncovered >= -1e-12 and all(v >= -1e-12 for v in out.values())
    for k, (s, e) in win.items():
        inside = sum(u * (min(b, e) - max(a, s)) / (b - a) if b > a else (u if s <= a <= e else 0.0)
                     for a, b, u in cost if min(b, e) >= max(a, s))
        assert out[k] <= inside + 1e-6
