"""Runpod Serverless GPU prices, dated, with their source: what an endpoint costs per hour.

Contract: :data:`FLEX_USD_PER_S` and :data:`ACTIVE_USD_PER_S` map a serverless GPU **pool id** (what
REST v2 ``gpu.pools`` takes, :class:`gpu.runpod_api.EndpointSpec.gpu_type_ids`) to US dollars per second
for ONE GPU; a worker costs that times its GPU count. :func:`price_per_s` and :func:`cost_per_hour` say
when a figure is an assumption. Replace the table (and :data:`AS_OF`) from the catalog when online:
``GET https://api.runpod.io/v2/catalog/gpus`` gives ``price.serverless`` in $/h per GPU for each type's
``pool`` (``api-reference-v2/openapi.json``, ``GpuType``).

Source of the flex figures: runpod/docs (mirror a900806e), ``snippets/serverless-gpu-pricing-table.mdx``
(shown on ``serverless/endpoints/endpoint-configurations.mdx``; file last changed 2026-06-08), "Cost per
second" per GPU class. The class -> pool id mapping is ``references/gpu-types.mdx`` ("GPU pools"); the
two Blackwell pools are not in that table and their mapping (6000s PRO 96 GB -> ``BLACKWELL_96``, B200 ->
``BLACKWELL_180``) is ours. ``serverless/pricing.mdx`` gives no figure (it links runpod.io/pricing).

**Active workers** (``workers_min`` > 0, billed around the clock): ``serverless/pricing.mdx`` says only
"Discounts available through sales inquiry"; no active rate is published in the stored docs. The table
uses the flex rate for them, an upper bound, marked as an assumption.
"""

from __future__ import annotations

AS_OF = "2026-06-08"
SOURCE = "runpod/docs a900806e snippets/serverless-gpu-pricing-table.mdx"

#: $/s per GPU for flex workers (scale to zero), by serverless pool id
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

#: $/s per GPU for active workers: ASSUMPTION, the flex rate (no published active rate; see above)
ACTIVE_USD_PER_S: dict[str, float] = dict(FLEX_USD_PER_S)
ACTIVE_IS_ASSUMED = True


def price_per_s(pool: str, active: bool = False) -> float:
    """$/s for one GPU of ``pool``; ``KeyError`` naming the known pools for another id."""
    table = ACTIVE_USD_PER_S if active else FLEX_USD_PER_S
    if pool not in table:
        raise KeyError(f"no price for GPU pool {pool!r} (known: {sorted(table)}); add it to gpu/prices.py "
                       "from GET /v2/catalog/gpus (price.serverless)")
    return table[pool]


def cost_per_hour(pools: list[str], gpu_count: int, workers: int, active: bool) -> tuple[float, str]:
    """$/h of ``workers`` workers of ``gpu_count`` GPUs on the first pool that has a price (the priority
    pool; Runpod may place workers on a later one), and a note saying what the figure rests on."""
    for pool in pools:
        try:
            usd = workers * gpu_count * price_per_s(pool, active) * 3600
        except KeyError:
            continue
        note = f"{pool} at ${price_per_s(pool, active):.5f}/GPU-s ({SOURCE}, {AS_OF})"
        if active and ACTIVE_IS_ASSUMED:
            note += "; active rate assumed equal to flex (no published figure)"
        return usd, note
    return float("nan"), f"no price known for {pools}: add it to gpu/prices.py"
