"""Check what a run's journal says the Runpod fleet cost against what Runpod billed.

    python -m fleet.reconcile --runs-dir DIR [--runs-dir DIR2 ...] [--endpoint-id ID] [--bucket day|hour]
                            [--tolerance-pct 5] [--tolerance-usd 0.05] [--json] [--rest-url URL]
                            [--correct [--job-url URL]]

Contract
--------
- **The journal's side** (``<runs_dir>/runpod_journal.sqlite``, :mod:`fleet.journal`): every ended
  attempt's bill (``cost_usd``: delay + execution, spread over ``[ended - billed seconds, ended]``), its
  idle charge (``idle_usd``, at ``ended``; an upper bound) and the active workers of the orchestrator
  sessions (their ``$/s`` over their wall time; a session still open counts up to now while its
  orchestrator lives). Several ``--runs-dir`` are summed: give every run dir that used the endpoint in the
  window, or Runpod's side includes jobs the journal does not know of.
- **Runpod's side**: :meth:`fleet.runpod_management.ManagementClient.billing`, ``GET /v2/billing/serverless``
  with ``serverlessId`` (runpod/docs a900806e ``api-reference-v2/openapi.json``, ``listServerlessBilling``:
  per endpoint and bucket, ``gpuAmount``, ``cpuAmount``, ``diskAmount``, ``feeAmount``, ``totalAmount``
  in USD). The journal models GPU time only, so the verdict compares it with ``gpuAmount``; the rest
  (disk, platform fee, CPU) is shown as "other", never hidden. The API does give per-endpoint figures; it
  does not give per-job or per-request ones, so a difference can be located to a bucket, not to a job.
- **Buckets**: UTC hours or days (the spec's examples are midnight-UTC aligned; ``week``/``month``/
  ``year`` are not offered here). A charge spanning a boundary is split in proportion to its time.
- **Verdict** per bucket and for the total: ``ok`` when ``|Runpod - journal| <= max(tolerance_usd,
  tolerance_pct% of the larger)``, defaults $0.05 and 5% (Runpod rounds each worker's time up to a whole
  second and our bills are per millisecond; the idle charge is an upper bound); else ``RUNPOD HIGHER`` or
  ``JOURNAL HIGHER``, with what usually causes it.
- **Estimates** (issue 32): an attempt the backend could not read (status unreadable to its deadline, result
  expired, a run call without an answer) is journaled at its upper bound, marked ``estimated``. The report
  states how much of the journal is such bounds (an over-estimate by design). ``--correct`` first reads
  each estimated attempt that has a Runpod id (``GET /status/<id>``, the job API) and replaces the bound by
  the bill it reads (:func:`correct_estimates`, :meth:`fleet.journal.Journal.correct_attempt`);
  Runpod keeps a job 30 minutes after it ends (``send-requests.mdx``, "Result retention"), so correct soon
  after a run. An attempt with no id (its run call's answer was lost) cannot be read and stays a bound.
- Exit status 0: every bucket agrees; 1: at least one does not; 2: it could not compare (no
  ``RUNPOD_API_KEY``, no journal, no endpoint id, a failed call), with what to do.

Not verified against a live account (none here): how long after a bucket ends Runpod's figure is
complete (run this an hour or more after the run; the current bucket is marked as still open), and that
its buckets are UTC-aligned.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from fleet.runpod_api import API_KEY_ENV, RunpodAPIError, ServerlessClient
from fleet.runpod_management import ManagementClient, parse_rfc3339

STEP_S = {"hour": 3600, "day": 86400}
TOLERANCE_PCT, TOLERANCE_USD = 5.0, 0.05


class Parts(BaseModel):
    """USD of one bucket, by part."""

    jobs: float = 0.0
    idle: float = 0.0
    active: float = 0.0

    @property
    def total(self) -> float:
        return self.jobs + self.idle + self.active


class Row(BaseModel):
    """One bucket of the comparison."""

    start: str
    journal: Parts
    journal_usd: float
    runpod_gpu_usd: float
    runpod_other_usd: float
    difference_usd: float          # Runpod's GPU figure minus the journal's
    verdict: str
    open: bool = False             # the bucket has not ended yet


class Correction(BaseModel):
    """One estimated attempt :func:`correct_estimates` looked at: its bound, and the bill read (or why not)."""

    runs_dir: str
    key: str
    attempt: int
    job_id: str | None
    bound_usd: float
    read_usd: float | None = None
    why_not: str = ""


class Report(BaseModel):
    endpoint_id: str
    bucket: str
    tolerance_pct: float
    tolerance_usd: float
    rows: list[Row]
    total: Row
    notes: list[str]
    estimated_usd: float = 0.0     # the part of the journal charged at bounds (attempts not read)

    @property
    def agrees(self) -> bool:
        return all(r.verdict == "ok" for r in [*self.rows, self.total])


def spread(t0: float, t1: float, usd: float, step: int) -> dict[int, float]:
    """``usd`` charged over ``[t0, t1]``, split over the ``step``-second buckets it covers (by bucket
    start); a point charge (``t1 <= t0``) falls in the bucket of ``t0``."""
    if t1 <= t0:
        return {int(math.floor(t0 / step) * step): usd}
    out: dict[int, float] = {}
    b = int(math.floor(t0 / step) * step)
    while b < t1:
        share = (min(t1, b + step) - max(t0, b)) / (t1 - t0)
        if share > 0:
            out[b] = out.get(b, 0.0) + usd * share
        b += step
    return out


def journal_buckets(runs_dirs: list[Path], step: int, now: float | None = None,
                    journal_name: str | None = None) -> dict[int, Parts]:
    """The journals' charges per bucket (see the module docstring); ``journal_name``: the journal file in each
    run dir (default the Runpod backend's; :mod:`fleet.reconcile_pool` passes the skypilot backend's)."""
    from fleet.journal import JOURNAL_NAME, Journal, owner_alive

    now = now or time.time()
    out: dict[int, Parts] = {}

    def add(part: str, pieces: dict[int, float]) -> None:
        for b, usd in pieces.items():
            p = out.setdefault(b, Parts())
            setattr(p, part, getattr(p, part) + usd)

    for runs_dir in runs_dirs:
        path = Path(runs_dir) / (journal_name or JOURNAL_NAME)
        if not path.exists():
            kind = "skypilot" if journal_name and journal_name != JOURNAL_NAME else "runpod"
            raise FileNotFoundError(f"no journal at {path}: pass the run dir a {kind} backend wrote "
                                    f"(backend={kind}, its runs_dir)")
        journal = Journal(path)
        measure = journal.pool_measure()   # a pool's idle read from SkyPilot (fleet.reconcile_pool --correct)
        for a in journal.attempt_bills():
            billed_s = (a["delay_time_ms"] + a["execution_time_ms"]) / 1000
            add("jobs", spread(a["ended"] - billed_s, a["ended"], a["cost_usd"], step))
            if measure is None:
                add("idle", spread(a["ended"], a["ended"], a["idle_usd"], step))
        if measure is not None:
            add("idle", spread(measure.start, measure.end, measure.idle_usd, step))
        live = frozenset(s.id for s in journal.sessions() if s.ended is None and owner_alive(s.owner))
        for t0, t1, rate in journal.active_periods(now, live):
            add("active", spread(t0, t1, (t1 - t0) * rate, step))
    return out


def estimated_usd(runs_dirs: list[Path], journal_name: str | None = None) -> float:
    """USD of the journals' attempts charged at their bounds (jobs and idle)."""
    from fleet.journal import JOURNAL_NAME, Journal

    return round(sum(a["cost_usd"] + a["idle_usd"] for d in runs_dirs
                     for a in Journal(Path(d) / (journal_name or JOURNAL_NAME)).estimated_attempts()), 6)


