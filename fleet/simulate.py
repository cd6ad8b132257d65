"""Discrete-event simulator of the GPU fleet: the seed's pod pool against a Runpod Serverless endpoint.

Contract: everything runs on a simulated clock (:class:`SimClock`, no sleeping, no network) and is
deterministic per seed. A fleet is reached only through :class:`FleetAPI`, the project's Runpod client
interface (:class:`fleet.billing.ServerlessClientLike`: ``run(input) -> id``,
``status(id) -> fleet.runpod_api.RunpodJob`` with ``delay_time_ms``/``execution_time_ms``/``worker_id``
measured on the simulated clock, ``cancel``; plus ``status_many``), so :class:`SimulatedServerless` can be
handed to ``RunpodBackend(client=...)`` as it is. A job that fails in training ends COMPLETED with the
worker's verdict ``job_failed`` (as ``gpu/worker.py`` reports it); Runpod-side failures are not modelled.

Two drivers: :func:`run_outer_loop` (the sweep's fast path: the fleet's own accounting, Runpod's billing
rule, each worker billed from start to stop) and :func:`run_through_journal` / :func:`simulate_journal`
(the Serverless path through the project's own bookkeeping: a real :class:`fleet.journal.Journal`
on the simulated clock, claim/attach/update_status/record_result, each attempt billed by
:func:`fleet.billing.attempt_billing`, the active workers as a journal session; its $/job is
``run_costs()`` (jobs + idle + active) / jobs, and :class:`JournalResult` itemises how it differs from
the simulator's own figure). The pod pool has no journal path: the project has no pod client.

Workload (every figure and its source in ``docs/fleet.md``): ``steps`` outer steps of
``jobs_per_step`` jobs; a step's batch is submitted at once and the next step starts ``gap_s`` after
the last job of the batch ends (the trainer waits for its batch, then updates and collects the next
batch). Job execution seconds: lognormal with the given median and p90, except a fraction
``fail_frac`` that fail early (uniform in ``[fail_min_s, fail_max_s]``). Every job uses
``gpus_per_job`` GPUs of one worker or pod.

Fleets:

- :class:`SimulatedPodPool`: up to ``max_pods`` pods; a pod is created when a job waits and no pod is
  idle or being created for it, is ready after ``provision_s + bootstrap_s``, runs one job at a time,
  and is terminated after ``reap_s`` idle. Billed per second from creation to termination at the pod
  $/h.
- :class:`SimulatedServerless`: a queue endpoint with ``workers_min`` active workers (always warm,
  billed all run long at the active price) and flex workers up to ``workers_max`` in all; a flex
  worker starts when a job waits and no worker is idle or starting for it, pays a cold start
  (FlashBoot restore with probability ``flashboot_hit`` when FlashBoot is on), and stops after
  ``idle_timeout_s`` idle. Billed from worker start to stop, each session rounded up to a second.

Metrics (:class:`FleetResult`): realised USD, ideal USD (execution seconds x GPUs x the price, no cold
start, no idle), $/job, realised / ideal, p50/p95 step wall time, worker utilisation (execution
GPU-seconds / billed GPU-seconds), cold starts.

``python -m fleet.simulate`` sweeps the Serverless settings (fast path), prints a markdown table and the pick
(the cheapest configuration whose p95 step time is within ``--latency-factor`` of the best), runs the pick
through the journal (at the backend's default ``max_in_flight`` and at ``workers_max``) beside the pod
pool, and with ``--write-defaults`` writes ``fleet/fleet_defaults.yaml``.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import math
import random
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Protocol

from fleet.dispatch import IN_FLIGHT
from fleet.prices import PRICE_SHEET, cost_usd
from fleet.runpod_api import RunpodJob

if TYPE_CHECKING:
    from fleet.journal import Billing, Journal

Z90 = 1.2815515655446004  # standard normal quantile at 0.90


# ------------------------------------------------------------------------------------------ clock


class SimClock:
    """A simulated clock with an event queue. ``now`` only moves when events run."""

    def __init__(self) -> None:
        self.now = 0.0
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()

    def schedule(self, at: float, action: Callable[[], None]) -> None:
        if at < self.now:
            raise ValueError(f"cannot schedule in the past ({at} < {self.now})")
        heapq.heappush(self._events, (at, next(self._seq), action))

    def next_at(self) -> float | None:
        """When the earliest pending event runs (None: no event left)."""
        return self._events[0][0] if self._events else None

    def run_next(self) -> bool:
        """Run the earliest event; False when none is left."""
        if not self._events:
            return False
        at, _, action = heapq.heappop(self._events)
        self.now = at
        action()
        return True

    def run_until(self, done: Callable[[], bool]) -> None:
        while not done():
            if not self.run_next():
                raise RuntimeError("simulation stalled: no event left and the condition is not met")

    def advance_to(self, at: float) -> None:
        """Run every event up to ``at`` and set the clock there."""
        while self._events and self._events[0][0] <= at:
            self.run_next()
        self.now = max(self.now, at)

    def drain(self) -> None:
        while self.run_next():
            pass


# ---------------------------------------------------------------------------------------- workload


@dataclass(frozen=True)
class Workload:
    steps: int = 54
    jobs_per_step: int = 40
    median_s: float = 1304.0
    p90_s: float = 2000.0
    fail_frac: float = 0.10
    fail_min_s: float = 60.0
    fail_max_s: float = 300.0
    gpus_per_job: int = 2
    gap_s: float = 120.0


@dataclass(frozen=True)
class Job:
    job_id: str
    step: int
    exec_s: float
    failed: bool


def draw_jobs(w: Workload, seed: int) -> list[list[Job]]:
    """The jobs of each step, drawn from ``random.Random(seed)`` (the same for every fleet)."""
    rng = random.Random(seed)
    mu = math.log(w.median_s)
    sigma = math.log(w.p90_s / w.median_s) / Z90 if w.p90_s > w.median_s else 0.0
    steps = []
    for s in range(w.steps):
        batch = []
        for j in range(w.jobs_per_step):
            failed = rng.random() < w.fail_frac
            exec_s = rng.uniform(w.fail_min_s, w.fail_max_s) if failed else rng.lognormvariate(mu, sigma)
            batch.append(Job(f"s{s:03d}-j{j:02d}", s, exec_s, failed))
        steps.append(batch)
    return steps


# ------------------------------------------------------------------------------------- fleet API


class FleetAPI(Protocol):
    """What a driver needs from a fleet: the project's Runpod client interface,
    :class:`fleet.billing.ServerlessClientLike` (``run``, ``status``, ``cancel``) plus
    ``status_many``, which :class:`fleet.runpod_api.ServerlessClient` and the backend's poller use."""

    def run(self, input: dict[str, Any], *, execution_timeout_s: float | None = None,  # noqa: A002
            ttl_s: float | None = None) -> str:
        """Queue a job (Runpod ``POST /run``, its ``policy``: not modelled); return its id."""

    def status(self, job_id: str) -> RunpodJob:
        """The job as Runpod ``GET /status/<id>`` returns it (times in ms on the simulated clock)."""

    def status_many(self, job_ids: Iterable[str]) -> dict[str, RunpodJob]:
        """:meth:`status` of each id."""

    def cancel(self, job_id: str) -> Any:
        """Cancel a queued or running job (Runpod ``POST /cancel/<id>``)."""


