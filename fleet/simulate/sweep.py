"""The sweep of the Serverless settings, its pick (the cheapest within a latency factor of the best), the
tables and ``fleet/fleet_defaults.yaml``."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, replace
from pathlib import Path

from fleet.prices import PRICE_SHEET, cost_usd

from fleet.simulate.driver import FleetResult, simulate
from fleet.simulate.fleets import (PodPoolConfig, ServerlessConfig, SkyPoolConfig, pod_factory, serverless_factory,
                                  skypilot_factory)
from fleet.simulate.journal_path import JournalResult
from fleet.simulate.workload import Workload


WORKERS_MIN = (0, 1, 2, 4)
WORKERS_MAX = (8, 12, 16)
IDLE_TIMEOUT_S = (5, 30, 60, 120, 300)
POD_REAP_S = (60, 300, 600)


@dataclass
class Row:
    fleet: str
    settings: str
    result: FleetResult
    cfg: ServerlessConfig | PodPoolConfig


def sweep(w: Workload, seeds: list[int], base: ServerlessConfig, pod: PodPoolConfig) -> list[Row]:
    rows = []
    for reap in POD_REAP_S:
        cfg = replace(pod, reap_s=reap)
        res = simulate(pod_factory(cfg), w, seeds, "pods")
        rows.append(Row("pods", f"max_pods={cfg.max_pods} reap={reap}s", res, cfg))
    for fb, wmin, wmax, idle in itertools.product((True, False), WORKERS_MIN, WORKERS_MAX, IDLE_TIMEOUT_S):
        cfg = replace(base, flashboot=fb, workers_min=wmin, workers_max=wmax, idle_timeout_s=idle)
        rows.append(Row("serverless", f"min={wmin} max={wmax} idle={idle}s fb={'on' if fb else 'off'}",
                        simulate(serverless_factory(cfg), w, seeds, "serverless"), cfg))
    return rows


def pick(rows: list[Row], factor: float) -> Row:
    """The cheapest Serverless row whose p95 step time is within ``factor`` of the best Serverless p95."""
    sls = [r for r in rows if r.fleet == "serverless"]
    best = min(r.result.p(0.95) for r in sls)
    ok = [r for r in sls if r.result.p(0.95) <= factor * best]
    return min(ok, key=lambda r: (r.result.realised_usd, r.result.p(0.95), r.settings))


def markdown(rows: list[Row], chosen: Row, factor: float) -> str:
    best = min(r.result.p(0.95) for r in rows if r.fleet == "serverless")
    head = ("| fleet | settings | $/job | realised/ideal | p50 step min | p95 step min | utilisation | "
            "cold starts/run | within latency |\n|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        res = r.result
        within = "yes" if r.fleet == "serverless" and res.p(0.95) <= factor * best else "no"
        mark = " **(pick)**" if r is chosen else ""
        lines.append(f"| {r.fleet} | {r.settings}{mark} | {res.usd_per_job:.3f} | {res.ratio:.3f} | "
                     f"{res.p(0.5) / 60:.1f} | {res.p(0.95) / 60:.1f} | {res.utilisation:.2f} | "
                     f"{res.cold_starts / max(1, res.runs):.0f} | {within} |")
    return "\n".join(lines)


def gpu_priority(gpu_seconds_per_job: dict[str, float], gpus_default: float) -> list[str]:
    """GPU types ordered by Serverless flex $/job; a type with no GPU-seconds figure is costed with
    ``gpus_default`` (the seed's figure, measured on an A5000-class pod) and so ranks by price alone."""
    def usd(t: str) -> float:
        return cost_usd(t, gpu_seconds_per_job.get(t, gpus_default), 1, "flex")
    return sorted(PRICE_SHEET.gpus, key=usd)[:3]


def write_defaults(path: Path, chosen: Row, w: Workload, priority: list[str], command: str) -> None:
    cfg = chosen.cfg
    assert isinstance(cfg, ServerlessConfig)
    text = (f"# Written by `{command}` on {time.strftime('%Y-%m-%d', time.gmtime())} (see docs/fleet.md).\n"
            f"# The cheapest simulated configuration whose p95 step time is within the stated factor of the\n"
            f"# best; GPU priority by Serverless flex $/job from fleet/prices.py ({PRICE_SHEET.date}).\n"
            f"# Active workers billed at the {'active' if getattr(cfg, 'active_discount', True) else 'flex'} "
            f"price in this run.\n"
            f"workers_min: {cfg.workers_min}\n"
            f"workers_max: {cfg.workers_max}\n"
            f"idle_timeout_s: {int(cfg.idle_timeout_s)}\n"
            f"flashboot: {'true' if cfg.flashboot else 'false'}\n"
            f"gpus_per_worker: {w.gpus_per_job}\n"
            "gpu_priority:\n" + "".join(f'  - "{t}"\n' for t in priority))
    path.write_text(text, encoding="utf-8")


def journal_table(pods: Row, runs: list[tuple[str, JournalResult]]) -> str:
    """The final comparison: the pod pool (simulator only: the project has no pod client) and the pick run
    through the journal (``runs``: (what varies, result))."""
    head = ("| fleet | settings | bookkeeping | $/job | jobs + idle + active $/job | "
            "Runpod's rule $/job, same runs | journal / Runpod's rule | p50 step min | p95 step min | "
            "utilisation | journal rows | s |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|")
    p = pods.result
    lines = [head, f"| pods | {pods.settings} | simulator (no pod client) | {p.usd_per_job:.3f} | - | "
                   f"{p.usd_per_job:.3f} | - | {p.p(0.5) / 60:.1f} | {p.p(0.95) / 60:.1f} | "
                   f"{p.utilisation:.2f} | - | - |"]
    for what, r in runs:
        n = r.rows
        lines.append(f"| serverless | {what} | journal run_costs() | {r.usd_per_job:.3f} | "
                     f"{r.jobs_usd / n:.3f} + {r.idle_usd / n:.3f} + {r.active_usd / n:.3f} | "
                     f"{r.sim.usd_per_job:.3f} | {r.total_usd / r.sim.realised_usd:.3f} | "
                     f"{r.p(0.5) / 60:.1f} | {r.p(0.95) / 60:.1f} | {r.sim.utilisation:.2f} | {n} | "
                     f"{r.seconds:.1f} |")
    return "\n".join(lines)


#: the SkyPilot pool settings swept (fleet.settings.PoolSpec): max_workers x downscale delay (idle reaping)
SKY_MAX_WORKERS = (12, 16, 24)
SKY_DOWNSCALE_S = (60, 300, 1200)


def skypilot_table(w: Workload, seeds: list[int]) -> tuple[str, dict[int, Row]]:
    """The SkyPilot pool (its queue-length autoscaler, :class:`SkyPoolConfig`) next to Serverless (the
    defaults' settings), for 1- and 2-GPU jobs on the same workload; the default pool's row per GPU count."""
    from fleet.settings import PoolSpec

    spec = PoolSpec()
    default = SkyPoolConfig(min_workers=spec.min_workers, max_workers=spec.max_workers,
                            upscale_delay_s=spec.upscale_delay_s, downscale_delay_s=spec.downscale_delay_s,
                            threshold=spec.queue_length_threshold)
    rows: list[Row] = []
    picks: dict[int, Row] = {}
    for gpus in (1, 2):
        wl = replace(w, gpus_per_job=gpus)
        sls = replace(ServerlessConfig(active_discount=False), gpus=gpus)
        rows.append(Row("serverless", f"{gpus} GPU: min={sls.workers_min} max={sls.workers_max} "
                                      f"idle={sls.idle_timeout_s:g}s fb={'on' if sls.flashboot else 'off'}",
                        simulate(serverless_factory(sls), wl, seeds, "serverless"), sls))
        for wmax, down in itertools.product(SKY_MAX_WORKERS, SKY_DOWNSCALE_S):
            cfg = replace(default, gpus=gpus, max_workers=wmax, downscale_delay_s=down)
            row = Row("skypilot pool", f"{gpus} GPU: min=0 max={wmax} up={cfg.upscale_delay_s:g}s "
                                       f"down={down:g}s", simulate(skypilot_factory(cfg), wl, seeds, "skypilot"), cfg)
            rows.append(row)
            if cfg == replace(default, gpus=gpus):
                picks[gpus] = row
        cfg = replace(default, gpus=gpus, upscale_delay_s=300.0, downscale_delay_s=1200.0)
        rows.append(Row("skypilot pool", f"{gpus} GPU: SkyPilot's own delays (up=300s down=1200s)",
                        simulate(skypilot_factory(cfg), wl, seeds, "skypilot"), cfg))
    head = ("| fleet | settings | $/job | realised/ideal | p50 step min | p95 step min | utilisation | "
            "workers started/run |\n|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        res = r.result
        mark = " **(default pool)**" if r in picks.values() else ""
        lines.append(f"| {r.fleet} | {r.settings}{mark} | {res.usd_per_job:.3f} | {res.ratio:.3f} | "
                     f"{res.p(0.5) / 60:.1f} | {res.p(0.95) / 60:.1f} | {res.utilisation:.2f} | "
                     f"{res.cold_starts / max(1, res.runs):.0f} |")
    return "\n".join(lines), picks
