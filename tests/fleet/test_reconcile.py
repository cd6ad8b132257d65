"""python -m fleet.reconcile against the HTTP fake Runpod (tests/gpu/fake_runpod.py, instant mode): a run on
the runpod backend reads its endpoint's idle timeout and active workers, and the journal's jobs + idle +
active agree with what the fake bills per day within the tolerance; an injected charge is flagged; the
client's billing call sends the documented query; charges are split across bucket boundaries; no key, no
journal or no endpoint id is a clear error (exit 2)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone

import pytest

from ait_env.backends.runpod import RunpodBackend
from fleet import prices, reconcile
from fleet.runpod_management import EndpointSpec, ManagementClient
from tests.backends.test_runpod_backend import bundles, run_all, settings
from tests.gpu.fake_runpod import FakeRunpod, fakes

DELAY_MS, EXECUTION_MS, IDLE_S = 2_000, 600_000, 7
FLEX_X2 = prices.FLEX_USD_PER_S["AMPERE_24"] * 2
OUTPUT = {"kind": "job", "baselines": [], "result": {
    "job_id": "w", "backend": "runpod", "status": "succeeded", "post_score": 0.5,
    "worker": {"image_revision": "rev-1", "versions": {}, "gpus": ["NVIDIA RTX A5000 (24564 MiB)"] * 2}}}


@pytest.fixture
def fake_runpod() -> Iterator[Callable[..., FakeRunpod]]:
    with fakes() as make:
        yield make


def test_a_run_reconciles_with_the_fakes_billing_and_an_injected_charge_is_flagged(fake_runpod, tmp_path,
                                                                                    monkeypatch, capsys):
    fake = fake_runpod(instant=True, instant_output=OUTPUT, instant_delay_ms=DELAY_MS,
                       instant_execution_ms=EXECUTION_MS)
    monkeypatch.setenv("RUNPOD_API_KEY", fake.api_key)
    spec = EndpointSpec(name="ait-test", image="img:1", gpu_type_ids=["AMPERE_24"], gpu_count=2,
                        workers_min=1, workers_max=3, idle_timeout_s=IDLE_S)
    with ManagementClient(fake.api_key, base_url=fake.rest_base_url) as mgmt:
        ep = mgmt.create(spec)["id"]
    runs = tmp_path / "runs"
    cfg = settings(endpoint_id=ep, base_url=fake.job_base_url, rest_base_url=fake.rest_base_url)
    with RunpodBackend(cfg, runs, show_progress=False) as b:
        assert (b.endpoint_costs.idle_timeout_s, b.endpoint_costs.workers_min) == (IDLE_S, 1)
        results = run_all(b, bundles(tmp_path, 3))
    costs = b.run_costs()
    assert all(r.status == "succeeded" for r in results)
    assert costs.jobs == pytest.approx(3 * (DELAY_MS + EXECUTION_MS) / 1000 * FLEX_X2)
    assert costs.idle == pytest.approx(3 * IDLE_S * FLEX_X2) and costs.active > 0

    rc = reconcile.main(["--runs-dir", str(runs), "--rest-url", fake.rest_base_url,
                         "--tolerance-pct", "1", "--tolerance-usd", "0.005", "--json"])
    report = reconcile.Report.model_validate_json(capsys.readouterr().out)
    assert rc == 0 and report.agrees and report.endpoint_id == ep        # the endpoint from the journal
    assert report.total.journal_usd == pytest.approx(costs.total, abs=1e-3)
    assert report.total.journal.idle == pytest.approx(costs.idle, abs=1e-6)
    assert abs(report.total.difference_usd) < 0.003                     # active: a second's difference

    fake.bill_extra(0.5, endpoint=ep)                                   # billed, unknown to the journal
    rc = reconcile.main(["--runs-dir", str(runs), "--rest-url", fake.rest_base_url])
    out = capsys.readouterr().out
    assert rc == 1 and "RUNPOD HIGHER" in out and "+0.5" in out and "pass them all with --runs-dir" in out
    assert f"endpoint {ep}" in out and "tolerance max($0.05, 5%)" in out


def test_the_billing_call_sends_the_documented_query(fake_runpod):
    fake = fake_runpod(instant=True, instant_delay_ms=0, instant_execution_ms=10_000)
    fake.submit({"input": {}})
    fake.bill_extra(1.0, endpoint="another-endpoint")
    start = datetime.now(timezone.utc) - timedelta(hours=2)
    with ManagementClient(fake.api_key, base_url=fake.rest_base_url) as mgmt:
        one = mgmt.billing(start, start + timedelta(hours=3), "hour", serverless_id=fake.endpoint_id)
        every = mgmt.billing(start, start + timedelta(hours=3), "hour")
        with pytest.raises(ValueError, match="bucket size 'minute'"):
            mgmt.billing(start, start, "minute")  # type: ignore[arg-type]
    q = one["metadata"]["query"]
    assert q["bucketSize"] == "hour" and q["serverlessId"] == fake.endpoint_id
    assert q["startTime"].endswith(":00:00Z")                           # snapped to the bucket
    assert {r["serverlessId"] for r in one["records"]} == {fake.endpoint_id}
    assert {r["serverlessId"] for r in every["records"]} == {fake.endpoint_id, "another-endpoint"}
    assert sum(r["gpuAmount"] for r in one["records"]) == pytest.approx(
        10 * FLEX_X2 + 5 * FLEX_X2)                                     # execution + the default idle 5 s


def test_a_charge_across_a_boundary_is_split_in_proportion():
    midnight = datetime(2026, 12, 2, tzinfo=timezone.utc).timestamp()
    parts = reconcile.spread(midnight - 30, midnight + 90, 1.2, 86400)
    assert parts == {int(midnight) - 86400: pytest.approx(0.3), int(midnight): pytest.approx(0.9)}
    assert reconcile.spread(midnight + 5, midnight + 5, 0.7, 3600) == {int(midnight): 0.7}


def test_without_a_key_a_journal_or_an_endpoint_id_it_says_what_to_do(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("RUNPOD_API_KEY", raising=False)
    assert reconcile.main(["--runs-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "RUNPOD_API_KEY is not set" in err and "Settings > API Keys" in err
    monkeypatch.setenv("RUNPOD_API_KEY", "rp-some-key")
    assert reconcile.main(["--runs-dir", str(tmp_path)]) == 2
    assert "pass --endpoint-id" in capsys.readouterr().err
    assert reconcile.main(["--runs-dir", str(tmp_path), "--endpoint-id", "ep", "--rest-url",
                           "http://127.0.0.1:9"]) == 2
    assert "no journal at" in capsys.readouterr().err


def test_the_table_names_every_part(fake_runpod, tmp_path, monkeypatch, capsys):
    fake = fake_runpod(instant=True, instant_output=OUTPUT, instant_delay_ms=DELAY_MS,
                       instant_execution_ms=EXECUTION_MS)
    monkeypatch.setenv("RUNPOD_API_KEY", fake.api_key)
    cfg = settings(endpoint_id=fake.endpoint_id, base_url=fake.job_base_url, read_endpoint=False,
                   idle_timeout_s=5)
    with RunpodBackend(cfg, tmp_path / "runs", show_progress=False) as b:
        run_all(b, bundles(tmp_path, 1))
    assert reconcile.main(["--runs-dir", str(tmp_path / "runs"), "--rest-url", fake.rest_base_url]) == 0
    out = capsys.readouterr().out
    for word in ("bucket (UTC)", "jobs", "idle", "active", "journal", "runpod", "other", "diff", "verdict",
                 "total", " ok"):
        assert word in out


def test_correct_replaces_an_estimated_attempt_by_the_bill_it_reads_later(tmp_path):
    """Issue 32, item 2: an attempt unreadable up to its deadline is charged at its bound (estimated);
    ``correct_estimates`` (``--correct``) later reads its status and journals the real bill, which is what
    the fake bills for it. An attempt without a Runpod id stays a bound."""
    import time

    from fleet.journal import Billing, Journal
    from tests.fakes.runpod_client import FakeServerlessClient

    fake = FakeServerlessClient(clock=time.time, timing=lambda inp, n: (0.05, 30.0 if n == 1 else 0.2))
    fake.outage_until_resend("status")   # unreadable past its deadline however busy the machine (issue 46)
    runs = tmp_path / "runs"
    with RunpodBackend(settings(poll_interval_s=0.02, deadline_s=1.0), runs, show_progress=False,
                       client=fake) as b:
        (job,) = bundles(tmp_path, 1)
        assert b.run(job, timeout=30).status == "succeeded"
        bound = b.run_costs().estimated
    assert bound > 0
    Journal.in_run_dir(runs).claim("lost", claimant="x")
    Journal.in_run_dir(runs).finish("lost", None, "infra_failed", "answer lost", Billing(cost_usd=0.01,
                                                                                         estimated=True))
    first = min(fake.store.all(), key=lambda j: j["created"])
    out = reconcile.correct_estimates([runs], fake)
    read = next(c for c in out if c.job_id == first["id"])
    assert read.read_usd == pytest.approx(fake.bills()[first["id"]]) and read.read_usd <= read.bound_usd
    assert next(c for c in out if c.job_id is None).why_not.startswith("no Runpod id")
    assert reconcile.estimated_usd([runs]) == pytest.approx(0.01)       # only the one without an id is left
