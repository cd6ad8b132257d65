"""One dated Runpod price sheet and the cost of GPU time.

Contract: :data:`PRICE_SHEET` holds, per Runpod GPU type id (the exact strings of Runpod's
``references/gpu-types`` page), the Serverless flex and active
prices in USD per GPU-second, the on-demand pod price in USD per GPU-hour and the VRAM. Every figure
carries its source and the date of that source in :attr:`GpuPrice.sources`; a figure with no source
is marked ``ASSUMPTION``. Prices move: read them live at run time before sizing a budget, and update
this sheet (and its ``date``) when they do. :func:`cost_usd` is the only place that turns seconds
into dollars for the fleet simulator and the bench matrix.

Each GPU type also names its Serverless **pool** (what Runpod's REST v2 ``gpu.pools`` takes,
:class:`fleet.runpod_management.EndpointSpec.gpu_type_ids`; ``references/gpu-types.mdx``, "GPU pools"):
:func:`pool_of`, :func:`price_per_s` and :func:`cost_per_hour` (what ``python -m fleet.endpoint`` prints)
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
               "2025-08-25): active $/s, a 2025 figure kept for the simulator's what-if only; d1accc4b of "
               "2026-05-13 ('unified pricing for flex and active workers') removed the column, and the "
               "current page (2026-07-20) says active discounts come 'through sales inquiry'")
#: the date Runpod's docs unified the flex and active prices (runpod/docs commit d1accc4b, 2026-05-13:
#: "Both worker types are billed at the same per-second rate"): since then an active worker costs the flex
#: rate unless a discount was negotiated with Runpod's sales (then pass it as ``negotiated``)
UNIFIED_SINCE = "2026-05-13"
SKYPILOT = ("SkyPilot catalog v8 runpod/vms.csv (commit 01acdfd4, undated): "
            "Secure Cloud $/GPU-h")
DATARECEIPTS = ("datareceipts 109-gpu-pricing vendors.json, runpod.io/pricing read on 2026-11-09: "
                "Secure Cloud $/GPU-h")
CARSONPO = ("carsonpo/gpus costs/runpod.md (undated third-party copy of runpod.io/pricing): "
            "Secure Cloud $/GPU-h")
GPU_TYPES = "runpod/docs references/gpu-types.mdx (table generated 2026-02-12): id and VRAM"


AS_OF = "2026-06-08"   # the date of the Serverless flex table below (SERVERLESS_DOCS)

#: $/s per GPU of a Serverless **flex** worker, by pool id (SERVERLESS_DOCS: "Cost per second" per GPU class;
#: class -> pool from references/gpu-types.mdx "GPU pools"; the two Blackwell pool ids are our mapping)
FLEX_USD_PER_S: dict[str, float] = {
    "AMPERE_16": 0.00016,       # A4000, A4500, RTX 4000 (16 GB)
    "AMPERE_24": 0.00019,       # L4, A5000, 3090 (24 GB)
    "ADA_24": 0.00031,          # 4090 PRO (24 GB)
    "AMPERE_48": 0.00034,       # A6000, A40 (48 GB)
    "ADA_48_PRO": 0.00053,      # L40, L40S, 6000 Ada PRO (48 GB)
    "AMPERE_80": 0.00076,       # A100 (80 GB)
    "ADA_80_PRO": 0.00116,      # H100 PRO (80 GB)
    "BLACKWELL_96": 0.00111,    # 6000s PRO (96 GB); pool id mapping assumed
    "HOPPER_141": 0.00155,      # H200 PRO (141 GB)
    "BLACKWELL_180": 0.00240,   # B200 (180 GB); pool id mapping assumed
}
#: $/s per GPU of an **active** (always-on) worker in the **2025** table (ACTIVE_DOCS), by pool id. Stale since
#: UNIFIED_SINCE: only the fleet simulator's what-if (``active_discount``) reads it; bills use
#: :func:`price_per_s` (the flex rate, or a negotiated one)
ACTIVE_2025_USD_PER_S: dict[str, float] = {"AMPERE_24": 0.00013, "ADA_24": 0.00021, "ADA_48_PRO": 0.00037,
                                      "AMPERE_80": 0.00060, "ADA_80_PRO": 0.00093}
#: GPU name as a worker reports it (``nvidia-smi``; the longest matching prefix wins) -> its pool
GPU_POOLS: dict[str, str] = {
    "NVIDIA RTX A4000": "AMPERE_16", "NVIDIA RTX A4500": "AMPERE_16", "NVIDIA RTX 4000": "AMPERE_16",
    "NVIDIA L4": "AMPERE_24", "NVIDIA RTX A5000": "AMPERE_24", "NVIDIA GeForce RTX 3090": "AMPERE_24",
    "NVIDIA GeForce RTX 4090": "ADA_24", "NVIDIA RTX A6000": "AMPERE_48", "NVIDIA A40": "AMPERE_48",
    "NVIDIA L40": "ADA_48_PRO", "NVIDIA RTX 6000 Ada": "ADA_48_PRO", "NVIDIA A100": "AMPERE_80",
    "NVIDIA H100": "ADA_80_PRO", "NVIDIA H200": "HOPPER_141", "NVIDIA B200": "BLACKWELL_180",
}


def pool_for_gpu(gpu_name: str, extra: dict[str, str] | None = None) -> str | None:
    """The pool of a GPU name (:data:`GPU_POOLS` plus ``extra``, longest prefix); None when unknown."""
    table = {**GPU_POOLS, **(extra or {})}
    hits = [k for k in table if gpu_name.lower().startswith(k.lower())]
    return table[max(hits, key=len)] if hits else None


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


def _gpu(pool: str, pod_usd_h: float, vram_gb: int, tier: str, sources: tuple[str, ...]) -> GpuPrice:
    """A sheet entry whose Serverless prices are its pool's (one table: :data:`FLEX_USD_PER_S`)."""
    return GpuPrice(FLEX_USD_PER_S[pool], ACTIVE_2025_USD_PER_S.get(pool, FLEX_USD_PER_S[pool]), pod_usd_h,
                    vram_gb, tier, sources, pool)


