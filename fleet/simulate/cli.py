"""``python -m fleet.simulate``: the command line over the sweep, the journal path and the SkyPilot table (the
contract: :mod:`fleet.simulate`)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import fleet.simulate as package
from fleet.prices import PRICE_SHEET

from fleet.simulate.fleets import PodPoolConfig, ServerlessConfig
from fleet.simulate.journal_path import OVER_SENT_MAX_IN_FLIGHT, simulate_journal
from fleet.simulate.sweep import (gpu_priority, journal_table, markdown, pick, skypilot_table, sweep,
                                 write_defaults)
from fleet.simulate.workload import Workload


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fleet.simulate", description=(package.__doc__ or "").split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=3, help="runs per configuration (seeds 0..N-1), pooled")
    ap.add_argument("--latency-factor", type=float, default=1.2, help="p95 step time allowed over the best")
    ap.add_argument("--gap-s", type=float, default=Workload.gap_s, help="trainer time between batches (s)")
    ap.add_argument("--active-at-flex", action="store_true",
                    help="bill active workers at the flex price (the current docs list no active discount)")
    ap.add_argument("--write-defaults", type=Path, default=None, help="write the pick to this yaml")
    ap.add_argument("--skypilot", action="store_true",
                    help="only the SkyPilot pool against Serverless, 1- and 2-GPU jobs (docs/fleet.md)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    w = Workload(gap_s=args.gap_s)
    if args.skypilot:
        table, picks = skypilot_table(w, list(range(args.seeds)))
        print(f"Workload: {w} (gpus_per_job set per row)\nSeeds: {args.seeds}; pod prices {PRICE_SHEET.date}\n")
        print(table)
        for gpus, row in sorted(picks.items()):
            res = row.result
            print(f"Default pool, {gpus}-GPU jobs: ${res.usd_per_job:.3f}/job, realised/ideal {res.ratio:.3f}, "
                  f"p95 batch {res.p(0.95) / 60:.1f} min, idle per job "
                  f"{(res.billed_s - res.busy_s) / res.jobs:.0f} s")
        print(f"({time.perf_counter() - t0:.1f} s)")
        return 0
    base = ServerlessConfig(active_discount=not args.active_at_flex)
    rows = sweep(w, list(range(args.seeds)), base, PodPoolConfig())
    chosen = pick(rows, args.latency_factor)
    print(f"Workload: {w}\nServerless: {base}\nPods: {PodPoolConfig()}\n"
          f"Seeds: {args.seeds}; latency factor {args.latency_factor}; prices {PRICE_SHEET.date}\n")
    print(markdown(rows, chosen, args.latency_factor))
    res = chosen.result
    goal = "MET" if res.ratio <= 1.25 else "NOT MET"
    print(f"\nPick: serverless {chosen.settings}: ${res.usd_per_job:.3f}/job, realised/ideal {res.ratio:.3f} "
          f"(goal <= 1.25: {goal}); the seed paid $0.46/job (ideal $0.13-0.30).")
    cfg = chosen.cfg
    assert isinstance(cfg, ServerlessConfig)
    pods = next(r for r in rows if r.fleet == "pods" and r.cfg == PodPoolConfig())
    default_mif = cfg.workers_max
    runs = [(f"{chosen.settings}, max_in_flight={m}" + (" (backend default)" if m == default_mif else ""),
             simulate_journal(cfg, w, range(args.seeds), max_in_flight=m))
            for m in dict.fromkeys((default_mif, OVER_SENT_MAX_IN_FLIGHT))]
    print("\nThrough the project's journal and billing (simulate_journal: SimulatedServerless as the Runpod "
          "client, fleet.journal.Journal on the simulated clock, fleet.billing.attempt_billing; poll 5 s):\n")
    print(journal_table(pods, runs))
    for what, r in runs:
        print(f"- {what}: journal ${r.total_usd:.2f} = Runpod's rule ${r.sim.realised_usd:.2f} + queue wait "
              f"in delayTime ${r.delay_excess_usd:.2f} + idle bound ${r.idle_excess_usd:.2f} + jobs on "
              f"active workers ${r.active_jobs_usd:.2f} (= ${r.explained_usd:.2f}; rest is rounding)")
    seed_gpu_s = w.median_s * w.gpus_per_job
    priority = gpu_priority({}, seed_gpu_s)
    print(f"GPU priority (flex $/job at the seed's GPU-seconds, no per-type timing): {priority}")
    if args.write_defaults:
        write_defaults(args.write_defaults, chosen, w, priority,
                       "python -m fleet.simulate " + " ".join(argv if argv is not None else sys.argv[1:]))
        print(f"wrote {args.write_defaults}")
    print(f"({len(rows)} configurations x {args.seeds} seeds in {time.perf_counter() - t0:.1f} s)")
    return 0
