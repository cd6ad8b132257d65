"""Limits in work, not seconds: what bounds a local job, and whose fault a stop is.

On the local backend a job's wall time measures the machine (2 shared cores, other jobs, the load) more than
the job: the warehouse reference took 1,094 s of a 1,200 s wall-clock limit at load 8-9. So what bounds a
job is its **work**, the same on every machine, and a wall-clock stop is ours unless the agent's code caused it.

- **Ours, bounded by the job's settings** (the bounds check them): steps, rollouts per step (``batch_size``),
  tokens per turn (``max_tokens``) and per rollout (``seq_len``). The model endpoint's work in a step is
  checked against them (:class:`WorkBudget`): the rollouts of one step may sample at most ``rollouts x
  seq_len`` tokens (every turn of a rollout lives in its context) in at most ``rollouts x
  max_requests_per_rollout`` model calls; more is the job's fault (an environment that calls the model in a
  loop), ``job_failed``.
- **The agent's code** (its environment and rubric, in the sandbox): its CPU time, read from outside the
  sandbox by the kernel's accounting of every sandbox process (:func:`ait_env.processes.tree_cpu_seconds`),
  at most ``load_cpu_s`` to load the environment and ``cpu_s_per_rollout x rollouts + cpu_s_per_step`` per step
  (the sandbox's CPU rlimit caps each process at the whole job's); more is ``job_failed``. CPU seconds do not
  grow with the load.
- **Idle**: every ``window_s`` of a step without results, :class:`StepWatch` looks at who used that window:
  the endpoint generating (ours), the sandbox computing (the agent's, within its CPU budget), or neither. A
  window in which the endpoint was busy less than ``min_busy_share`` of it and the sandbox used less than
  ``idle_cpu_share`` of it on a CPU is the agent's code waiting on itself (a sleep, a deadlock, a blocked
  call): ``job_failed``. Otherwise the machine is slow, and the watch waits on.
- **Backstop**: a job still training ``backstop_s`` after it started (checked at each step and while one
  waits) is stopped as ``infra_failed`` with the fault ``slow_machine`` (:data:`SLOW_MACHINE`): the machine, not
  the job (the local backend retries it), unless the agent's code took more than ``max_agent_share`` of the
  job's training time on a CPU (burning CPU within the per-step budget would otherwise slow a job past its
  backstop and void its episode) or the step it stops shows the agent's code idle: then ``job_failed``.

Every verdict's message says what was measured (seconds, shares, CPU seconds, the load average) and, for the
job's faults, what to change. The clock, the CPU reader and the endpoint's counters are injectable, so the
verdicts are tested with controlled clocks (``tests/cpu/test_budget.py``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ait_env.jobs.failures import InfraFailed, JobFailed

#: the fault of a job stopped because the machine was too slow (ours; the local backend retries it)
SLOW_MACHINE = "slow_machine"


class BudgetExceeded(JobFailed):
    """The agent's code exceeded its work budget or held a step on its own: the job's fault (``job_failed``)."""


@dataclass(frozen=True)
class WorkBudget:
    """The work one local job may do (see the module docstring); built by :meth:`for_job`."""

    rollouts: int                       # per step: batch_size
    seq_len: int
    max_requests_per_rollout: int = 64
    cpu_s_per_rollout: float = 1.0
    cpu_s_per_step: float = 60.0
    load_cpu_s: float = 300.0
    window_s: float = 600.0
    min_busy_share: float = 0.2
    idle_cpu_share: float = 0.05
    max_agent_share: float = 0.25
    backstop_s: float = 4 * 3600.0

    @property
    def step_tokens(self) -> int:
        return self.rollouts * self.seq_len

    @property
    def step_requests(self) -> int:
        return self.rollouts * self.max_requests_per_rollout

    @property
    def step_cpu_s(self) -> float:
        return self.cpu_s_per_rollout * self.rollouts + self.cpu_s_per_step

    def job_cpu_s(self, steps: int) -> float:
        """The CPU seconds the sandbox may use over the whole job (the rlimit of each of its processes)."""
        return self.load_cpu_s + steps * self.step_cpu_s


@dataclass
class Usage:
    """Counters at one moment: the endpoint's generation seconds, sampled tokens and requests, the
    sandbox's CPU seconds, and the clock."""

    at: float
    busy_s: float
    tokens: int
    requests: int
    cpu_s: float

    def minus(self, o: Usage) -> Usage:
        return Usage(self.at - o.at, self.busy_s - o.busy_s, self.tokens - o.tokens, self.requests - o.requests,
                     self.cpu_s - o.cpu_s)


def load_text() -> str:
    """The machine's load, for messages: "load average 8.4 on 2 cores"."""
    try:
        return f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count() or 1} cores"
    except OSError:
        return "load average unknown"