PRICE_SHEET = PriceSheet(
    date="2026-12-01",
    source=("compiled 2026-12-01 from stored copies of docs.runpod.io (runpod/docs mirror a900806e, "
            "2026-08-20) and third-party snapshots of runpod.io/pricing; see each GpuPrice.sources"),
    gpus={
        "NVIDIA RTX A5000": _gpu("AMPERE_24", 0.27, 24, "L4, A5000, 3090",
            (SERVERLESS_DOCS, ACTIVE_DOCS, SKYPILOT, GPU_TYPES)),
        "NVIDIA GeForce RTX 4090": _gpu("ADA_24", 0.74, 24, "4090 PRO",
            (SERVERLESS_DOCS, ACTIVE_DOCS, SKYPILOT, GPU_TYPES)),
        "NVIDIA L40S": _gpu("ADA_48_PRO", 0.86, 48, "L40, L40S, 6000 Ada PRO",
            (SERVERLESS_DOCS, ACTIVE_DOCS, CARSONPO, GPU_TYPES)),
        "NVIDIA A100 80GB PCIe": _gpu("AMPERE_80", 1.79, 80, "A100",
            (SERVERLESS_DOCS, ACTIVE_DOCS, DATARECEIPTS, GPU_TYPES)),
        "NVIDIA H100 80GB HBM3": _gpu("ADA_80_PRO", 3.99, 80, "H100 PRO",
            (SERVERLESS_DOCS, ACTIVE_DOCS, DATARECEIPTS, GPU_TYPES,
             "ASSUMPTION: the docs' 'H100 PRO' Serverless tier includes the H100 SXM (80GB HBM3)")),
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


def price_per_s(pool: str, active: bool = False, negotiated: float | None = None) -> float:
    """$/s for one GPU of Serverless ``pool``: the flex rate, for active workers too (one price since
    :data:`UNIFIED_SINCE`), unless ``active`` and a ``negotiated`` active rate (a sales discount) is given.
    ``KeyError`` naming the known pools for another id."""
    if pool not in FLEX_USD_PER_S:
        raise KeyError(f"no price for GPU pool {pool!r} (known: {sorted(FLEX_USD_PER_S)}); add it to "
                       "fleet/prices.py from GET /v2/catalog/gpus (price.serverless)")
    if active and negotiated is not None:
        return negotiated
    return FLEX_USD_PER_S[pool]


def active_2025_per_s(pool: str) -> float:
    """The 2025 active-worker $/s of ``pool`` (:data:`ACTIVE_2025_USD_PER_S`; its flex rate where that table
    has none): the fleet simulator's what-if of a discount like 2025's, never a bill."""
    return ACTIVE_2025_USD_PER_S.get(pool, price_per_s(pool))


def cost_per_hour(pools: list[str], gpu_count: int, workers: int, active: bool) -> tuple[float, str]:
    """$/h of ``workers`` workers of ``gpu_count`` GPUs on the first pool that has a price (the priority
    pool; Runpod may place workers on a later one), and a note saying what the figure rests on."""
    for pool in pools:
        try:
            rate = price_per_s(pool, active)
        except KeyError:
            continue
        note = f"{pool} at ${rate:.5f}/GPU-s (fleet/prices.py, flex table of {AS_OF})"
        if active:
            note += (f"; active workers at the flex rate (one price since {UNIFIED_SINCE}; a negotiated "
                     "discount is not known here)")
        return workers * gpu_count * rate * 3600, note
    return float("nan"), f"no price known for {pools}: add it to fleet/prices.py"


#: SkyPilot's accelerator names (its Runpod catalog, ``runpod/vms.csv`` of skypilot-catalog v8, e.g.
#: ``1x_RTXA5000_SECURE``) -> the Runpod GPU type ids of :data:`PRICE_SHEET`
SKYPILOT_ACCELERATORS: dict[str, str] = {
    "RTXA5000": "NVIDIA RTX A5000",
    "RTX4090": "NVIDIA GeForce RTX 4090",
    "L40S": "NVIDIA L40S",
    "A100-80GB": "NVIDIA A100 80GB PCIe",
    "H100": "NVIDIA H100 80GB HBM3",
}


def skypilot_gpu_type(accelerator: str) -> str:
    """The Runpod GPU type id of a SkyPilot accelerator name (unknown: returned as it is)."""
    return SKYPILOT_ACCELERATORS.get(accelerator, accelerator)


def pod_price_per_s(gpu_type: str) -> float:
    """On-demand (Secure) pod $/GPU-second of ``gpu_type`` (a Runpod id or a SkyPilot accelerator name), from
    :data:`PRICE_SHEET` (dated 2026-12-01; each price's source in its ``sources``). Unknown: the dearest
    pod price, with a warning (never under-billed)."""
    import logging

    name = skypilot_gpu_type(gpu_type)
    hits = [k for k in PRICE_SHEET.gpus if name.lower().startswith(k.lower())]
    if hits:
        return PRICE_SHEET.gpus[max(hits, key=len)].usd_per_second("pod")
    logging.getLogger(__name__).warning("no pod price for GPU type %r (fleet/prices.py of %s): billed at the "
                                        "dearest pod price", gpu_type, PRICE_SHEET.date)
    return max(g.usd_per_second("pod") for g in PRICE_SHEET.gpus.values())
