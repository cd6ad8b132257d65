"""The Serverless path through the project's own bookkeeping: a real :class:`fleet.journal.Journal` on the
simulated clock, each attempt billed by :func:`fleet.billing.attempt_billing` (:func:`simulate_journal`)."""

from __future__ import annotations

import math
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

from fleet.dispatch import IN_FLIGHT
from fleet.prices import cost_usd
from fleet.runpod_api import RunpodJob

if TYPE_CHECKING:
    from fleet.journal import Billing, Journal
from fleet.simulate.clock import SimClock
from fleet.simulate.driver import FleetResult, _tally
from fleet.simulate.fleets import ServerlessConfig, SimulatedServerless
from fleet.simulate.queue_fleet import FleetAPI
from fleet.simulate.workload import Job, Workload, draw_jobs


OWNER = "fleet.simulate"
#: jobs out at once when the backend is left to its default (RunpodOptions.max_in_flight None: the
#: endpoint's workers_max); a fixed figure above it shows what sending more than there are workers bills
OVER_SENT_MAX_IN_FLIGHT = 16


def run_through_journal(api: FleetAPI, clock: SimClock, steps: list[list[Job]], gap_s: float,
                        journal: "Journal", bill: Callable[[RunpodJob, dict[str, Any] | None], "Billing"],
                        poll_s: float, max_in_flight: int) -> list[float]:
    """The outer loop as the ``runpod`` backend runs it, on the simulated clock: each job is claimed in the
    journal (key ``<job id>:0``), sent with ``api.run`` while fewer than ``max_in_flight`` are out, its id
    attached; a sweep every ``poll_s`` simulated seconds reads ``api.status_many`` of the jobs out,
    journals IN_QUEUE/IN_PROGRESS when they change, and records each COMPLETED result with
    ``bill(status, result["worker"])`` (:func:`fleet.billing.attempt_billing`). Sweeps that
    would see no change (no event since the last one) are skipped, which changes nothing. Returns each
    step's wall time, submit to the sweep that saw its last job end."""
    walls = []
    for s, batch in enumerate(steps):
        if s:
            clock.advance_to(clock.now + gap_s)
        t0 = clock.now
        pending: deque[tuple[str, dict[str, Any]]] = deque()
        for j in batch:
            key = f"{j.job_id}:0"
            _, new = journal.claim(key, claimant=j.job_id, episode_id=f"step-{s:03d}", owner=OWNER)
            if not new:
                raise AssertionError(f"{key} was claimed before")
            pending.append((key, {"job_id": j.job_id, "exec_s": j.exec_s, "failed": j.failed}))
        out: dict[str, list[str]] = {}   # Runpod id -> [key, last status seen]
        left = len(batch)
        while True:
            while pending and len(out) < max_in_flight:
                key, inp = pending.popleft()
                job_id = api.run(inp)
                if not journal.attach(key, job_id, 1):
                    raise AssertionError(f"{key}: attach refused")
                out[job_id] = [key, ""]
            if not left:
                break
            at = clock.next_at()
            if at is None:
                raise RuntimeError("simulation stalled: jobs out and no event left")
            clock.advance_to(math.ceil(at / poll_s) * poll_s)   # the first sweep that sees the next event
            for job_id, st in api.status_many(list(out)).items():
                key, seen = out[job_id]
                if st.status in IN_FLIGHT:
                    if st.status != seen:
                        out[job_id][1] = st.status
                        journal.update_status(key, IN_FLIGHT[st.status], job_id)  # type: ignore[arg-type]
                elif st.status == "COMPLETED":
                    result = st.output["result"]
                    if not journal.record_result(key, job_id, st.output, bill(st, result.get("worker")),
                                                 str(result.get("status", ""))):
                        raise AssertionError(f"{key}: result recorded twice")
                    del out[job_id]
                    left -= 1
                else:   # the simulated server neither loses workers nor times jobs out
                    raise RuntimeError(f"simulated job {job_id} ended {st.status}: not modelled")
        walls.append(clock.now - t0)
    return walls


@dataclass
class JournalResult:
    """A Serverless configuration run through the journal. ``sim``: the simulator's own accounting of the
    same runs (every worker billed start to stop, rounded up to a second: Runpod's billing rule);
    ``jobs_usd``/``idle_usd``/``active_usd``: the journal's :meth:`Journal.run_costs`, summed over seeds;
    the three ``*_excess_usd`` explain the difference (see :func:`simulate_journal`)."""

    label: str
    sim: FleetResult
    rows: int = 0
    attempts: int = 0
    jobs_usd: float = 0.0
    idle_usd: float = 0.0
    active_usd: float = 0.0
    step_wall_s: list[float] = field(default_factory=list)
    delay_excess_usd: float = 0.0
    idle_excess_usd: float = 0.0
    active_jobs_usd: float = 0.0
    seconds: float = 0.0

    @property
    def total_usd(self) -> float:
        return self.jobs_usd + self.idle_usd + self.active_usd

    @property
    def usd_per_job(self) -> float:
        return self.total_usd / self.rows

    @property
    def explained_usd(self) -> float:
        """The simulator's USD plus the three excesses (equals :attr:`total_usd` up to rounding)."""
        return self.sim.realised_usd + self.delay_excess_usd + self.idle_excess_usd + self.active_jobs_usd

    def p(self, q: float) -> float:
        xs = sorted(self.step_wall_s)
        return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]


