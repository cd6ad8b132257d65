"""The fast driver: an outer loop of steps on a fleet's own accounting (:func:`run_outer_loop`), its metrics
(:class:`FleetResult`) over seeds (:func:`simulate`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterable


from fleet.simulate.clock import SimClock
from fleet.simulate.queue_fleet import FleetAPI, _QueueFleet
from fleet.simulate.workload import Job, Workload, draw_jobs


@dataclass
class FleetResult:
    label: str
    jobs: int
    realised_usd: float
    ideal_usd: float
    step_wall_s: list[float] = field(default_factory=list)
    utilisation: float = 0.0
    cold_starts: int = 0
    makespan_s: float = 0.0
    runs: int = 0
    busy_s: float = 0.0     # execution seconds, all workers
    billed_s: float = 0.0   # billed worker seconds, all workers

    @property
    def usd_per_job(self) -> float:
        return self.realised_usd / self.jobs

    @property
    def ratio(self) -> float:
        return self.realised_usd / self.ideal_usd

    def p(self, q: float) -> float:
        xs = sorted(self.step_wall_s)
        return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]


def run_outer_loop(api: FleetAPI, clock: SimClock, steps: list[list[Job]], gap_s: float) -> list[float]:
    """Submit each step's batch, wait (on the simulated clock) for all of it, wait ``gap_s``, repeat.
    Returns each step's wall time (submit to last job done). Only ``run``/``status`` touch the fleet (the
    sweep's fast path: no journal; :func:`run_through_journal` is the backend's path)."""
    walls = []
    for s, batch in enumerate(steps):
        if s:
            clock.advance_to(clock.now + gap_s)
        t0 = clock.now
        left = [api.run({"job_id": j.job_id, "exec_s": j.exec_s, "failed": j.failed}) for j in batch]

        def done() -> bool:
            while left and api.status(left[-1]).final:   # a final job stays final
                left.pop()
            return not left

        clock.run_until(done)
        walls.append(clock.now - t0)
    return walls


def _tally(total: FleetResult, fleet: _QueueFleet, walls: list[float], makespan: float, w: Workload) -> None:
    """Add one closed run of ``fleet`` to ``total`` (the simulator's own accounting, Runpod's rule)."""
    done = [r for r in fleet.requests.values() if r.finished is not None and not r.cancelled]
    if len(done) != w.steps * w.jobs_per_step or any(r.runs != 1 for r in fleet.requests.values()):
        raise AssertionError("a job did not complete exactly once")
    total.step_wall_s += walls
    total.jobs += len(done)
    total.realised_usd += fleet.realised_usd()
    total.ideal_usd += fleet.ideal_usd()
    total.cold_starts += fleet.cold_starts
    total.makespan_s += makespan
    total.runs += 1
    total.busy_s += sum(x.busy_s for x in fleet.workers)
    total.billed_s += sum(fleet.billed_s(x) for x in fleet.workers)
    total.utilisation = total.busy_s / total.billed_s if total.billed_s else 0.0


def simulate(fleet_factory: Callable[[SimClock, int], _QueueFleet], w: Workload, seeds: Iterable[int],
             label: str) -> FleetResult:
    """Run the workload once per seed and pool the results (the sweep's fast path, no journal)."""
    total = FleetResult(label, 0, 0.0, 0.0)
    for seed in seeds:
        clock = SimClock()
        fleet = fleet_factory(clock, seed)
        walls = run_outer_loop(fleet, clock, draw_jobs(w, seed), w.gap_s)
        makespan = clock.now
        fleet.close()
        _tally(total, fleet, walls, makespan, w)
    return total
