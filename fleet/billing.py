"""What a Runpod attempt costs, the one place it is computed (the ``runpod`` backend, ``fleet.reconcile`` and
the simulator, ``fleet.simulate``, all call it): :func:`attempt_billing` (an attempt's billed seconds x the
$/GPU-s of the GPU type that ran it x its GPUs, and the idle bound after it), :class:`GpuPrices` (a GPU
type's dated flex rate, :mod:`fleet.prices`), :class:`Limits` (an attempt's time limits and the most it
can cost), :func:`billing_problem` (a status whose billing fields cannot be taken as given: missing,
malformed, negative or longer than possible, billed at the bound instead), :class:`EndpointCosts` (what a
run costs besides its jobs), and the protocols of the Runpod
client parts that dispatch uses (:mod:`fleet.runpod_api` implements them; fakes follow them).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from fleet.journal import Billing

_log = logging.getLogger(__name__)


class RunpodJobStatus(Protocol):
    """What ``ServerlessClient.status`` returns (``fleet.runpod_api.RunpodJob``)."""

    id: str
    status: str
    output: Any
    error: Any
    delay_time_ms: int | None
    execution_time_ms: int | None
    worker_id: str | None


class ManagementLike(Protocol):
    """The part of ``fleet.runpod_management.ManagementClient`` this backend uses (the endpoint's settings)."""

    def get(self, endpoint_id: str) -> dict[str, Any]: ...


class EndpointCosts(BaseModel):
    """What the run costs besides its jobs, and where each figure comes from."""

    idle_timeout_s: float
    workers_min: int
    workers_max: int
    gpus_per_worker: int
    pool: str
    active_usd_per_gpu_s: float
    source: str
    #: every pool the endpoint may place a worker on (the bound of an unread attempt takes the dearest)
    pools: list[str] = Field(default_factory=list)


class ServerlessClientLike(Protocol):
    """The part of ``fleet.runpod_api.ServerlessClient`` this backend uses (``status_many`` is used when
    present)."""

    def run(self, input: dict[str, Any], *, execution_timeout_s: float | None = None,  # noqa: A002
            ttl_s: float | None = None) -> str: ...

    def status(self, job_id: str) -> RunpodJobStatus: ...

    def cancel(self, job_id: str) -> Any: ...


class GpuPrices(BaseModel):
    """$/GPU-second of the GPU type that ran a job: its pool's dated flex rate in :mod:`fleet.prices`
    (``pools`` adds or overrides GPU type -> pool), or an explicit ``usd_per_gpu_s`` (say where it is
    from)."""

    model_config = ConfigDict(extra="forbid")

    pools: dict[str, str] = Field(default_factory=dict)
    usd_per_gpu_s: dict[str, float] = Field(default_factory=dict)

    def price(self, gpu_type: str) -> float:
        """$/GPU-second of ``gpu_type`` (unknown: the dearest pool's, with a warning: never under-billed)."""
        from fleet import prices

        hits = [k for k in self.usd_per_gpu_s if gpu_type.lower().startswith(k.lower())]
        if hits:
            return self.usd_per_gpu_s[max(hits, key=len)]
        pool = prices.pool_for_gpu(gpu_type, self.pools)
        if pool in prices.FLEX_USD_PER_S:
            return prices.price_per_s(pool)
        _log.warning("no price for GPU type %r (fleet/prices.py of %s): billed at the dearest pool's rate; "
                     "add it to backend.options.prices.pools", gpu_type, prices.AS_OF)
        return max(prices.FLEX_USD_PER_S.values())


def attempt_billing(st: RunpodJobStatus | None, worker: dict[str, Any] | None, *, prices: GpuPrices,
                    gpu_type: str, gpus_per_worker: int, idle_timeout_s: float) -> Billing:
    """The bill of one attempt, the one place it is computed (the Runpod engine, :meth:`fleet.runpod_engine.RunpodEngine.bill`, and the fleet
    simulator, ``fleet/simulate/``, call it): (``delayTime`` + ``executionTime``, rounded up to a whole
    second: Runpod bills "rounded up to the nearest second", ``serverless/pricing.mdx``) x $/GPU-s of the GPU
    type that ran it (``worker["gpus"]``, else ``gpu_type``) x its GPUs (else ``gpus_per_worker``), and as
    ``idle_usd`` ``idle_timeout_s`` x the same rate when a worker took the attempt and it did not end
    TIMED_OUT (see the module docstring, "Run costs")."""
    gpus = [str(g).split(" (")[0] for g in (worker or {}).get("gpus") or []]
    gpu = gpus[0] if gpus else gpu_type
    n = len(gpus) or gpus_per_worker
    # never a negative charge, whatever the status says (the dispatcher bills a bound for such a status:
    # billing_problem)
    delay = max(0, int(getattr(st, "delay_time_ms", 0) or 0)) if st is not None else 0
    execution = max(0, int(getattr(st, "execution_time_ms", 0) or 0)) if st is not None else 0
    rate = prices.price(gpu) * n
    usd = math.ceil((delay + execution) / 1000.0 - 1e-9) * rate
    # a worker that took the attempt idles its idle timeout afterwards (an upper bound: it may take the
    # next job at once, or have died); not after TIMED_OUT ("the job fails and the worker stops",
    # endpoint-configurations.mdx), nor for an attempt no worker took (still queued, cancelled there)
    ran = bool(execution or getattr(st, "worker_id", None))
    status = str(getattr(st, "status", "") or "")
    idle_s = idle_timeout_s if ran and status and status != "TIMED_OUT" else 0.0
    return Billing(delay_time_ms=delay, execution_time_ms=execution, gpu_type=gpu, gpus_per_worker=n,
                   cost_usd=round(usd, 6), idle_usd=round(idle_s * rate, 6))


def billing_problem(st: RunpodJobStatus, bound_s: float) -> str:
    """Why the billing fields of a final status cannot be taken as given ("" when they can), so that the
    dispatcher charges the attempt's bound, marked estimated, instead: a worker took the attempt (it is
    COMPLETED, or names a worker, or reports execution) but no usable ``executionTime`` is reported; a field
    was malformed (:func:`fleet.runpod_api.reported_ms`, kept by the status parser as ``billing_notes``); or the
    reported time is longer than the attempt's bound (its ttl: nothing bills past it)."""
    notes = list(getattr(st, "billing_notes", None) or [])
    if notes:
        return "malformed billing fields: " + "; ".join(notes)
    delay = getattr(st, "delay_time_ms", None)
    execution = getattr(st, "execution_time_ms", None)
    for name, v in (("delayTime", delay), ("executionTime", execution)):
        if v is not None and (not isinstance(v, int) or v < 0):
            return f"{name} {v!r} is not a non-negative number of ms"
    took = str(getattr(st, "status", "")) == "COMPLETED" or bool(getattr(st, "worker_id", None))
    if execution is None and took:
        return "no executionTime reported for an attempt a worker took"
    total_ms = (delay or 0) + (execution or 0)          # ints of any size: compared, never made floats
    if total_ms > math.ceil((bound_s + 1.0) * 1000):
        return f"{str(total_ms)[:20]} ms reported, over the attempt's bound of {bound_s:.0f} s"
    return ""


@dataclass(frozen=True)
class Limits:
    """An attempt's time limits (seconds) and what it can cost at most (USD): ``execution_s`` (Runpod's
    executionTimeout), ``deadline_s`` (cancelled and retried after it), ``bound_s`` (Runpod's ttl: the
    attempt cannot bill longer), ``job_usd`` (``bound_s`` x the dearest pool's rate x GPUs) and ``idle_usd``
    (the idle bound after it)."""

    execution_s: float
    deadline_s: float
    bound_s: float
    job_usd: float
    idle_usd: float
