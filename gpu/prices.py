"""One dated Runpod price sheet and the cost of GPU time.

Contract: :data:`PRICE_SHEET` holds, per Runpod GPU type id (the exact strings of Runpod's
``references/gpu-types`` page, ``/work/shared/notes/runpod.md`` §2.3), the Serverless flex and active
prices in USD per GPU-second, the on-demand pod price in USD per GPU-hour and the VRAM. Every figure
carries its source and the date of that source in :attr:`GpuPrice.sources`; a figure with no source
is marked ``ASSUMPTION``. Prices move: read them live at run time before sizing a budget, and update
this sheet (and its ``date``) when they do. :func:`cost_usd` is the only place that turns seconds
into dollars for the fleet simulator and the bench matrix.

Each GPU type also names its Serverless **pool** (what Runpod's REST v2 ``gpu.pools`` takes,
:class:`gpu.runpod_api.EndpointSpec.gpu_type_ids`; ``references/gpu-types.mdx``, "GPU pools"):
:func:`pool_of`, :func:`price_per_s` and :func:`cost_per_hour` (what ``python -m gpu.endpoint`` prints)
read the same figures by pool. Online, ``GET https://api.runpod.io/v2/catalog/gpus`` gives
``price.serverless`` per type's ``pool`` (``api-reference-v2/openapi.json``, ``GpuType``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Kind = Literal["flex", "active", "pod"]

SERVERLESS_DOCS = ("runpod/docs `snippets/serverless-gpu-pricing-table.mdx` "
                   "(docs.runpod.io/serverless/pricing), commit e5571ba1 of 2026-06-08: flex $/s")
ACTIVE_DOCS = ("runpod/docs `snippets/serverless-gpu-pricing-table.mdx` before commit d1accc4b (version of "
               "2025-08-25): active $/s; the current page (2026-07-20) says active discounts come 'through "
               "sales inquiry'")
SKYPILOT = ("SkyPilot catalog v8 runpod/vms.csv (commit 01acdfd4, undated; notes/runpod.md §3): "
            "Secure Cloud $/GPU-h")
DATARECEIPTS = ("datareceipts 109-gpu-pricing vendors.json, runpod.io/pricing read on 2026-11-09: "
                "Secure Cloud $/GPU-h")
CARSONPO = ("carsonpo/gpus costs/runpod.md (undated third-party copy of runpod.io/pricing): "
            "Secure Cloud $/GPU-h")
GPU_TYPES = "runpod/docs references/gpu-types.mdx (table generated 2026-02-12): id and VRAM"


@dataclass(frozen=True)
class GpuPrice:
    """Prices of one GPU type, per GPU (a 2-GPU worker or pod costs twice this)."""

    serverless_flex_usd_s: float
    serverless_active_usd_s: float
    pod_usd_h: float
    vram_gb: int
    serverless_tier: str = ""
    sources: tuple[str, ...] = ()
    pool: str = ""   # Runpod's Serverless pool id (REST v2 gpu.pools)

    def usd_per_second(self, kind: Kind = "flex") -> float:
        if kind == "flex":
            return self.serverless_flex_usd_s
        if kind == "active":
            return self.serverless_active_usd_s
        if kind == "pod":
            return self.pod_usd_h / 3600.0
        raise ValueError(f"price kind {kind!r}: expected 'flex', 'active' or 'pod'")


@dataclass(frozen=True)
class PriceSheet:
    date: str
    source: str
    gpus: dict[str, GpuPrice] = field(default_factory=dict)


PRICE_SHEET = PriceSheet(
    date="2026-12-01",
    source=("compiled 2026-12-01 from stored copies of docs.runpod.io (runpod/docs mirror a900806e, "
            "2026-08-20) and third-party snapshots of runpod.io/pricing; see each GpuPrice.sources"),
    gpus={
        "NVIDIA RTX A5000": GpuPrice(
            0.00019, 0.00013, 0.27, 24, "L4, A5000, 3090",
            (SERVERLESS_DOCS, ACTIVE_DOCS, SKYPILOT, GPU_TYPES), pool="AMPERE_24"),
        "NVIDIA GeForce RTX 4090": GpuPrice(
            0.00031, 0.00021, 0.74, 24, "4090 PRO",
            (SERVERLESS_DOCS, ACTIVE_DOCS, SKYPILOT, GPU_TYPES), pool="ADA_24"),
        "NVIDIA L40S": GpuPrice(
            0.00053, 0.00037, 0.86, 48, "L40, L40S, 6000 Ada PRO",
            (SERVERLESS_DOCS, ACTIVE_DOCS, CARSONPO, GPU_TYPES), pool="ADA_48_PRO"),
        "NVIDIA A100 80GB PCIe": GpuPrice(
            0.00076, 0.00060, 1.79, 80, "A100",
            (SERVERLESS_DOCS, ACTIVE_DOCS, DATARECEIPTS, GPU_TYPES), pool="AMPERE_80"),
        "NVIDIA H100 80GB HBM3": GpuPrice(
            0.00116, 0.00093, 3.99, 80, "H100 PRO",
            (SERVERLESS_DOCS, ACTIVE_DOCS, DATARECEIPTS, GPU_TYPES,
             "ASSUMPTION: the docs' 'H100 PRO' Serverless tier includes the H100 SXM (80GB HBM3)"),
            pool="ADA_80_PRO"),
    },
)


def cost_usd(gpu_type: str, seconds: float, gpus: int = 1, kind: str = "flex") -> float:
    """USD for ``gpus`` GPUs of ``gpu_type`` billed ``seconds`` at the ``kind`` price.

    ``kind``: ``"flex"`` (Serverless flex worker), ``"active"`` (Serverless active worker) or
    ``"pod"`` (on-demand pod, the $/h price per second). No rounding: Runpod rounds each worker's billed
    time up to a whole second; the caller rounds the seconds it bills.
    """
    try:
        price = PRICE_SHEET.gpus[gpu_type]
    except KeyError:
        raise KeyError(f"no price for GPU type {gpu_type!r}; known: {sorted(PRICE_SHEET.gpus)}") from None
    if seconds < 0 or gpus < 1:
        raise ValueError(f"cost_usd: seconds must be >= 0 and gpus >= 1 (got {seconds}, {gpus})")
    return price.usd_per_second(kind) * seconds * gpus  # type: ignore[arg-type]


def pool_of(gpu_type: str) -> str:
    """The Serverless pool id of ``gpu_type`` (``KeyError`` naming the known types)."""
    try:
        return PRICE_SHEET.gpus[gpu_type].pool
    except KeyError:
        raise KeyError(f"no price for GPU type {gpu_type!r}; known: {sorted(PRICE_SHEET.gpus)}") from None


def price_per_s(pool: str, active: bool = False) -> float:
    """$/s for one GPU of Serverless ``pool`` (the flex price, or the active one); ``KeyError`` naming the
    known pools for another id."""
    for price in PRICE_SHEET.gpus.values():
        if price.pool == pool:
            return price.usd_per_second("active" if active else "flex")
    known = sorted(p.pool for p in PRICE_SHEET.gpus.values())
    raise KeyError(f"no price for GPU pool {pool!r} (known: {known}); add its GPU type to gpu/prices.py from "
                   "GET /v2/catalog/gpus (price.serverless)")


def cost_per_hour(pools: list[str], gpu_count: int, workers: int, active: bool) -> tuple[float, str]:
    """$/h of ``workers`` workers of ``gpu_count`` GPUs on the first pool that has a price (the priority
    pool; Runpod may place workers on a later one), and a note saying what the figure rests on."""
    for pool in pools:
        try:
            rate = price_per_s(pool, active)
        except KeyError:
            continue
        note = f"{pool} at ${rate:.5f}/GPU-s (gpu/prices.py, sheet of {PRICE_SHEET.date})"
        if active:
            note += ("; the active rate is the docs' 2025 figure, assumed still valid (the current page "
                     "publishes none)")
        return workers * gpu_count * rate * 3600, note
    return float("nan"), f"no price known for {pools}: add it to gpu/prices.py"
