"""The $/job matrix: the reference job on each (GPU type x base model), to order the endpoint's GPU list.

Contract: ``python -m fleet.bench_matrix --dry-run`` prints the plan (one run per GPU type x model) and a
$/job and minutes/job table **estimated from the seed's figures, not measured**, and writes it as
markdown and CSV (``--out``). The live mode runs the reference job once per cell on an endpoint per GPU
type (``--endpoint "GPU TYPE=ENDPOINT_ID"``) through a backend factory (``--backend-factory
module:callable``, called as ``factory(endpoint_id)`` and returning an object with ``submit(payload)
-> job id`` and ``status(job id) -> dict``, the protocol of :class:`fleet.simulate.FleetAPI`), and costs
each result's measured ``executionTime`` with :func:`fleet.prices.cost_usd`. Live runs need
``RUNPOD_API_KEY``; without it the command says so and exits 2.

The seed's figures (``gpu/README.md``, "What a job costs in GPU seconds"): ideal 1,700-4,000 GPU-seconds
per job over Qwen3-0.6B and 1.7B jobs together, on an A5000-class pod. No figure splits them by model or
gives another GPU type's speed: the estimate takes the geometric middle (2,608 GPU-seconds) for every
cell and says so in its ``basis`` column.
"""

from __future__ import annotations

import argparse
import csv
import importlib
import io
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from fleet.prices import PRICE_SHEET, cost_usd

MODELS = ("Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B")
GPU_TYPES = tuple(PRICE_SHEET.gpus)
GPUS_PER_JOB = 2
#: the seed's ideal GPU-seconds per job (gpu/README.md): 1,700 to 4,000; geometric middle
SEED_GPU_S_LOW, SEED_GPU_S_HIGH = 1700.0, 4000.0
SEED_GPU_S = math.sqrt(SEED_GPU_S_LOW * SEED_GPU_S_HIGH)
SEED_GPU = "NVIDIA RTX A5000"
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT")
ESTIMATE_LABEL = "estimated from the seed's figures, not measured"


@dataclass(frozen=True)
class Cell:
    gpu_type: str
    model: str
    minutes_per_job: float
    usd_per_job_flex: float
    usd_per_job_pod: float
    basis: str


def estimate() -> list[Cell]:
    cells = []
    for gpu in GPU_TYPES:
        basis = ("seed aggregate (A5000-class), both models" if gpu == SEED_GPU
                 else "ASSUMED: the A5000's GPU-seconds (no timing figure for this type)")
        for model in MODELS:
            cells.append(Cell(gpu, model, SEED_GPU_S / GPUS_PER_JOB / 60.0,
                              cost_usd(gpu, SEED_GPU_S, 1, "flex"), cost_usd(gpu, SEED_GPU_S, 1, "pod"),
                              basis))
    return cells


def to_markdown(cells: list[Cell], title: str) -> str:
    lines = [f"{title} (prices {PRICE_SHEET.date}, {GPUS_PER_JOB} GPUs per job)", "",
             "| GPU type | model | minutes/job | $/job Serverless flex | $/job pod | basis |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {c.gpu_type} | {c.model} | {c.minutes_per_job:.1f} | {c.usd_per_job_flex:.3f} | "
              f"{c.usd_per_job_pod:.3f} | {c.basis} |" for c in cells]
    return "\n".join(lines) + "\n"


def to_csv(cells: list[Cell]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["gpu_type", "model", "minutes_per_job", "usd_per_job_flex", "usd_per_job_pod", "basis"])
    for c in cells:
        w.writerow([c.gpu_type, c.model, f"{c.minutes_per_job:.2f}", f"{c.usd_per_job_flex:.4f}",
                    f"{c.usd_per_job_pod:.4f}", c.basis])
    return buf.getvalue()


def plan(endpoints: dict[str, str]) -> str:
    lines = ["Plan: one reference job per cell, each on the endpoint of its GPU type:"]
    for gpu in GPU_TYPES:
        for model in MODELS:
            lines.append(f"  {gpu:<26} {model:<18} endpoint {endpoints.get(gpu, '<none given>')}")
    return "\n".join(lines)


def reference_payload(model: str) -> dict[str, Any]:
    """The reference job's request. The bundle itself is the GPU worker's business (gpu/README.md);
    here it is named by model so that every cell runs the same job."""
    return {"input": {"reference_job": True, "base_model": model}}


def run_live(endpoints: dict[str, str], factory: Callable[[str], Any], poll_s: float = 30.0,
             sleep: Callable[[float], None] = time.sleep) -> list[Cell]:
    cells = []
    for gpu, endpoint in endpoints.items():
        api = factory(endpoint)
        for model in MODELS:
            job_id = api.submit(reference_payload(model))
            while (st := api.status(job_id))["status"] not in TERMINAL:
                sleep(poll_s)
            if st["status"] != "COMPLETED":
                raise RuntimeError(f"reference job on {gpu} / {model} ended {st['status']}: {st}")
            seconds = st["executionTime"] / 1000.0
            cells.append(Cell(gpu, model, seconds / 60.0, cost_usd(gpu, seconds, GPUS_PER_JOB, "flex"),
                              cost_usd(gpu, seconds, GPUS_PER_JOB, "pod"), "measured (executionTime)"))
    return cells


def _load_factory(spec: str) -> Callable[[str], Any]:
    module, _, name = spec.partition(":")
    if not name:
        raise SystemExit(f"--backend-factory {spec!r}: expected module:callable")
    return getattr(importlib.import_module(module), name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fleet.bench_matrix", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="print the plan and the estimated table")
    ap.add_argument("--endpoint", action="append", default=[], metavar="GPU_TYPE=ENDPOINT_ID")
    ap.add_argument("--backend-factory", default=None, metavar="module:callable")
    ap.add_argument("--out", type=Path, default=None, help="write <out>.md and <out>.csv")
    args = ap.parse_args(argv)
    endpoints = dict(e.split("=", 1) for e in args.endpoint)
    unknown = sorted(set(endpoints) - set(GPU_TYPES))
    if unknown:
        print(f"unknown GPU type(s) {unknown}; known: {list(GPU_TYPES)}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(plan(endpoints) + "\n")
        cells = estimate()
        title = f"$/job and minutes/job, {ESTIMATE_LABEL}"
    else:
        if not os.environ.get("RUNPOD_API_KEY"):
            print("the live matrix needs RUNPOD_API_KEY (and --endpoint GPU_TYPE=ENDPOINT_ID per GPU type, "
                  "--backend-factory module:callable); `--dry-run` prints the plan and a $/job table "
                  f"{ESTIMATE_LABEL}.", file=sys.stderr)
            return 2
        if not endpoints or not args.backend_factory:
            print("live mode: give --endpoint GPU_TYPE=ENDPOINT_ID (one per GPU type) and "
                  "--backend-factory module:callable", file=sys.stderr)
            return 2
        cells = run_live(endpoints, _load_factory(args.backend_factory))
        title = "$/job and minutes/job, measured"
    md = to_markdown(cells, title)
    print(md)
    if args.out:
        args.out.with_suffix(".md").write_text(md, encoding="utf-8")
        args.out.with_suffix(".csv").write_text(to_csv(cells), encoding="utf-8")
        print(f"wrote {args.out.with_suffix('.md')} and {args.out.with_suffix('.csv')}")
    return 0


if __name__ == "__main__":
    # the canonical module's main, not this __main__ copy's: one class object per exception and type
    from fleet.bench_matrix import main as _main

    raise SystemExit(_main())
