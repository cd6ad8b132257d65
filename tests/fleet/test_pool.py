"""``python -m fleet.pool up|status|down`` against the fake of SkyPilot's SDK (tests/fakes/fake_sky.py): up
applies the pool YAML, status prints workers, queue and $/h at the dated pod price, down leaves no worker
listed (and says so, exit 1, when one is); ``--print`` needs no SkyPilot."""

from __future__ import annotations

from fleet import pool, prices
from fleet.skypilot_engine import SkySDK
from tests.fakes.fake_sky import FakeSky


def test_up_status_down(capsys):
    sky = FakeSky(3, instant=True, instant_output=lambda b: {})
    try:
        sdk = SkySDK(sky)
        assert pool.main(["status"], sdk) == 1 and "not found" in capsys.readouterr().out
        assert pool.main(["up"], sdk) == 2 and "no worker image" in capsys.readouterr().err
        assert pool.main(["up", "--image", "docker:reg/ait-worker:rev1"], sdk) == 0
        assert sky.pools["ait-workers"]["pool"]["max_workers"] == 16
        assert sky.pools["ait-workers"]["resources"]["image_id"] == "docker:reg/ait-worker:rev1"
        assert pool.main(["status"], sdk) == 0
        out = capsys.readouterr().out
        rate = prices.pod_price_per_s("NVIDIA RTX A5000") * 3600
        gpus = pool.gpus_per_worker(pool.load_spec())
        assert "3 workers (0 busy)" in out and f"${3 * gpus * rate:.2f}/h" in out
        assert pool.main(["down", "--wait", "1"], sdk) == 0 and "no worker listed" in capsys.readouterr().out
    finally:
        sky.close()


def test_down_says_when_a_worker_is_still_listed(capsys):
    sky = FakeSky(1, instant=True, instant_output=lambda b: {})
    sky.jobs.pool_down = lambda *a, **k: sky._request(lambda: None)   # a pool down that removes nothing
    try:
        sdk = SkySDK(sky)
        pool.main(["up", "--image", "docker:reg/ait-worker:rev1"], sdk)
        assert pool.main(["down", "--wait", "0"], sdk) == 1
        assert "still listed" in capsys.readouterr().err
    finally:
        sky.close()


def test_print_needs_no_skypilot(capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "sky", None)
    assert pool.main(["up", "--print"]) == 0
    out = capsys.readouterr().out
    assert "min_workers: 0" in out and "RTXA5000" in out and "gpu.worker --selfcheck" in out
    assert pool.main(["status"]) == 3                       # the missing extra's one line and status
    err = capsys.readouterr().err
    assert "'skypilot' extra" in err and "VENV=.venv-sky bash scripts/setup.sh skypilot" in err and len(err.splitlines()) == 1


def test_cost_lists_the_pools_workers_and_the_jobs_controller_and_says_what_keeps_billing(capsys):
    sky = FakeSky(2, instant=True, instant_output=lambda b: {}, worker_usd_per_h=3600.0)
    sky.other_clusters = [{"name": "sky-jobs-controller-1a2b3c4d", "total_cost": 0.125, "usage_intervals": []},
                          {"name": "someone-elses-cluster", "total_cost": 9.0, "usage_intervals": []},
                          {"name": "ait-workers-x", "total_cost": 5.0, "usage_intervals": []}]
    try:
        sdk = SkySDK(sky)
        assert pool.main(["up", "--image", "docker:reg/ait-worker:rev1"], sdk) == 0
        capsys.readouterr()
        assert pool.main(["cost"], sdk) == 0
        out = capsys.readouterr().out
    finally:
        sky.close()
    assert "worker     ait-workers-1" in out and "worker     ait-workers-2" in out
    assert "controller sky-jobs-controller-1a2b3c4d" in out and "$0.1250" in out
    assert "someone-elses-cluster" not in out and "ait-workers-x" not in out   # not this pool's
    assert "billing now: 2 workers" in out
    assert "min_workers=0" in out and "python -m fleet.pool down" in out


def test_cost_says_when_skypilot_cannot_answer(capsys):
    sky = FakeSky(1, instant=True, instant_output=lambda b: {})
    sky.cost_report = lambda days=None: sky._request(lambda: (_ for _ in ()).throw(ConnectionError("refused")))
    try:
        assert pool.main(["cost"], SkySDK(sky)) == 2
    finally:
        sky.close()
    assert "cost report failed" in capsys.readouterr().err


def test_the_lifecycle_note_names_what_bills_after_a_run():
    spec = pool.load_spec()
    assert "min_workers=0" in pool.lifecycle_note(spec) and "(those bill" not in pool.lifecycle_note(spec)
    floor = pool.lifecycle_note(spec.model_copy(update={"min_workers": 2}))
    assert "min_workers=2 (those bill until `python -m fleet.pool down`)" in floor
    assert "3 fixed workers bill" in pool.lifecycle_note(spec.model_copy(update={"workers": 3}))
