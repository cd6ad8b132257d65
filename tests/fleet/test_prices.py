"""fleet/prices.py: the price sheet is dated, sourced and positive; cost_usd does the arithmetic."""

from __future__ import annotations

import datetime as dt

import pytest

from fleet.prices import PRICE_SHEET, GpuPrice, cost_usd

#: Runpod's GPU type ids (notes/runpod.md §2.3, from docs references/gpu-types.mdx)
RUNPOD_IDS = {"NVIDIA RTX A5000", "NVIDIA GeForce RTX 4090", "NVIDIA L40S", "NVIDIA A100 80GB PCIe",
              "NVIDIA H100 80GB HBM3"}


def test_sheet_is_dated_and_sourced() -> None:
    dt.date.fromisoformat(PRICE_SHEET.date)
    assert PRICE_SHEET.source
    assert set(PRICE_SHEET.gpus) == RUNPOD_IDS
    for gpu, price in PRICE_SHEET.gpus.items():
        assert isinstance(price, GpuPrice)
        assert price.sources, gpu
        assert any("20" in s for s in price.sources), f"{gpu}: no dated source"


@pytest.mark.parametrize("gpu", sorted(RUNPOD_IDS))
def test_prices_positive_and_consistent(gpu: str) -> None:
    p = PRICE_SHEET.gpus[gpu]
    assert p.serverless_flex_usd_s > 0 and p.serverless_active_usd_s > 0 and p.pod_usd_h > 0
    assert p.vram_gb >= 24
    assert p.serverless_active_usd_s <= p.serverless_flex_usd_s
    assert p.serverless_flex_usd_s * 3600 < 10  # per GPU-second, not per hour


def test_sheet_api() -> None:
    """The API other branches rely on: PRICE_SHEET.date/.source/.gpus (a dict of GpuPrice)."""
    assert isinstance(PRICE_SHEET.gpus, dict)
    fields = {"serverless_flex_usd_s", "serverless_active_usd_s", "pod_usd_h", "vram_gb"}
    assert fields <= set(GpuPrice.__dataclass_fields__)


def test_cost_usd() -> None:
    a5000 = PRICE_SHEET.gpus["NVIDIA RTX A5000"]
    assert cost_usd("NVIDIA RTX A5000", 100, 2) == pytest.approx(200 * a5000.serverless_flex_usd_s)
    active = cost_usd("NVIDIA RTX A5000", 100, 1, "active")
    assert active == pytest.approx(100 * a5000.serverless_active_usd_s)
    assert cost_usd("NVIDIA RTX A5000", 3600, 2, "pod") == pytest.approx(2 * a5000.pod_usd_h)
    assert cost_usd("NVIDIA RTX A5000", 0) == 0
    with pytest.raises(KeyError, match="known"):
        cost_usd("NVIDIA RTX 4090", 1)  # not Runpod's id: "NVIDIA GeForce RTX 4090"
    with pytest.raises(ValueError, match="price kind"):
        cost_usd("NVIDIA RTX A5000", 1, 1, "spot")
    with pytest.raises(ValueError):
        cost_usd("NVIDIA RTX A5000", -1)


def test_active_workers_cost_the_flex_rate_unless_a_rate_was_negotiated(tmp_path):
    """Issue 32, item 4: Runpod's docs unified the flex and active prices on 2026-05-13 (runpod/docs commit
    d1accc4b): an active worker is billed at the flex rate, or at a negotiated one the user configures; the
    2025 active column is only the simulator's what-if. The backend's active-worker charge follows."""
    from ait_env.backends.runpod import RunpodBackend
    from fleet import prices
    from tests.backends.test_runpod_backend import settings
    from tests.fakes.runpod_client import FakeServerlessClient

    assert prices.UNIFIED_SINCE == "2026-05-13" and "d1accc4b" in prices.ACTIVE_DOCS
    for pool, flex in prices.FLEX_USD_PER_S.items():
        assert prices.price_per_s(pool, active=True) == flex
    assert prices.price_per_s("AMPERE_24", active=True, negotiated=0.0001) == 0.0001
    assert prices.price_per_s("AMPERE_24", active=False, negotiated=0.0001) == 0.00019   # flex is flex
    assert prices.active_2025_per_s("AMPERE_24") == 0.00013                            # the what-if only
    fake = FakeServerlessClient()
    with RunpodBackend(settings(workers_min=1), tmp_path / "a", show_progress=False, client=fake) as b:
        assert b.endpoint_costs.active_usd_per_gpu_s == 0.00019
        assert "flex (one price since 2026-05-13)" in b.endpoint_costs.source
    with RunpodBackend(settings(workers_min=1, active_usd_per_gpu_s=0.00012), tmp_path / "n",
                       show_progress=False, client=fake) as b:
        assert b.endpoint_costs.active_usd_per_gpu_s == 0.00012
        (session,) = b.journal.sessions()
        assert session.active_usd_per_s == pytest.approx(1 * 2 * 0.00012)
