"""An attempt's limits and bounds, the estimate of a job's cost, the wait bound, an attempt's bill (read or
bounded), the run's costs, and the reservation of a slot."""

from __future__ import annotations

import math
from typing import Any

from ait_env.jobs.settings import EVAL_ALLOWANCE_S
from fleet.billing import Limits, RunpodJobStatus, billing_problem
from fleet.journal import Billing, RunCosts
from fleet.dispatch.engine import WORKER_OVERHEAD_S
from fleet.dispatch.state import _Entry, _State


class _Budgets(_State):
    """Limits, bounds, bills and budgets: a part of :class:`fleet.dispatch.Dispatcher` (the module docstring says what it does)."""

    def limits(self, kind: str = "job") -> Limits:
        """The time limits and bounds of one attempt of a ``kind`` request (see :class:`Limits`): the
        worker's limit is ``job_timeout_s``, else the bounds' wall clock plus the evals' allowance (a
        baseline: the allowance), as the GPU worker applies it."""
        cache: dict[str, Limits] = self.__dict__.setdefault("_limits", {})
        if kind not in cache:
            cache[kind] = self._make_limits(kind)
        return cache[kind]

    def _make_limits(self, kind: str) -> Limits:
        o = self.options
        worker = o.job_timeout_s or (EVAL_ALLOWANCE_S if kind == "baseline" else
                                     self.wall_clock_s + EVAL_ALLOWANCE_S)
        execution = o.execution_timeout_s or worker + WORKER_OVERHEAD_S
        deadline = o.deadline_s or o.startup_allowance_s + execution
        bound = deadline + o.ttl_margin_s
        rate = self.engine.bound_rate()
        return Limits(execution_s=execution, deadline_s=deadline, bound_s=bound,
                      job_usd=round(math.ceil(bound) * rate, 6),
                      idle_usd=round(self.engine.idle_timeout_s * rate, 6))

    def estimate_cost_usd(self, kind: str = "job") -> float:
        """A job's bound: what one attempt can bill at most (its hard end x the dearest rate x GPUs) plus
        the idle bound after it. A budget reserves it (the env's ledger, the journal)."""
        lim = self.limits(kind)
        return round(lim.job_usd + lim.idle_usd, 6)

    def wait_bound_s(self, kind: str = "job") -> float:
        """:meth:`wait`'s default limit: every attempt the retry budget allows at its bound, plus the status
        backoff and a minute (the option ``wait_timeout_s`` overrides it)."""
        o = self.options
        if o.wait_timeout_s is not None:
            return o.wait_timeout_s
        return (o.retry_budget + 1) * (self.limits(kind).bound_s + 2 * o.status_backoff_max_s) + 60.0

    def _bound_bill(self, entry: _Entry, until: float | None) -> Billing:
        """The upper bound of an attempt whose bill cannot be read, marked ``estimated``: from its send to
        ``until`` (when it surely ended: a confirmed cancel, a 404), or to its ttl when nothing says it ended,
        x the dearest rate x GPUs, plus the idle bound."""
        lim = self.limits(entry.kind)
        sent = entry.sent_at or self._clock()
        seconds = lim.bound_s if until is None else min(max(0.0, until - sent), lim.bound_s)
        seconds = math.ceil(seconds - 1e-9)
        rate = self.engine.bound_rate()
        gpu_type, gpus = self.engine.bound_gpus()
        return Billing(execution_time_ms=int(seconds * 1000), gpu_type=gpu_type,
                       gpus_per_worker=gpus, cost_usd=round(seconds * rate, 6),
                       idle_usd=lim.idle_usd, estimated=True)

    def _bill(self, entry: _Entry, st: RunpodJobStatus | None, worker: dict[str, Any] | None = None) -> Billing:
        """The bill of a final status, every final status's (COMPLETED included): the engine's bill of the
        reported times, unless they cannot be taken as given (:func:`fleet.billing.billing_problem`:
        missing for an attempt a worker took, malformed, negative, longer than its ttl): then the attempt's
        whole bound, marked estimated (never under what the provider can bill; reconciled later against its
        bill)."""
        if st is not None:
            why = billing_problem(st, self.limits(entry.kind).bound_s)
            if why:
                self.say(f"{entry.claimant}: {self.engine.name} job {entry.job_id}: {why}; charged at its bound, "
                         "estimated")
                return self._bound_bill(entry, None)
        return self.engine.bill(st, worker)

    def run_costs(self) -> RunCosts:
        """This run dir's costs so far: jobs (the agents' charges), idle (upper bound), active workers over
        the sessions' wall time (this one up to now while open), and their total, in USD; ``estimated``:
        what of it is charged at bounds; ``reserved``: the bounds of jobs in flight."""
        return self.journal.run_costs(live=self._live())

    def _live(self) -> frozenset[str]:
        return frozenset() if self.closed else frozenset({self._session_id})

    def _reserve(self, entry: _Entry) -> str:
        """Hold the current attempt's bound in the journal, or re-check the one it holds; why it may not be
        sent ("" when it may). Nothing is held when no budget is set."""
        o = self.options
        if o.run_budget_usd is None and o.episode_budget_usd is None:
            return ""
        lim = self.limits(entry.kind)
        why = self.journal.reserve(entry.key, entry.attempt, lim.job_usd, lim.idle_usd,
                                   run_limit=o.run_budget_usd,
                                   episode_limit=o.episode_budget_usd if entry.episode_id else None,
                                   live=self._live())
        if not why:
            return ""
        fix = ("Raise backend.options.run_budget_usd or start a new run dir" if why.startswith("run")
               else "Raise backend.options.episode_budget_usd")
        return (f"{why.replace(' budget:', ' budget exceeded:', 1)} (journal {self.journal.path}; a job "
                f"in flight holds its bound, ${lim.job_usd + lim.idle_usd:.4f}, until it ends). {fix}.")
