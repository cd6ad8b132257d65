"""Check what a run's journal says a SkyPilot pool cost against SkyPilot's own cost report of its workers.

    python -m fleet.reconcile_pool --runs-dir DIR [--runs-dir DIR2 ...] [--pool NAME] [--days 30]
                                 [--bucket day|hour] [--tolerance-pct 5] [--tolerance-usd 0.05] [--json]

Contract
--------
- **The journal's side** (``<runs_dir>/skypilot_journal.sqlite``, written by ``backend=skypilot``): every ended
  attempt's pod time (``cost_usd``, spread over its running time) and its share of the pool's idle time
  (``idle_usd``: ``idle_per_job_s`` x the pod rate, an estimate; :mod:`fleet.skypilot_engine`, "Bills"), bucketed
  exactly as :mod:`fleet.reconcile` buckets a Runpod journal (:func:`fleet.reconcile.journal_buckets`).
- **SkyPilot's side**: ``sky.cost_report(days)`` (skypilot 0.14.1 ``sky/client/sdk.py``; computed in
  ``sky/core.py`` ``cost_report``): one record per cluster of the API server's history, downed ones included.
  A pool's workers are clusters named ``<pool>-<replica id>`` (``sky/serve/serve_utils.py``
  ``generate_replica_cluster_name``), launched by the jobs controller and kept in that history with
  ``is_managed`` set (``sky/global_user_state.py``: the dashboard filters them out of its own cost view, so
  they are there). Each record's ``total_cost`` (its resources' catalog price x its time up x its nodes) is
  spread over its ``usage_intervals`` (an open interval runs to now). **SkyPilot's figure is an estimate from
  its price catalog, not the cloud's invoice**; it is the pool's whole pod time, busy or idle.
- **Verdict** per bucket and for the total, as :mod:`fleet.reconcile`: ``ok`` within ``max(tolerance_usd,
  tolerance_pct%)``; ``SKYPILOT HIGHER`` usually means the pool idled more than the journal's per-job idle
  estimate (workers kept up between runs, a ``workers_min`` above 0, a slow scale-down) or jobs the journal
  does not know of ran on the pool; ``JOURNAL HIGHER``: the idle estimate is above what the pool really idled,
  or the catalog's prices (SkyPilot's) are below ``fleet/prices.py``'s.
- Exit status 0: every bucket agrees; 1: at least one does not; 2: it could not compare (no journal, SkyPilot's
  API server unreachable), with what to do; 3: SkyPilot's SDK is not installed (the ``skypilot`` extra).

Verified only against skypilot 0.14.1's source (no cloud account here): the record fields, that the pool's
worker clusters are in the API server's history, and their names.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from fleet.reconcile import STEP_S, TOLERANCE_PCT, TOLERANCE_USD, Parts, journal_buckets, spread, verdict_of
from fleet.skypilot_engine import JOURNAL_NAME, SkySDK


class PoolRow(BaseModel):
    """One bucket of the comparison."""

    start: str
    journal: Parts
    journal_usd: float
    skypilot_usd: float
    difference_usd: float          # SkyPilot's figure minus the journal's
    verdict: str
    open: bool = False             # the bucket has not ended yet


class PoolReport(BaseModel):
    pool: str
    bucket: str
    tolerance_pct: float
    tolerance_usd: float
    workers: list[str]             # the worker clusters SkyPilot's report lists for the pool
    rows: list[PoolRow]
    total: PoolRow
    notes: list[str]

    @property
    def agrees(self) -> bool:
        return all(r.verdict == "ok" for r in [*self.rows, self.total])


def is_worker(name: str, pool: str) -> bool:
    """A cluster of ``pool``'s workers: ``<pool>-<replica id>`` (sky/serve/serve_utils.py)."""
    return re.fullmatch(re.escape(pool) + r"-\d+", name or "") is not None