def correct_estimates(runs_dirs: list[Path], client: Any) -> list[Correction]:
    """Read every estimated attempt that has a Runpod id through ``client`` (``status(id)``, e.g.
    :class:`fleet.runpod_api.ServerlessClient`) and, where its status is final with its times, replace the
    bound by that bill (:func:`fleet.billing.attempt_billing` at the attempt's GPUs, the session's
    idle timeout). What was looked at, and why an attempt stays a bound."""
    from fleet.billing import GpuPrices, attempt_billing
    from fleet.journal import JOURNAL_NAME, Journal
    from fleet.runpod_api import FINAL_STATES

    out: list[Correction] = []
    for d in runs_dirs:
        journal = Journal(Path(d) / JOURNAL_NAME)
        idle = max((s.idle_timeout_s for s in journal.sessions()), default=0.0)
        for a in journal.estimated_attempts():
            c = Correction(runs_dir=str(d), key=a["key"], attempt=a["attempt"], job_id=a["job_id"],
                           bound_usd=round(a["cost_usd"] + a["idle_usd"], 6))
            out.append(c)
            if not a["job_id"]:
                c.why_not = "no Runpod id (the run call's answer was lost): it stays a bound"
                continue
            try:
                st = client.status(a["job_id"])
            except RunpodAPIError as e:
                c.why_not = f"unreadable ({str(e)[:120]}; Runpod keeps a job 30 min after it ends)"
                continue
            if st.status not in FINAL_STATES or (st.execution_time_ms is None and st.worker_id):
                c.why_not = f"{st.status} without its execution time: it stays a bound"
                continue
            worker = ((st.output or {}).get("result") or {}).get("worker") if isinstance(st.output, dict) \
                else None
            bill = attempt_billing(st, worker, prices=GpuPrices(), gpu_type=a["gpu_type"] or "NVIDIA RTX A5000",
                                   gpus_per_worker=a["gpus_per_worker"] or 1, idle_timeout_s=idle)
            if journal.correct_attempt(a["key"], a["attempt"], bill):
                c.read_usd = round(bill.cost_usd + bill.idle_usd, 6)
    return out