class StepWatch:
    """Waits for the rollout worker's results of a step (or its hello) under the job's :class:`WorkBudget`.

    ``wait_results(step, timeout)``: the step channel's (raises ``TimeoutError`` when nothing came within
    ``timeout``); ``endpoint()``: ``(busy_s, tokens, requests)``, the endpoint's running totals;
    ``cpu()``: the sandbox's CPU seconds so far; ``started``: when the job started (``clock``'s time)."""

    def __init__(self, budget: WorkBudget, wait_results: Callable[[int, float], Any],
                 endpoint: Callable[[], tuple[float, int, int]], cpu: Callable[[], float], *,
                 started: float | None = None, clock: Callable[[], float] = time.monotonic,
                 poll_s: float = 5.0) -> None:
        self.budget, self._wait, self._endpoint, self._cpu, self.clock = budget, wait_results, endpoint, cpu, clock
        self.started = clock() if started is None else started
        self.poll_s = min(poll_s, budget.window_s / 4)
        self.first = self.usage()   # the agent's share of the job's time is counted from here

    def usage(self) -> Usage:
        busy, tokens, requests = self._endpoint()
        return Usage(self.clock(), busy, tokens, requests, self._cpu())

    def wait(self, step: int) -> Any:
        """The results of ``step`` (-1: the worker's hello after ``load_environment``). Raises
        :class:`BudgetExceeded` for the job's faults and :class:`~ait_env.jobs.failures.InfraFailed`
        (:data:`SLOW_MACHINE`) at the backstop; waits on while the machine is merely slow."""
        b = self.budget
        start = window = self.usage()
        what = "loading your environment" if step < 0 else f"training step {step + 1}"
        if start.at - self.started > b.backstop_s:
            raise self._backstop(what, start, None)
        while True:
            try:
                return self._wait(step, self.poll_s)
            except TimeoutError:
                pass
            now = self.usage()
            used = now.minus(start)
            if step < 0 and used.cpu_s > b.load_cpu_s:
                raise BudgetExceeded(
                    f"your environment used {used.cpu_s:.0f} CPU seconds in load_environment, over the budget of "
                    f"{b.load_cpu_s:.0f} s (the rollout worker's own CPU time, whatever the machine's load); build "
                    "a smaller dataset, or build it lazily")
            if step >= 0:
                self._check_step(step, used)
            span = now.minus(window)
            if span.at >= b.window_s:
                self._check_idle(what, span)
                window = now
            if now.at - self.started > b.backstop_s:
                raise self._backstop(what, now, span)

    def _backstop(self, what: str, now: Usage, span: Usage | None) -> Exception:
        """Whose fault a job past its backstop is: the agent's when its code took more than ``max_agent_share``
        of the job's time on a CPU (burning CPU slows everything else: no voiding an episode by load) or holds
        the step now without working; else the machine's (``infra_failed``, :data:`SLOW_MACHINE`)."""
        b = self.budget
        total = now.minus(self.first)
        if total.cpu_s > b.max_agent_share * max(total.at, 1e-9):
            return BudgetExceeded(
                f"your environment's code used {total.cpu_s:.0f} CPU seconds of the {total.at:.0f} s the job "
                f"trained ({total.cpu_s / max(total.at, 1e-9):.0%}, over {b.max_agent_share:.0%}), which slowed "
                f"the job past its backstop of {b.backstop_s:.0f} s at {what}: make the tools or the rubric cheaper")
        if span is not None and span.at >= min(b.window_s, 60.0):   # its code holding the step now is its fault
            try:
                self._check_idle(what, span)
            except BudgetExceeded as exc:
                return exc
        return InfraFailed(
            f"the machine was too slow: {what} was still running {now.at - self.started:.0f} s after the job "
            f"started (the backstop is {b.backstop_s:.0f} s; {load_text()}); the job kept within its work "
            "budget, so this is not its fault. Run it on a less busy machine, or raise the local backend's "
            "wall_backstop_s", code=SLOW_MACHINE)

    def _check_step(self, step: int, used: Usage) -> None:
        b = self.budget
        if used.tokens > b.step_tokens:
            raise BudgetExceeded(
                f"your environment's rollouts sampled {used.tokens} tokens at training step {step + 1}, more than "
                f"{b.rollouts} rollouts can in their context (batch_size {b.rollouts} x seq_len {b.seq_len} = "
                f"{b.step_tokens}): an environment must not call the model beyond its rollouts' conversations")
        if used.requests > b.step_requests:
            raise BudgetExceeded(
                f"your environment made {used.requests} model calls at training step {step + 1}, over "
                f"{b.max_requests_per_rollout} per rollout ({b.step_requests} for {b.rollouts} rollouts); lower "
                "the environment's max_turns, or stop calling the model outside the rollout loop")
        if used.cpu_s > b.step_cpu_s:
            raise BudgetExceeded(
                f"your environment's code used {used.cpu_s:.0f} CPU seconds at training step {step + 1}, over its "
                f"budget of {b.step_cpu_s:.0f} s ({b.cpu_s_per_rollout:g} s per rollout x {b.rollouts} + "
                f"{b.cpu_s_per_step:g} s; CPU time, whatever the machine's load): make the tools or the rubric "
                "cheaper")

    def _check_idle(self, what: str, span: Usage) -> None:
        b = self.budget
        busy = span.busy_s / max(1e-9, span.at)
        computing = span.cpu_s / max(1e-9, span.at)
        if busy < b.min_busy_share and computing < b.idle_cpu_share:
            raise BudgetExceeded(
                f"your environment's code held {what} for {span.at:.0f} s without working: the model endpoint "
                f"was busy {span.busy_s:.0f} s of it and your code used {span.cpu_s:.1f} CPU seconds (a sleep, a "
                "deadlock or a call that never returns, in the tools, the rubric or load_environment)")