@dataclass
class _Request:
    job_id: str
    exec_s: float
    failed: bool
    submitted: float
    client_job_id: str = ""
    started: float | None = None
    finished: float | None = None
    runs: int = 0
    worker: "_Worker | None" = None
    cancelled: bool = False
    gpus: tuple[str, ...] = ()

    def job(self) -> RunpodJob:
        """This request as ``/status/<id>`` shows it. A job that failed in training is COMPLETED with the
        worker's verdict ``job_failed`` (what ``gpu/worker.py`` returns); Runpod's FAILED means a lost
        worker, which the backend retries, and is not modelled."""
        if self.cancelled:
            state = "CANCELLED"
        elif self.finished is not None:
            state = "COMPLETED"
        elif self.started is not None:
            state = "IN_PROGRESS"
        else:
            state = "IN_QUEUE"
        delay = None if self.started is None else round((self.started - self.submitted) * 1000)
        ran = self.finished is not None and self.started is not None
        ex = round((self.finished - self.started) * 1000) if ran else None  # type: ignore[operator]
        output = None
        if state == "COMPLETED":
            output = {"result": {"job_id": self.client_job_id, "status": "job_failed" if self.failed
                                 else "succeeded", "worker": {"gpus": list(self.gpus)}}}
        return RunpodJob(id=self.job_id, status=state, delay_time_ms=delay, execution_time_ms=ex,
                         worker_id=None if self.worker is None else f"w{self.worker.wid}", output=output)


@dataclass
class _Worker:
    wid: int
    kind: str  # "flex" | "active" | "pod"
    started: float
    state: str = "STARTING"  # STARTING | IDLE | BUSY | STOPPED
    stopped: float | None = None
    token: int = 0  # invalidates a pending idle-stop event
    busy_s: float = 0.0
    ready: float | None = None  # end of the cold start