def endpoint_of(runs_dirs: list[Path]) -> str:
    """The one endpoint the journals' sessions used; ValueError saying to pass ``--endpoint-id`` else."""
    from fleet.journal import JOURNAL_NAME, Journal

    ids = {s.endpoint_id for d in runs_dirs if (Path(d) / JOURNAL_NAME).exists()
           for s in Journal(Path(d) / JOURNAL_NAME).sessions() if s.endpoint_id}
    if len(ids) != 1:
        found = f"several ({sorted(ids)})" if ids else "none"
        raise ValueError(f"the journals name {found} endpoint ids: pass --endpoint-id <id> "
                         "(python -m fleet.endpoint status shows it)")
    return ids.pop()


def runpod_buckets(answer: dict[str, Any], endpoint_id: str) -> dict[int, tuple[float, float]]:
    """Runpod's ``(gpuAmount, totalAmount - gpuAmount)`` per bucket start, for ``endpoint_id``."""
    out: dict[int, tuple[float, float]] = {}
    for r in answer.get("records") or []:
        if r.get("serverlessId") not in (None, endpoint_id):
            continue
        b = int(parse_rfc3339(r["startTime"]).timestamp())
        gpu, total = float(r.get("gpuAmount") or 0.0), float(r.get("totalAmount") or 0.0)
        g, o = out.get(b, (0.0, 0.0))
        out[b] = (g + gpu, o + total - gpu)
    return out


def verdict_of(journal: float, runpod: float, pct: float, usd: float, remote: str = "RUNPOD") -> str:
    if abs(runpod - journal) <= max(usd, pct / 100 * max(abs(journal), abs(runpod))):
        return "ok"
    return f"{remote} HIGHER" if runpod > journal else "JOURNAL HIGHER"


def verdict_notes(rows: list[Any], total: Any, remote: str, open_note: str, remote_higher: str,
                  journal_higher: str) -> list[str]:
    """The notes a comparison table ends with, by the verdicts it holds (``rows`` and ``total`` carry
    ``verdict`` and ``open``): an open bucket, ``<remote> HIGHER`` and ``JOURNAL HIGHER``, each said once with
    what usually causes it (:func:`reconcile` and :func:`fleet.reconcile_pool.reconcile_pool`)."""
    every = [*rows, total]
    return ([open_note] if any(getattr(r, "open", False) for r in rows) else []) \
        + ([remote_higher] if any(r.verdict == f"{remote} HIGHER" for r in every) else []) \
        + ([journal_higher] if any(r.verdict == "JOURNAL HIGHER" for r in every) else [])


