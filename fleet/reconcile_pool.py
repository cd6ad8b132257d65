"""Check what a run's journal says a SkyPilot pool cost against SkyPilot's own cost report of its workers.

    python -m fleet.reconcile_pool --runs-dir DIR [--runs-dir DIR2 ...] [--pool NAME] [--days 30]
                                 [--bucket day|hour] [--tolerance-pct 5] [--tolerance-usd 0.05] [--json]
                                 [--correct [--tail-s S] [--ledger FILE ...]]

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
- **``--correct``** (run it after the run, once the pool has scaled down; again later is harmless): SkyPilot's
  figure becomes the run's. Each run dir's window is its first session to its last job's end + ``--tail-s``
  (the workers' scale-down, default the pool's ``downscale_delay_s``); the workers' cost inside it (split by
  the runs' jobs USD where runs overlap) minus its jobs is its **idle**, replacing the per-job estimate; its
  share of the jobs controller's cost (its window + the controller's 10-minute autostop) is its
  **controller** cost (:class:`fleet.journal.PoolMeasure`). What the run's cost ledger was not charged yet
  goes to it (``gpu_idle``, ``gpu_controller``: run costs, no episode), once however often it runs. Then the
  ledger's total is the pool's cost in the run's window as SkyPilot reports it, or above it where the per-job
  estimate already charged was higher (a charge is never taken back, never negative). The pool's time in no
  run's window (kept up between runs, ``min_workers``) is named in a note, not charged to a run.
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

from fleet.reconcile import (STEP_S, TOLERANCE_PCT, TOLERANCE_USD, Parts, bucket_table, journal_buckets, spread,
                             verdict_notes, verdict_of)
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


def cost_spans(records: list[dict[str, Any]], keep: Any, now: float) -> list[tuple[float, float, float]]:
    """``(start, end, usd)`` pieces of the records ``keep(name)`` selects: each record's ``total_cost`` spread over
    its ``usage_intervals`` in proportion to their lengths (an open one ends ``now``); a record without a usable
    interval: its whole cost at its launch."""
    out: list[tuple[float, float, float]] = []
    for r in records:
        if not keep(str(r.get("name") or "")):
            continue
        spans = [(float(a), float(b) if b is not None else now) for a, b in (r.get("usage_intervals") or [])]
        spans = [(a, b) for a, b in spans if b > a]
        length = sum(b - a for a, b in spans)
        cost = max(0.0, float(r.get("total_cost") or 0.0))
        if not spans or length <= 0:
            launched = float(r.get("launched_at") or now)
            out.append((launched, launched, cost))
            continue
        out += [(a, b, cost * (b - a) / length) for a, b in spans]
    return out


def worker_buckets(records: list[dict[str, Any]], pool: str, step: int,
                   now: float | None = None) -> tuple[dict[int, float], list[str]]:
    """SkyPilot's cost of ``pool``'s worker clusters per bucket, and their names (:func:`cost_spans`)."""
    now = now or time.time()
    out: dict[int, float] = {}
    for a, b, usd in cost_spans(records, lambda n: is_worker(n, pool), now):
        for k, v in spread(a, b, usd, step).items():
            out[k] = out.get(k, 0.0) + v
    return out, sorted(str(r["name"]) for r in records if is_worker(str(r.get("name")), pool))


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


#: how long SkyPilot's jobs controller VM stays up after its last job: ``CONTROLLER_AUTOSTOP`` (sky/jobs/constants.py,
#: skypilot 0.14.1: ``idle_minutes`` 10), so a run's window on the controller ends that long after its last job
CONTROLLER_AUTOSTOP_S = 600.0


def attribute(spans: list[tuple[float, float, float]], windows: dict[str, tuple[float, float]],
              weights: dict[str, float]) -> tuple[dict[str, float], float]:
    """Split the cost ``spans`` (``(start, end, usd)``, spread evenly over each) among the runs whose
    ``windows`` cover them: a time covered by several runs is split by their ``weights`` (equally when those
    are all 0). Returns each run's USD and the USD no window covers. Conserves money: the runs' USD + the
    uncovered USD == the spans' USD."""
    out = {k: 0.0 for k in windows}
    uncovered = 0.0
    for a, b, usd in spans:
        if b <= a:   # a point charge: the runs whose window holds it
            pieces = [(a, a, usd)]
        else:
            cuts = sorted({a, b, *(t for w in windows.values() for t in w if a < t < b)})
            pieces = [(x, y, usd * (y - x) / (b - a)) for x, y in zip(cuts, cuts[1:])]
            # the last piece takes what the others left: a share of a tiny span can round (1.5 x 5e-324 is
            # 5e-324), and money is conserved exactly, not to the float
            x, y, _ = pieces[-1]
            pieces[-1] = (x, y, usd - sum(p for _, _, p in pieces[:-1]))
        for x, y, part in pieces:
            covering = [k for k, (s, e) in windows.items() if s <= x and y <= e]
            if not covering:
                uncovered += part
                continue
            total = sum(max(0.0, weights.get(k, 0.0)) for k in covering)
            for k in covering:
                share = max(0.0, weights.get(k, 0.0)) / total if total > 0 else 1.0 / len(covering)
                out[k] += part * share
    return out, uncovered