class _QueueFleet:
    """Shared queue, dispatch and billing of both simulated fleets (one job per worker at a time)."""

    gpu_type: str
    gpus: int
    round_up: bool

    def __init__(self, clock: SimClock, max_workers: int) -> None:
        self.clock = clock
        self.max_workers = max_workers
        self.queue: list[_Request] = []
        self.requests: dict[str, _Request] = {}
        self.workers: list[_Worker] = []
        self.cold_starts = 0
        self._ids = itertools.count()

    # -- API (FleetAPI: the project's Runpod client interface)
    def run(self, input: dict[str, Any], *, execution_timeout_s: float | None = None,  # noqa: A002
            ttl_s: float | None = None) -> str:
        job_id = f"sim-{next(self._ids)}"
        req = _Request(job_id, float(input["exec_s"]), bool(input.get("failed", False)), self.clock.now,
                       client_job_id=str(input.get("job_id", "")), gpus=(self.gpu_type,) * self.gpus)
        self.requests[job_id] = req
        self.queue.append(req)
        self._dispatch()
        return job_id

    def status(self, job_id: str) -> RunpodJob:
        return self.requests[job_id].job()

    def status_many(self, job_ids: Iterable[str]) -> dict[str, RunpodJob]:
        return {i: self.requests[i].job() for i in dict.fromkeys(job_ids)}

    def cancel(self, job_id: str) -> dict[str, Any]:
        """A queued job leaves the queue; a running one stops now (its worker is billed up to here)."""
        req = self.requests[job_id]
        if req.finished is None:
            req.cancelled, req.finished = True, self.clock.now
            if req.started is None:
                self.queue.remove(req)
            elif req.worker is not None:
                w = req.worker
                w.busy_s += self.clock.now - req.started
                self._free(w)
        return {"id": job_id, "status": req.job().status}

    # -- internals
    def _alive(self) -> list[_Worker]:
        return [w for w in self.workers if w.state != "STOPPED"]

    def _start_delay(self) -> float:
        raise NotImplementedError

    def _idle_limit(self, w: _Worker) -> float | None:
        raise NotImplementedError

    def _dispatch(self) -> None:
        for w in self.workers:
            if not self.queue:
                break
            if w.state == "IDLE":
                self._run(w, self.queue.pop(0))
        starting = sum(w.state == "STARTING" for w in self.workers)
        room = self.max_workers - len(self._alive())
        for _ in range(max(0, min(len(self.queue) - starting, room))):
            self._start_worker("pod" if isinstance(self, SimulatedPodPool) else "flex")

    def _start_worker(self, kind: str, warm: bool = False) -> _Worker:
        w = _Worker(len(self.workers), kind, self.clock.now)
        self.workers.append(w)
        if warm:
            w.state, w.ready = "IDLE", self.clock.now
            return w
        self.cold_starts += 1
        self.clock.schedule(self.clock.now + self._start_delay(), lambda: self._ready(w))
        return w

    def _ready(self, w: _Worker) -> None:
        w.state = "IDLE"
        w.ready = self.clock.now
        if self.queue:
            self._run(w, self.queue.pop(0))
        else:
            self._idle(w)
        self._dispatch()

    def _run(self, w: _Worker, req: _Request) -> None:
        w.state = "BUSY"
        w.token += 1
        req.started, req.worker = self.clock.now, w
        req.runs += 1
        self.clock.schedule(self.clock.now + req.exec_s, lambda: self._done(w, req))

    def _done(self, w: _Worker, req: _Request) -> None:
        if req.cancelled:
            return
        req.finished = self.clock.now
        w.busy_s += req.exec_s
        self._free(w)

    def _free(self, w: _Worker) -> None:
        w.state = "IDLE"
        w.token += 1
        if self.queue:
            self._run(w, self.queue.pop(0))
        else:
            self._idle(w)

    def _idle(self, w: _Worker) -> None:
        limit = self._idle_limit(w)
        if limit is None:
            return
        w.token += 1
        token = w.token
        self.clock.schedule(self.clock.now + limit, lambda: self._maybe_stop(w, token))

    def _maybe_stop(self, w: _Worker, token: int) -> None:
        if w.state == "IDLE" and w.token == token:
            w.state = "STOPPED"
            w.stopped = self.clock.now

    def close(self) -> None:
        """Let idle timers run out, then stop what is left (active workers) now."""
        self.clock.drain()
        for w in self.workers:
            if w.state != "STOPPED":
                if w.state == "BUSY":
                    raise RuntimeError("close() with a job still running")
                w.state = "STOPPED"
                w.stopped = self.clock.now

    # -- accounting
    def billed_s(self, w: _Worker) -> float:
        end = w.stopped if w.stopped is not None else self.clock.now
        s = end - w.started
        return math.ceil(s - 1e-9) if self.round_up else s

    def realised_usd(self) -> float:
        return sum(cost_usd(self.gpu_type, self.billed_s(w), self.gpus, self._bill_kind(w))
                   for w in self.workers)

    def _bill_kind(self, w: _Worker) -> str:
        return w.kind

    def ideal_usd(self) -> float:
        kind = "pod" if isinstance(self, SimulatedPodPool) else "flex"
        execs = sum(r.exec_s for r in self.requests.values() if r.finished is not None)
        return cost_usd(self.gpu_type, execs, self.gpus, kind)

    def utilisation(self) -> float:
        billed = sum(self.billed_s(w) for w in self.workers)
        return sum(w.busy_s for w in self.workers) / billed if billed else 0.0