def reconcile(mgmt: ManagementClient, runs_dirs: list[Path], endpoint_id: str, bucket: str = "day",
              tolerance_pct: float = TOLERANCE_PCT, tolerance_usd: float = TOLERANCE_USD,
              now: float | None = None) -> Report:
    """Compare the journals of ``runs_dirs`` with Runpod's billing of ``endpoint_id`` per bucket."""
    now = now or time.time()
    step = STEP_S[bucket]
    ours = journal_buckets(runs_dirs, step, now)
    notes: list[str] = []
    if not ours:
        notes.append("the journals hold no billed attempt or session yet")
    first = min(ours) if ours else int(math.floor(now / step) * step)
    last = max(ours) + step if ours else first + step
    answer = mgmt.billing(datetime.fromtimestamp(first, timezone.utc),
                          datetime.fromtimestamp(last, timezone.utc), bucket, serverless_id=endpoint_id)
    theirs = runpod_buckets(answer, endpoint_id)
    rows: list[Row] = []
    for b in sorted(set(ours) | {k for k in theirs if first <= k < last}):
        parts = ours.get(b, Parts())
        gpu, other = theirs.get(b, (0.0, 0.0))
        rows.append(Row(start=datetime.fromtimestamp(b, timezone.utc).strftime("%Y-%m-%d %H:%M"),
                        journal=parts, journal_usd=round(parts.total, 4), runpod_gpu_usd=round(gpu, 4),
                        runpod_other_usd=round(other, 4), difference_usd=round(gpu - parts.total, 4),
                        verdict=verdict_of(parts.total, gpu, tolerance_pct, tolerance_usd),
                        open=b + step > now))
    tj = Parts(jobs=sum(r.journal.jobs for r in rows), idle=sum(r.journal.idle for r in rows),
               active=sum(r.journal.active for r in rows))
    tg, to = sum(theirs.get(b, (0.0, 0.0))[0] for b in theirs if first <= b < last), \
        sum(theirs.get(b, (0.0, 0.0))[1] for b in theirs if first <= b < last)
    total = Row(start="total", journal=tj, journal_usd=round(tj.total, 4), runpod_gpu_usd=round(tg, 4),
                runpod_other_usd=round(to, 4), difference_usd=round(tg - tj.total, 4),
                verdict=verdict_of(tj.total, tg, tolerance_pct, tolerance_usd))
    notes += verdict_notes(
        rows, total, "RUNPOD", "a bucket marked * has not ended: Runpod's figure may still grow; run again after it",
        "RUNPOD HIGHER: jobs on this endpoint the journal does not know of (other run dirs: pass them all with "
        "--runs-dir; requests sent by hand), active workers outside the runs' sessions, cold starts longer than "
        "delayTime shows, or prices in fleet/prices.py older than Runpod's",
        "JOURNAL HIGHER: the journal over-estimates by design (delayTime counts the queue wait, which Runpod does "
        "not bill; the idle charge assumes every worker idles its full timeout), or Runpod's figure for the "
        "bucket is not complete yet, or prices fell")
    if to:
        notes.append(f"'other' = Runpod's disk, platform fee and CPU amounts (${to:.4f}): not modelled by "
                     "the journal and not in the verdict")
    est = estimated_usd(runs_dirs)
    if est:
        notes.append(f"${est:.4f} of the journal is attempts charged at their bound (their bill could not be "
                     "read): an upper bound. Run with --correct (soon after the run) to read the ones that "
                     "have a Runpod id")
    return Report(endpoint_id=endpoint_id, bucket=bucket, tolerance_pct=tolerance_pct,
                  tolerance_usd=tolerance_usd, rows=rows, total=total, notes=notes, estimated_usd=est)


