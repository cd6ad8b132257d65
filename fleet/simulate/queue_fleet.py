"""A fleet behind the project's Runpod client interface (:class:`FleetAPI`) and the queue-and-workers model the
three simulated fleets share (:class:`QueueFleet`: requests, workers, starts, idle stops, billing)."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Iterable, Protocol

from fleet.prices import cost_usd
from fleet.runpod_api import RunpodJob

from fleet.simulate.clock import SimClock


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
    """Shared queue, dispatch and billing of the simulated fleets (one job per worker at a time)."""

    gpu_type: str
    gpus: int
    round_up: bool
    #: the price a worker it starts for a waiting job bills at (fleet.prices: "flex" or "pod")
    worker_kind: str = "flex"

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

    def _hand_out(self) -> None:
        """Give the waiting jobs to the idle workers, oldest first."""
        for w in self.workers:
            if not self.queue:
                break
            if w.state == "IDLE":
                self._run(w, self.queue.pop(0))

    def _dispatch(self) -> None:
        """Hand out the waiting jobs, then start a worker for each job still waiting (within the limit)."""
        self._hand_out()
        starting = sum(w.state == "STARTING" for w in self.workers)
        room = self.max_workers - len(self._alive())
        for _ in range(max(0, min(len(self.queue) - starting, room))):
            self._start_worker(self.worker_kind)

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
        execs = sum(r.exec_s for r in self.requests.values() if r.finished is not None)
        return cost_usd(self.gpu_type, execs, self.gpus, self.worker_kind)

    def utilisation(self) -> float:
        billed = sum(self.billed_s(w) for w in self.workers)
        return sum(w.busy_s for w in self.workers) / billed if billed else 0.0
