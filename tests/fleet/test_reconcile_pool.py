"""python -m fleet.reconcile_pool: a skypilot run's journal against SkyPilot's cost report of the pool's worker
clusters (tests/fakes/fake_sky.py, ``sky.cost_report``): only the pool's clusters count, costs are spread over
their usage intervals and split across bucket boundaries, an open interval runs to now, the verdicts and exit
statuses (0 agree, 1 not, 2 no journal, 3 no SkyPilot SDK)."""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

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