# ---------------------------------------------------------------------------------------- fleets


@dataclass(frozen=True)
class PodPoolConfig:
    gpu_type: str = "NVIDIA RTX A5000"
    gpus: int = 2
    max_pods: int = 16
    provision_s: float = 120.0
    bootstrap_s: float = 300.0
    reap_s: float = 300.0
    round_up: bool = True


class SimulatedPodPool(_QueueFleet):
    """The seed's home-made pool (see the module docstring)."""

    def __init__(self, clock: SimClock, cfg: PodPoolConfig) -> None:
        super().__init__(clock, cfg.max_pods)
        self.cfg = cfg
        self.gpu_type, self.gpus, self.round_up = cfg.gpu_type, cfg.gpus, cfg.round_up

    def _start_delay(self) -> float:
        return self.cfg.provision_s + self.cfg.bootstrap_s

    def _idle_limit(self, w: _Worker) -> float | None:
        return self.cfg.reap_s


@dataclass(frozen=True)
class ServerlessConfig:
    gpu_type: str = "NVIDIA RTX A5000"
    gpus: int = 2
    workers_min: int = 0
    workers_max: int = 16
    idle_timeout_s: float = 5.0
    flashboot: bool = True
    cold_start_s: float = 120.0
    flashboot_restore_s: float = 7.0
    flashboot_hit: float = 0.5
    active_discount: bool = True  # False: active workers billed at the flex price
    round_up: bool = True


class SimulatedServerless(_QueueFleet):
    """A simulated Runpod Serverless queue endpoint (see the module docstring)."""

    def __init__(self, clock: SimClock, cfg: ServerlessConfig, seed: int = 0) -> None:
        if not 0 <= cfg.workers_min <= cfg.workers_max:
            raise ValueError(f"need 0 <= workers_min <= workers_max, got {cfg.workers_min}, "
                             f"{cfg.workers_max}")
        super().__init__(clock, cfg.workers_max)
        self.cfg = cfg
        self.gpu_type, self.gpus, self.round_up = cfg.gpu_type, cfg.gpus, cfg.round_up
        self.rng = random.Random(f"coldstart-{seed}")
        for _ in range(cfg.workers_min):
            self._start_worker("active", warm=True)

    def _start_delay(self) -> float:
        if self.cfg.flashboot and self.rng.random() < self.cfg.flashboot_hit:
            return self.cfg.flashboot_restore_s
        return self.cfg.cold_start_s

    def _idle_limit(self, w: _Worker) -> float | None:
        return None if w.kind == "active" else self.cfg.idle_timeout_s

    def _bill_kind(self, w: _Worker) -> str:
        return "flex" if w.kind == "active" and not self.cfg.active_discount else w.kind


# ---------------------------------------------------------------------------------------- driver