def run_window(journal: Any, tail_s: float) -> tuple[float, float] | None:
    """The time a run dir's journal used the pool: from its first session (or attempt) to its last session's
    end (or last attempt's end) + ``tail_s`` (the workers' scale-down after its last job); None if it holds
    neither."""
    sessions, bills = journal.sessions(), journal.attempt_bills()
    starts = [s.started for s in sessions] + [a["ended"] - (a["delay_time_ms"] + a["execution_time_ms"]) / 1000
                                              for a in bills]
    ends = [s.ended if s.ended is not None else s.heartbeat for s in sessions] + [a["ended"] for a in bills]
    if not starts:
        return None
    return min(starts), max(ends) + max(0.0, tail_s)


class PoolCharge(BaseModel):
    """What ``--correct`` recorded in one run dir's journal, and what it wrote to that run's cost ledger."""

    runs_dir: str
    start: str
    end: str
    jobs_usd: float                 # the run's jobs (its attempts' pod time)
    workers_usd: float              # the run's share of the pool's workers' time up in its window
    idle_before_usd: float          # the run's idle as the journal had it (the per-job estimate, or a reading)
    idle_usd: float                 # workers - jobs (never below 0): the run's idle from now on
    controller_usd: float           # the run's share of the jobs controller in its window (+ its autostop)
    ledger: str
    charged: dict[str, float]       # written to the ledger now, per part (what was not charged before)