def worker_buckets(records: list[dict[str, Any]], pool: str, step: int,
                   now: float | None = None) -> tuple[dict[int, float], list[str]]:
    """SkyPilot's cost of ``pool``'s worker clusters per bucket, and their names: each record's ``total_cost``
    spread over its ``usage_intervals`` in proportion to their lengths (an open one ends now)."""
    now = now or time.time()
    out: dict[int, float] = {}
    names: list[str] = []
    for r in records:
        if not is_worker(str(r.get("name")), pool):
            continue
        names.append(str(r["name"]))
        spans = [(float(a), float(b) if b is not None else now) for a, b in (r.get("usage_intervals") or [])]
        spans = [(a, b) for a, b in spans if b > a]
        length = sum(b - a for a, b in spans)
        cost = float(r.get("total_cost") or 0.0)
        if not spans or length <= 0:
            launched = float(r.get("launched_at") or now)
            spans, length = [(launched, launched)], 1.0
        for a, b in spans:
            share = cost * ((b - a) / length if b > a else 1.0)
            for k, usd in spread(a, b, share, step).items():
                out[k] = out.get(k, 0.0) + usd
    return out, sorted(names)


#: the jobs controller's cluster name prefix (``common.JOB_CONTROLLER_PREFIX``, sky/utils/common.py): a pool's
#: jobs run through it (``controller_utils.get_controller_for_pool``); its VM (4+ CPUs, 50 GB,
#: sky/jobs/constants.py ``CONTROLLER_RESOURCES``) autostops after 10 idle minutes by default
#: (``CONTROLLER_AUTOSTOP``; ``jobs.controller.autostop`` in ~/.sky/config.yaml)
CONTROLLER_PREFIX = "sky-jobs-controller-"


def cluster_costs(records: list[dict[str, Any]], pool: str) -> tuple[dict[str, float], dict[str, float]]:
    """SkyPilot's cost of each of ``pool``'s worker clusters and of each jobs controller in a cost report."""
    workers = {str(r["name"]): float(r.get("total_cost") or 0.0) for r in records if is_worker(str(r.get("name")), pool)}
    controllers = {str(r["name"]): float(r.get("total_cost") or 0.0) for r in records
                   if str(r.get("name") or "").startswith(CONTROLLER_PREFIX)}
    return workers, controllers


def reconcile_pool(sdk: SkySDK, runs_dirs: list[Path], pool: str, bucket: str = "day", days: int | None = None,
                   tolerance_pct: float = TOLERANCE_PCT, tolerance_usd: float = TOLERANCE_USD,
                   now: float | None = None) -> PoolReport:
    """Compare the skypilot journals of ``runs_dirs`` with SkyPilot's cost report of ``pool``'s workers."""
    now = now or time.time()
    step = STEP_S[bucket]
    ours = journal_buckets(runs_dirs, step, now, journal_name=JOURNAL_NAME)
    records = sdk.cost_report(days)
    theirs, workers = worker_buckets(records, pool, step, now)
    controllers = cluster_costs(records, pool)[1]
    notes: list[str] = []
    if controllers:
        notes.append(f"the jobs controller ({', '.join(sorted(controllers))}) cost ${sum(controllers.values()):.4f} "
                     "in the report's window: not compared (it serves every managed job and pool of the API "
                     "server's user); it is the pool's fixed cost on top of the workers")
    if not ours:
        notes.append("the journals hold no billed attempt yet")
    if not workers:
        notes.append(f"SkyPilot's cost report lists no worker of pool {pool!r} (clusters {pool}-<n>) in the last "
                     f"{days or 30} days: check --pool (python -m fleet.pool status) and --days")
    rows: list[PoolRow] = []
    for b in sorted(set(ours) | set(theirs)):
        parts, sky_usd = ours.get(b, Parts()), theirs.get(b, 0.0)
        rows.append(PoolRow(start=datetime.fromtimestamp(b, timezone.utc).strftime("%Y-%m-%d %H:%M"),
                            journal=parts, journal_usd=round(parts.total, 4), skypilot_usd=round(sky_usd, 4),
                            difference_usd=round(sky_usd - parts.total, 4),
                            verdict=verdict_of(parts.total, sky_usd, tolerance_pct, tolerance_usd, "SKYPILOT"),
                            open=b + step > now))
    tj = Parts(jobs=sum(r.journal.jobs for r in rows), idle=sum(r.journal.idle for r in rows),
               active=sum(r.journal.active for r in rows))
    ts = sum(theirs.values())
    total = PoolRow(start="total", journal=tj, journal_usd=round(tj.total, 4), skypilot_usd=round(ts, 4),
                    difference_usd=round(ts - tj.total, 4),
                    verdict=verdict_of(tj.total, ts, tolerance_pct, tolerance_usd, "SKYPILOT"))
    if any(r.open for r in rows):
        notes.append("a bucket marked * has not ended (a worker still up adds to SkyPilot's figure)")
    if any(r.verdict == "SKYPILOT HIGHER" for r in [*rows, total]):
        notes.append("SKYPILOT HIGHER: the pool's workers were up longer than the journal's jobs and per-job idle "
                     "estimate (workers kept between runs, workers_min above 0, a slow scale-down: "
                     "python -m fleet.pool down after a run), or other jobs ran on the pool (pass every run dir "
                     "with --runs-dir)")
    if any(r.verdict == "JOURNAL HIGHER" for r in [*rows, total]):
        notes.append("JOURNAL HIGHER: the per-job idle estimate (idle_per_job_s) is above what the pool idled, "
                     "or SkyPilot's catalog prices are below fleet/prices.py's")
    notes.append("SkyPilot's figure is its catalog price x the workers' time up (sky cost-report), an estimate; "
                 "the cloud's invoice is the final word")
    return PoolReport(pool=pool, bucket=bucket, tolerance_pct=tolerance_pct, tolerance_usd=tolerance_usd,
                      workers=workers, rows=rows, total=total, notes=notes)


