"""The three simulated fleets (the package docstring says how each starts, stops and bills): the seed's pod
pool, a Runpod Serverless queue endpoint and a SkyPilot pool with its queue-length autoscaler."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable


from fleet.simulate.clock import SimClock
from fleet.simulate.queue_fleet import _QueueFleet, _Worker


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
    """The seed's home-made pool (see the package docstring)."""

    worker_kind = "pod"

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
    """A simulated Runpod Serverless queue endpoint (see the package docstring)."""

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

    worker_kind = "pod"

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

    def _dispatch(self) -> None:   # workers are started by the autoscaler's ticks, not per waiting job
        self._hand_out()
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



def skypilot_factory(cfg: SkyPoolConfig) -> "FleetFactory":
    return lambda clock, seed: SimulatedSkyPilotPool(clock, cfg)


FleetFactory = Callable[[SimClock, int], _QueueFleet]


def serverless_factory(cfg: ServerlessConfig) -> FleetFactory:
    return lambda clock, seed: SimulatedServerless(clock, cfg, seed)


def pod_factory(cfg: PodPoolConfig) -> FleetFactory:
    return lambda clock, seed: SimulatedPodPool(clock, cfg)