def correct_pool(sdk: SkySDK, runs_dirs: list[Path], pool: str, *, tail_s: float, days: int | None = None,
                 controller_tail_s: float = CONTROLLER_AUTOSTOP_S, ledgers: list[Path] | None = None,
                 now: float | None = None) -> tuple[list[PoolCharge], list[str]]:
    """Record in each run dir's journal the pool's cost in that run's window from SkyPilot's cost report
    (:class:`fleet.journal.PoolMeasure`: the run's idle is the workers' cost there minus its jobs, and the
    jobs controller's share is a run cost), then write what its cost ledger (``<runs_dir>/costs.jsonl`` or
    ``ledgers[i]``) was not charged yet (:func:`fleet.run_charges.charge_run_parts`). Workers' time shared by
    overlapping runs is split by their jobs' USD; time no run covers is the pool's, reported in the notes
    (workers kept up between runs: ``python -m fleet.pool cost``). Running it again after more of the tail is
    in the report replaces the reading and charges only the difference."""
    from ait_env.observe.ledger import CostLedger
    from fleet.journal import Journal, PoolMeasure
    from fleet.run_charges import charge_run_parts

    now = now or time.time()
    journals = {}
    for d in runs_dirs:
        path = Path(d) / JOURNAL_NAME
        if not path.exists():
            raise FileNotFoundError(f"no journal at {path}: pass the run dir a skypilot backend wrote "
                                    "(backend=skypilot, its runs_dir)")
        journals[str(d)] = Journal(path)
    records = sdk.cost_report(days)
    windows = {k: w for k, j in journals.items() if (w := run_window(j, tail_s)) is not None}
    ctl_windows = {k: (a, b - max(0.0, tail_s) + controller_tail_s) for k, (a, b) in windows.items()}
    jobs = {k: journals[k].spent_usd() for k in windows}
    workers, loose = attribute(cost_spans(records, lambda n: is_worker(n, pool), now), windows, jobs)
    ctl, ctl_loose = attribute(cost_spans(records, lambda n: n.startswith(CONTROLLER_PREFIX), now), ctl_windows, jobs)
    notes = [f"no run in {d}: its journal holds no session or attempt" for d in journals if d not in windows]
    if loose > 0.005:
        notes.append(f"${loose:.4f} of the pool's workers falls in no run's window (workers up before or between "
                     "runs, min_workers, a worker not reaped): the pool's, not charged to a run (python -m fleet.pool "
                     "cost lists it)")
    if ctl_loose > 0.005:
        notes.append(f"${ctl_loose:.4f} of the jobs controller falls in no run's window (other managed jobs or pools "
                     "of the API server's user): not charged")
    ledger_of = {str(d): Path(ledgers[i]) if ledgers else Path(d) / "costs.jsonl" for i, d in enumerate(runs_dirs)}
    out: list[PoolCharge] = []
    for k, (a, b) in windows.items():
        j = journals[k]
        before = j.run_costs().idle
        idle = max(0.0, workers[k] - jobs[k])
        if workers[k] + 1e-9 < jobs[k]:
            notes.append(f"{k}: the workers' cost in SkyPilot's report (${workers[k]:.4f}) is below the run's jobs "
                         f"(${jobs[k]:.4f}): SkyPilot's catalog prices are below fleet/prices.py's, or the report "
                         "misses a worker; idle is 0, the jobs stay as billed")
        j.record_pool_measure(PoolMeasure(start=a, end=b, workers_usd=round(workers[k], 6), jobs_usd=round(jobs[k], 6),
                                          idle_usd=round(idle, 6), controller_usd=round(ctl[k], 6),
                                          source=f"sky.cost_report(days={days}) of pool {pool}", at=now))
        ledger = CostLedger(ledger_of[k])   # by run dir: a run dir without a window has no ledger turn
        costs = j.run_costs()
        charged = charge_run_parts(j, ledger, costs, {"backend": "skypilot", "pool": pool, "source": "sky.cost_report"})
        if before > idle + 0.005:
            notes.append(f"{k}: the per-job idle estimate already charged (${before:.4f}) is above the measured idle "
                         f"(${idle:.4f}); the ledger keeps the estimate (a charge is never taken back)")
        fmt = lambda t: datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")  # noqa: E731
        out.append(PoolCharge(runs_dir=k, start=fmt(a), end=fmt(b), jobs_usd=round(jobs[k], 4),
                              workers_usd=round(workers[k], 4), idle_before_usd=round(before, 4),
                              idle_usd=round(idle, 4), controller_usd=round(ctl[k], 4), ledger=str(ledger.path),
                              charged={p: round(v, 6) for p, v in charged.items()}))
    return out, notes