def simulate_journal(cfg: ServerlessConfig, w: Workload, seeds: Iterable[int], label: str = "serverless",
                     poll_s: float | None = None, max_in_flight: int | None = None) -> JournalResult:
    """Run the workload once per seed through the project's own code: :class:`SimulatedServerless` as the
    Runpod client, a real :class:`fleet.journal.Journal` (a temporary SQLite file per seed, on the
    simulated clock), each attempt billed by :func:`fleet.billing.attempt_billing`, the active
    workers as a journal session. ``poll_s``/``max_in_flight``: the backend's options (None: their
    defaults, 5 s and the endpoint's ``workers_max``).

    The journal bills every attempt ``delayTime + executionTime`` plus the idle timeout, and the active
    workers over the session; Runpod (and the simulator) bill each worker from start to stop. The journal
    is higher by ``delay_excess_usd`` (queue wait in ``delayTime``, less cold starts of workers no job
    waited for), ``idle_excess_usd`` (the idle timeout charged after every attempt, less what flex workers
    really idled) and ``active_jobs_usd`` (jobs on active workers, billed as attempts at the flex price
    and again as active time)."""
    from fleet.billing import GpuPrices, attempt_billing
    from fleet.settings import RunpodOptions
    from fleet.journal import JOURNAL_NAME, Journal, Session
    from fleet.prices import active_2025_per_s, pool_of, price_per_s

    t_start = time.perf_counter()
    poll = poll_s if poll_s is not None else RunpodOptions.model_fields["poll_interval_s"].default
    most = max_in_flight if max_in_flight is not None else cfg.workers_max
    prices = GpuPrices()
    pool = pool_of(cfg.gpu_type)
    active_per_s = cfg.workers_min * cfg.gpus * (active_2025_per_s(pool) if cfg.active_discount
                                                 else price_per_s(pool))
    flex_per_s = cost_usd(cfg.gpu_type, 1.0, cfg.gpus, "flex")

    def bill(st: RunpodJob, worker: dict[str, Any] | None) -> "Billing":
        return attempt_billing(st, worker, prices=prices, gpu_type=cfg.gpu_type, gpus_per_worker=cfg.gpus,
                               idle_timeout_s=cfg.idle_timeout_s)

    out = JournalResult(label, FleetResult(label, 0, 0.0, 0.0))
    for seed in seeds:
        clock = SimClock()
        fleet = SimulatedServerless(clock, cfg, seed)
        with tempfile.TemporaryDirectory(prefix="ait-sim-journal-") as tmp:
            journal = Journal(Path(tmp) / JOURNAL_NAME, now=lambda: clock.now)
            sid = f"{OWNER}:{seed}"
            journal.open_session(Session(
                id=sid, owner=OWNER, endpoint_id="simulated", started=clock.now, heartbeat=clock.now,
                workers_min=cfg.workers_min, gpus_per_worker=cfg.gpus, pool=pool,
                active_usd_per_s=active_per_s, idle_timeout_s=cfg.idle_timeout_s, source="fleet.simulate"))
            walls = run_through_journal(fleet, clock, draw_jobs(w, seed), w.gap_s, journal, bill, poll, most)
            makespan = clock.now
            fleet.close()   # flex workers idle out; active ones stop with the session
            journal.close_session(sid)
            costs = journal.run_costs()
            counts = journal.counts()
            attempts = len(journal.attempt_bills())
            journal.close()
        _tally(out.sim, fleet, walls, makespan, w)
        out.rows += sum(counts.values())
        if counts != {"completed": w.steps * w.jobs_per_step} or attempts != w.steps * w.jobs_per_step:
            raise AssertionError(f"journal rows {counts}, {attempts} attempts: not every job exactly once")
        out.attempts += attempts
        out.jobs_usd += costs.jobs
        out.idle_usd += costs.idle
        out.active_usd += costs.active
        out.step_wall_s += walls
        reqs = list(fleet.requests.values())
        flex = [x for x in fleet.workers if x.kind == "flex"]
        cold = sum((x.ready if x.ready is not None else x.started) - x.started for x in flex)
        idled = sum((x.stopped or clock.now) - (x.ready or x.started) - x.busy_s for x in flex)
        delay = sum(r.started - r.submitted for r in reqs if r.started is not None)
        took = sum(r.worker is not None for r in reqs)
        out.delay_excess_usd += (delay - cold) * flex_per_s
        out.idle_excess_usd += (took * cfg.idle_timeout_s - idled) * flex_per_s
        out.active_jobs_usd += sum(x.busy_s for x in fleet.workers if x.kind == "active") * flex_per_s
    out.seconds = time.perf_counter() - t_start
    return out