def format_pool_report(report: PoolReport) -> str:
    """The table ``python -m fleet.reconcile_pool`` prints."""
    head = (f"{'bucket (UTC)':<17} {'jobs':>9} {'idle':>9} {'journal':>10} {'skypilot':>10} {'diff':>9}  verdict")
    lines = [f"pool {report.pool} ({len(report.workers)} worker clusters): journal vs sky.cost_report, per "
             f"{report.bucket}; tolerance max(${report.tolerance_usd:.2f}, {report.tolerance_pct:g}%)",
             head, "-" * len(head)]
    for r in [*report.rows, report.total]:
        if r is report.total:
            lines.append("-" * len(head))
        lines.append(f"{r.start + ('*' if r.open else ''):<17} {r.journal.jobs:>9.4f} {r.journal.idle:>9.4f} "
                     f"{r.journal_usd:>10.4f} {r.skypilot_usd:>10.4f} {r.difference_usd:>+9.4f}  {r.verdict}")
    lines += [f"note: {n}" for n in report.notes]
    return "\n".join(lines)


def main(argv: list[str] | None = None, sdk: SkySDK | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fleet.reconcile_pool", description=__doc__.split("\n")[0])
    ap.add_argument("--runs-dir", type=Path, action="append", required=True,
                    help="a run dir with skypilot_journal.sqlite (repeat for every run that used the pool)")
    ap.add_argument("--pool", help="the pool's name (default: conf/backend/skypilot.yaml options.pool.name)")
    ap.add_argument("--days", type=int, default=None, help="how far back SkyPilot's report looks (its default: 30)")
    ap.add_argument("--bucket", choices=sorted(STEP_S), default="day")
    ap.add_argument("--tolerance-pct", type=float, default=TOLERANCE_PCT)
    ap.add_argument("--tolerance-usd", type=float, default=TOLERANCE_USD)
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    args = ap.parse_args(argv)
    try:
        pool = args.pool
        if not pool:
            from fleet.pool import load_spec

            pool = load_spec().name
        if sdk is None:
            try:
                sdk = SkySDK()
            except RuntimeError:
                from ait_env.extras import EXIT_MISSING_EXTRA, missing_extra_line

                print(missing_extra_line("python -m fleet.reconcile_pool", "sky", "skypilot"), file=sys.stderr)
                return EXIT_MISSING_EXTRA
        report = reconcile_pool(sdk, args.runs_dir, pool, args.bucket, args.days, args.tolerance_pct,
                                args.tolerance_usd)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001  the API server unreachable, a refused login: say it, exit 2
        print(f"error: SkyPilot's cost report failed ({type(e).__name__}: {e}); check `sky api info`",
              file=sys.stderr)
        return 2
    print(report.model_dump_json(indent=1) if args.json else format_pool_report(report))
    return 0 if report.agrees else 1


if __name__ == "__main__":
    # the canonical module's main, not this __main__ copy's: one class object per exception and type
    from fleet.reconcile_pool import main as _main

    raise SystemExit(_main())