def format_charges(charges: list[PoolCharge], notes: list[str]) -> str:
    """What ``--correct`` prints."""
    lines = [f"{'run dir':<40} {'jobs':>9} {'workers':>9} {'idle was':>9} {'idle':>9} {'ctrl':>8}  charged now"]
    for c in charges:
        now = ", ".join(f"{p} ${v:.4f}" for p, v in c.charged.items() if v > 0) or "nothing new"
        lines.append(f"{c.runs_dir[-40:]:<40} {c.jobs_usd:>9.4f} {c.workers_usd:>9.4f} {c.idle_before_usd:>9.4f} "
                     f"{c.idle_usd:>9.4f} {c.controller_usd:>8.4f}  {now} -> {c.ledger}")
    return "\n".join(lines + [f"note: {n}" for n in notes])


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
    notes += verdict_notes(
        rows, total, "SKYPILOT", "a bucket marked * has not ended (a worker still up adds to SkyPilot's figure)",
        "SKYPILOT HIGHER: the pool's workers were up longer than the journal's jobs and per-job idle estimate "
        "(workers kept between runs, workers_min above 0, a slow scale-down: python -m fleet.pool down after a "
        "run; python -m fleet.reconcile_pool --correct charges the run its measured idle), or other jobs ran on "
        "the pool (pass every run dir with --runs-dir)",
        "JOURNAL HIGHER: the per-job idle estimate (idle_per_job_s) is above what the pool idled, or SkyPilot's "
        "catalog prices are below fleet/prices.py's")
    notes.append("SkyPilot's figure is its catalog price x the workers' time up (sky cost-report), an estimate; "
                 "the cloud's invoice is the final word")
    return PoolReport(pool=pool, bucket=bucket, tolerance_pct=tolerance_pct, tolerance_usd=tolerance_usd,
                      workers=workers, rows=rows, total=total, notes=notes)


def format_pool_report(report: PoolReport) -> str:
    """The table ``python -m fleet.reconcile_pool`` prints."""
    title = (f"pool {report.pool} ({len(report.workers)} worker clusters): journal vs sky.cost_report, per "
             f"{report.bucket}; tolerance max(${report.tolerance_usd:.2f}, {report.tolerance_pct:g}%)")
    return bucket_table(title, [("jobs", 9, lambda r: r.journal.jobs), ("idle", 9, lambda r: r.journal.idle),
                                ("journal", 10, lambda r: r.journal_usd), ("skypilot", 10, lambda r: r.skypilot_usd),
                                ("diff", 9, lambda r: r.difference_usd)], report.rows, report.total, report.notes)


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
    ap.add_argument("--correct", action="store_true",
                    help="record SkyPilot's figure in each run's journal (its idle = the workers' cost in its window "
                         "- its jobs; its share of the jobs controller) and charge what is new to its cost ledger")
    ap.add_argument("--tail-s", type=float, default=None,
                    help="--correct: seconds after a run's last job its workers still count as its (default: the "
                         "pool's downscale_delay_s when it autoscales, else 0)")
    ap.add_argument("--ledger", type=Path, action="append",
                    help="--correct: the cost ledger of each --runs-dir, in order (default <runs_dir>/costs.jsonl)")
    args = ap.parse_args(argv)
    if args.ledger and len(args.ledger) != len(args.runs_dir):
        ap.error(f"--ledger given {len(args.ledger)} times for {len(args.runs_dir)} --runs-dir: give one per run "
                 "dir, in the same order, or none")
    try:
        from fleet.pool import load_spec

        spec = load_spec()
        pool = args.pool or spec.name
        tail = args.tail_s if args.tail_s is not None else (0.0 if spec.workers is not None
                                                             else float(spec.downscale_delay_s))
        if sdk is None:
            try:
                sdk = SkySDK()
            except RuntimeError:
                from ait_env.extras import EXIT_MISSING_EXTRA, missing_extra_line

                print(missing_extra_line("python -m fleet.reconcile_pool", "sky", "skypilot"), file=sys.stderr)
                return EXIT_MISSING_EXTRA
        if args.correct:
            charges, notes = correct_pool(sdk, args.runs_dir, pool, tail_s=tail, days=args.days, ledgers=args.ledger)
            if not args.json:
                print(format_charges(charges, notes) + "\n")
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