@dataclass(frozen=True)
class SkyPoolConfig:
    """A SkyPilot pool (``fleet.settings.PoolSpec``): ``min_workers``..``max_workers`` pods of ``gpus`` GPUs,
    scaled by SkyPilot's queue-length autoscaler (skypilot 0.14.1 ``sky/serve/autoscalers.py``
    ``QueueLengthAutoscaler`` with ``_AutoscalerWithHysteresis``; ``sky/serve/constants.py``): a decision
    every ``decision_s`` (20 s; 5 s while the target is 0); pending jobs above ``threshold`` ask for one
    more worker, none pending for none, below it for one fewer, never 0 while a job is pending; a raise
    takes effect after ``upscale_delay_s`` of consecutive decisions asking for it (at once from a target of
    0), a cut after ``downscale_delay_s``; only idle workers are removed. Workers take jobs from the pool's
    queue one at a time and are reused (no per-job provisioning: docs.skypilot.co, "Pools"). A new worker is
    ready after ``provision_s + bootstrap_s``. Billed per second from creation to termination at the pod
    $/h."""

    gpu_type: str = "NVIDIA RTX A5000"
    gpus: int = 1
    min_workers: int = 0
    max_workers: int = 16
    upscale_delay_s: float = 20.0
    downscale_delay_s: float = 300.0
    threshold: int = 1
    decision_s: float = 20.0
    no_replica_decision_s: float = 5.0
    provision_s: float = 120.0
    bootstrap_s: float = 300.0
    round_up: bool = True


class SimulatedSkyPilotPool(_QueueFleet):
    """A SkyPilot pool with its queue-length autoscaler (see :class:`SkyPoolConfig`)."""

    def __init__(self, clock: SimClock, cfg: SkyPoolConfig) -> None:
        super().__init__(clock, cfg.max_workers)
        self.cfg = cfg
        self.gpu_type, self.gpus, self.round_up = cfg.gpu_type, cfg.gpus, cfg.round_up
        self.target = cfg.min_workers
        self._up = self._down = 0
        self._ticking = False
        for _ in range(cfg.min_workers):
            self._start_worker("pod")
        self._tick_later()

    def _start_delay(self) -> float:
        return self.cfg.provision_s + self.cfg.bootstrap_s

    def _idle_limit(self, w: _Worker) -> float | None:
        return None   # the autoscaler reaps

    def _dispatch(self) -> None:
        for w in self.workers:
            if not self.queue:
                break
            if w.state == "IDLE":
                self._run(w, self.queue.pop(0))
        self._tick_later()

    def _tick_later(self) -> None:
        if self._ticking:
            return
        self._ticking = True
        every = self.cfg.no_replica_decision_s if self.target == 0 else self.cfg.decision_s
        self.clock.schedule(self.clock.now + every, self._tick)

    def _tick(self) -> None:
        self._ticking = False
        c, q = self.cfg, len(self.queue)
        want = 0 if q == 0 else self.target + 1 if q > c.threshold else self.target - 1 if q < c.threshold \
            else self.target
        if want == 0 and q > 0:
            want = 1
        want = min(c.max_workers, max(c.min_workers, want))
        if self.target == 0:
            self.target = want
        elif want > self.target:
            self._up, self._down = self._up + 1, 0
            if self._up >= max(1, int(c.upscale_delay_s / c.decision_s)):
                self._up, self.target = 0, want
        elif want < self.target:
            self._down, self._up = self._down + 1, 0
            if self._down >= max(1, int(c.downscale_delay_s / c.decision_s)):
                self._down, self.target = 0, want
        else:
            self._up = self._down = 0
        alive = self._alive()
        for _ in range(self.target - len(alive)):
            self._start_worker("pod")
        excess = len(alive) - self.target
        for w in alive:
            if excess <= 0:
                break
            if w.state == "IDLE":
                w.state, w.stopped = "STOPPED", self.clock.now
                excess -= 1
        busy = any(w.state in ("BUSY", "STARTING") for w in self.workers)
        if self.queue or busy or len(self._alive()) > c.min_workers:
            self._tick_later()

    def ideal_usd(self) -> float:
        execs = sum(r.exec_s for r in self.requests.values() if r.finished is not None)
        return cost_usd(self.gpu_type, execs, self.gpus, "pod")


def skypilot_factory(cfg: SkyPoolConfig) -> "FleetFactory":
    return lambda clock, seed: SimulatedSkyPilotPool(clock, cfg)


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


FleetFactory = Callable[[SimClock, int], _QueueFleet]


def serverless_factory(cfg: ServerlessConfig) -> FleetFactory:
    return lambda clock, seed: SimulatedServerless(clock, cfg, seed)


def pod_factory(cfg: PodPoolConfig) -> FleetFactory:
    return lambda clock, seed: SimulatedPodPool(clock, cfg)


# ------------------------------------------------------------------------------------- journal path

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


# ----------------------------------------------------------------------------------------- sweep

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fleet.simulate", description=__doc__.split("\n\n")[0])
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


if __name__ == "__main__":
    # the canonical module's main, not this __main__ copy's: one class object per exception and type
    from fleet.simulate import main as _main

    raise SystemExit(_main())