def bucket_table(title: str, columns: list[tuple[str, int, Callable[[Any], float]]], rows: list[Any],
                 total: Any, notes: list[str]) -> str:
    """A reconcile report as text: ``title``, then one line per bucket of ``rows`` and the ``total`` (their
    ``start``, ``open``, ``verdict``), a ``columns`` cell each (header, width, value; the last is the signed
    difference), then the ``notes`` (the tables of ``python -m fleet.reconcile`` and ``fleet.reconcile_pool``)."""
    head = f"{'bucket (UTC)':<17} " + " ".join(f"{name:>{w}}" for name, w, _ in columns) + "  verdict"
    lines = [title, head, "-" * len(head)]
    for r in [*rows, total]:
        if r is total:
            lines.append("-" * len(head))
        cells = " ".join(format(get(r), f">{'+' if i == len(columns) - 1 else ''}{w}.4f")
                         for i, (_, w, get) in enumerate(columns))
        lines.append(f"{r.start + ('*' if r.open else ''):<17} {cells}  {r.verdict}")
    return "\n".join(lines + [f"note: {n}" for n in notes])


def format_report(report: Report) -> str:
    """The table ``python -m fleet.reconcile`` prints."""
    title = (f"endpoint {report.endpoint_id}: journal vs Runpod GET /v2/billing/serverless (gpuAmount), "
             f"per {report.bucket}; tolerance max(${report.tolerance_usd:.2f}, {report.tolerance_pct:g}%)")
    return bucket_table(title, [("jobs", 9, lambda r: r.journal.jobs), ("idle", 9, lambda r: r.journal.idle),
                                ("active", 9, lambda r: r.journal.active), ("journal", 10, lambda r: r.journal_usd),
                                ("runpod", 10, lambda r: r.runpod_gpu_usd), ("other", 8, lambda r: r.runpod_other_usd),
                                ("diff", 9, lambda r: r.difference_usd)], report.rows, report.total, report.notes)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fleet.reconcile", description=__doc__.split("\n")[0])
    ap.add_argument("--runs-dir", type=Path, action="append", required=True,
                    help="a run dir with runpod_journal.sqlite (repeat for every run that used the endpoint)")
    ap.add_argument("--endpoint-id", help="the endpoint (default: the one the journals' sessions name)")
    ap.add_argument("--bucket", choices=sorted(STEP_S), default="day")
    ap.add_argument("--tolerance-pct", type=float, default=TOLERANCE_PCT)
    ap.add_argument("--tolerance-usd", type=float, default=TOLERANCE_USD)
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    ap.add_argument("--rest-url", help="REST v2 base URL (default $AIT_RUNPOD_REST_BASE_URL or Runpod's)")
    ap.add_argument("--correct", action="store_true",
                    help="first read the attempts charged at their bound and journal the bills read")
    ap.add_argument("--job-url", help="the job API's base URL for --correct (default $RUNPOD_ENDPOINT_BASE_URL "
                                      "or Runpod's)")
    args = ap.parse_args(argv)
    key = os.environ.get(API_KEY_ENV, "")
    if not key:
        print(f"error: {API_KEY_ENV} is not set: reconcile reads Runpod's billing (GET "
              f"/v2/billing/serverless). Create a key that can read billing in the Runpod console "
              f"(Settings > API Keys) and export {API_KEY_ENV}=...; the journal's own totals need no "
              "key (RunpodBackend.run_costs())",
              file=sys.stderr)
        return 2
    try:
        endpoint_id = args.endpoint_id or endpoint_of(args.runs_dir)
        if args.correct:
            with ServerlessClient(endpoint_id, key, base_url=args.job_url) as client:
                for c in correct_estimates(args.runs_dir, client):
                    what = f"read ${c.read_usd:.4f}" if c.read_usd is not None else c.why_not
                    print(f"estimate {c.key} attempt {c.attempt} ({c.job_id or 'no id'}): bound "
                          f"${c.bound_usd:.4f}, {what}", file=sys.stderr)
        with ManagementClient(key, base_url=args.rest_url) as mgmt:
            report = reconcile(mgmt, args.runs_dir, endpoint_id, args.bucket, args.tolerance_pct,
                               args.tolerance_usd)
    except (ValueError, FileNotFoundError, RunpodAPIError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(report.model_dump_json(indent=1) if args.json else format_report(report))
    return 0 if report.agrees else 1


if __name__ == "__main__":
    # the canonical module's main, not this __main__ copy's: one class object per exception and type
    from fleet.reconcile import main as _main

    raise SystemExit(_main())
