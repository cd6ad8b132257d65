"""gpu/prices.py: the price sheet is dated, sourced and positive; cost_usd does the arithmetic."""

from __future__ import annotations

import datetime as dt

import pytest

from gpu.prices import PRICE_SHEET, GpuPrice, cost_usd

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
