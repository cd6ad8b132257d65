"""The ``runpod`` backend: job bundles run by the GPU worker (``gpu/worker.py``) on a Runpod Serverless
queue-based endpoint, through :class:`gpu.runpod_api.ServerlessClient`.

Contract:

- **One instance per run, shared by every episode.** :meth:`RunpodBackend.submit` returns at once (the
  job is claimed in the journal and sent, or queued locally while ``max_in_flight`` jobs are out);
  :meth:`RunpodBackend.wait` blocks only its caller. ONE poller thread dispatches queued jobs and polls
  every job in flight, and wakes each waiter when its job ends.
- **Durable, never paid twice** (:mod:`ait_env.jobs.journal`, ``<runs_dir>/runpod_journal.sqlite``): a job's
  key is its content hash (:func:`ait_env.jobs.cache.job_key` over the bundle and the worker's settings)
  plus a nonce (``"0"``; ``rerun: true`` uses the bundle's job id, so a deliberate re-run is a new key).
  An identical job already finished is served from the journal (``cache_hit``, $0); one in flight, here
  or in another orchestrator on the same run dir, is attached to, not sent again. A restarted orchestrator
  re-attaches every job in flight by its Runpod id at start, and records each result the moment it is
  seen (Runpod keeps ``/run`` results 30 minutes). A job's cost is handed to exactly one waiter.
- **Failures.** Runpod-side failures (FAILED without a result from our handler, i.e. a lost worker;
  TIMED_OUT; a result expired before it was read; status calls failing past the client's own retries,
  e.g. 429/5xx, ``status_error_budget`` times in a row; a run call that surely queued nothing, e.g. a
  429 or no connection, past the client's retries; no result within ``deadline_s``) are retried as new
  attempts (journaled) up to ``retry_budget`` times, then end ``infra_failed``. A run call without a
  clear answer (:class:`gpu.runpod_api.SubmitUncertain`: a job may be queued unseen) is not resent, since
  that could pay twice: the job ends ``infra_failed`` at once; so does a 4xx that is ours (key, endpoint,
  payload). A result from a worker whose image revision or versions differ from the pins
  (``require_revision``, ``expected_versions``) is a "non-replica worker": retried the same way, never
  served. The worker's own verdict (``succeeded``, ``job_failed``, or its ``infra_failed``: self-check
  refusal, its time limit) is returned as it is.
- **Costs** (:func:`attempt_billing`, the one place). Each attempt's billed seconds (``delayTime`` +
  ``executionTime`` of the status: queue wait and cold start are counted, which over-estimates a queued
  job; so ``max_in_flight`` defaults to the endpoint's ``workers_max``, where no sent job waits for a
  worker) x the dated $/GPU-second of the GPU type
  that ran it (the worker's ``result.worker["gpus"]``; ``gpu_type`` when unknown; :class:`GpuPrices`:
  its pool's flex rate in :mod:`gpu.prices`) x its GPUs. The sum over
  a job's attempts is ``JobResult.cost_usd`` (the env writes it to the cost ledger). ``run_budget_usd`` /
  ``episode_budget_usd`` (over the journal's bills) stop dispatch: the job ends ``infra_failed`` with the
  budget's message (never charged to the agent), as a :class:`ait_env.ledger.BudgetExceeded` would.
- **Run costs** (not the agent's: never in ``JobResult.cost_usd``). Runpod bills a worker "from when a
  worker starts until it fully stops" and its idle timeout after each request ("You're billed during idle
  time", runpod/docs ``serverless/pricing.mdx`` and ``serverless/endpoints/endpoint-configurations.mdx``,
  a900806e), and active workers "continuously, including when idle" (same page, "Active workers"). So:
  (a) **idle**: each attempt a worker took (it reports a worker id or an execution time), unless it
  ended TIMED_OUT ("the job fails and the worker stops", ``endpoint-configurations.mdx``), is charged
  the endpoint's idle timeout x the attempt's $/GPU-s x its GPUs, journaled as the attempt's ``idle_usd``.
  It is an **upper bound**: a worker that takes the next queued job at once does not idle. Nothing we see
  tells that reliably (``/health`` is sampled at poll time, not when the job ended, and a queued job may
  go to another, cold worker), so the bound is kept. (b) **active**: ``workers_min`` x GPUs per worker x
  the pool's active $/GPU-s (:func:`gpu.prices.price_per_s`) over each orchestrator session's wall time
  (journal ``sessions``: opened at start, closed by :meth:`RunpodBackend.close`, a crashed one ends at its
  last heartbeat; overlapping sessions count once). :meth:`RunpodBackend.run_costs` returns jobs, idle,
  active and total USD; :meth:`RunpodBackend.charge_run_costs` puts idle and active into the env's cost
  ledger once (``gpu_idle``/``gpu_active`` records). ``run_budget_usd`` counts all three;
  ``episode_budget_usd`` counts the jobs only (the agent's charges). The idle timeout, ``workers_min``,
  GPUs per worker and the first pool are read from the endpoint (REST v2 ``GET /serverless/<id>``:
  ``workers.idleTimeout``, ``workers.min``, ``gpu.count``, ``gpu.pools``: what Runpod bills by) when this
  backend built its own client, else from ``options`` (``idle_timeout_s``, ``workers_min``), else from
  ``gpu/fleet_defaults.yaml``. ``python -m gpu.reconcile``
  compares the journal with Runpod's billing.
- **Baselines.** :meth:`RunpodBackend.measure_baseline` sends a ``kind: "baseline"`` request through the
  same handler and journal (``python scripts/seed_baselines.py backend=runpod``); baselines a job measured
  come back in the handler's output and go to this backend's user store.
- **Secrets.** The API key comes from ``$RUNPOD_API_KEY`` only; it is never logged, journaled or put in a
  result.

Options (:class:`RunpodOptions`, ``conf/backend/runpod.yaml``; unknown keys are refused).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from ait_env.backends.base import Backend, BackendSettings, JobHandle, JobResult
from ait_env.baselines import BaselineEntry
from ait_env.jobs.bundle import JobBundle
from ait_env.jobs.cache import job_key
from ait_env.jobs.journal import Billing, Journal, JournalRow, RunCosts, Session, owner_alive, this_owner
from ait_env.runner import RunnerSettings

from gpu.runpod_api import ResultExpired, RunpodAPIError, SubmitUncertain

if TYPE_CHECKING:
    from ait_env.ledger import CostLedger
    from gpu.runpod_api import ManagementClient

_log = logging.getLogger(__name__)
_IN_FLIGHT = {"IN_QUEUE": "in_queue", "IN_PROGRESS": "in_progress"}


class RunpodJobStatus(Protocol):
    """What ``ServerlessClient.status`` returns (``gpu.runpod_api.RunpodJob``)."""

    id: str
    status: str
    output: Any
    error: Any
    delay_time_ms: int | None
    execution_time_ms: int | None
    worker_id: str | None


class ManagementLike(Protocol):
    """The part of ``gpu.runpod_api.ManagementClient`` this backend uses (the endpoint's settings)."""

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


class ServerlessClientLike(Protocol):
    """The part of ``gpu.runpod_api.ServerlessClient`` this backend uses."""

    def run(self, input: dict[str, Any]) -> str: ...  # noqa: A002 - the client's name

    def status(self, job_id: str) -> RunpodJobStatus: ...

    def cancel(self, job_id: str) -> Any: ...


class GpuPrices(BaseModel):
    """$/GPU-second of the GPU type that ran a job: its pool's dated flex rate in :mod:`gpu.prices`
    (``pools`` adds or overrides GPU type -> pool), or an explicit ``usd_per_gpu_s`` (say where it is
    from)."""

    model_config = ConfigDict(extra="forbid")

    pools: dict[str, str] = Field(default_factory=dict)
    usd_per_gpu_s: dict[str, float] = Field(default_factory=dict)

    def price(self, gpu_type: str) -> float:
        """$/GPU-second of ``gpu_type`` (unknown: the dearest pool's, with a warning: never under-billed)."""
        from gpu import prices

        hits = [k for k in self.usd_per_gpu_s if gpu_type.lower().startswith(k.lower())]
        if hits:
            return self.usd_per_gpu_s[max(hits, key=len)]
        pool = prices.pool_for_gpu(gpu_type, self.pools)
        if pool in prices.FLEX_USD_PER_S:
            return prices.price_per_s(pool)
        _log.warning("no price for GPU type %r (gpu/prices.py of %s): billed at the dearest pool's rate; "
                     "add it to backend.options.prices.pools", gpu_type, prices.AS_OF)
        return max(prices.FLEX_USD_PER_S.values())


class RunpodOptions(RunnerSettings):
    """``options`` of the runpod backend (unknown keys are refused)."""

    #: the queue-based endpoint (else ``$RUNPOD_ENDPOINT_ID``); the API key is read from ``$RUNPOD_API_KEY``
    endpoint_id: str | None = None
    #: the API's base URL (None: the client's default, https://api.runpod.ai/v2); a fake's in tests
    base_url: str | None = None
    #: the worker's trainer executor: "gpu" (prime-rl), "local" (the tiny CPU models: tests)
    executor: str = "gpu"
    #: the executor's own options, passed to it unchanged
    executor_options: dict[str, Any] = Field(default_factory=dict)
    #: seconds between two sweeps of the poller over the jobs in flight
    poll_interval_s: float = Field(5.0, gt=0)
    #: jobs sent to Runpod at once (more wait locally, in order). None: the endpoint's ``workers_max`` (read
    #: like the run costs' settings): a job sent beyond it waits in Runpod's queue, and that wait is in its
    #: ``delayTime``, which the bill counts although Runpod does not charge it (docs/fleet.md)
    max_in_flight: int | None = Field(None, ge=1)
    #: the worker's limit for one job (None: the job's wall-clock bound plus its eval allowance)
    job_timeout_s: float | None = Field(None, gt=0)
    #: an attempt without a result this long after it was sent is cancelled and retried (None: Runpod's
    #: execution timeout alone)
    deadline_s: float | None = Field(None, gt=0)
    #: Runpod-side failures retried per job (new attempts) before it ends infra_failed
    retry_budget: int = Field(2, ge=0)
    #: consecutive failed status calls (after the client's own retries) before an attempt counts as lost
    status_error_budget: int = Field(5, ge=1)
    #: true: a new key per bundle (an identical job trains again); false: identical jobs are served
    rerun: bool = False
    #: the pins a result must carry: the image revision ($AIT_IMAGE_REVISION, also sent to the worker's
    #: self-check) and versions (``result.worker["versions"]`` keys, e.g. ``train:prime-rl-commit``)
    require_revision: str | None = None
    expected_versions: dict[str, str] = Field(default_factory=dict)
    #: the endpoint's first GPU type and GPUs per worker (bills attempts that report no GPUs)
    gpu_type: str = "NVIDIA RTX A5000"
    gpus_per_worker: int = Field(2, ge=1)
    prices: GpuPrices = Field(default_factory=GpuPrices)
    #: seconds a job is expected to bill (estimate_cost_usd: the env's budget check before dispatch)
    estimated_job_s: float = Field(900.0, gt=0)
    #: USD over this run's journal (every attempt) / one episode's jobs; None = no limit
    run_budget_usd: float | None = Field(None, ge=0)
    episode_budget_usd: float | None = Field(None, ge=0)
    #: a claim another host made and never sent is taken over after this many seconds
    claim_stale_s: float = Field(300.0, gt=0)
    #: close(): cancel the jobs still in flight (false: they keep running; a restart re-attaches them)
    cancel_on_close: bool = False
    #: run costs: the endpoint's idle timeout and active workers, used when the endpoint's own settings
    #: cannot be read (None: gpu/fleet_defaults.yaml); the REST v2 base URL they are read from (None:
    #: $AIT_RUNPOD_REST_BASE_URL or https://api.runpod.io/v2)
    idle_timeout_s: float | None = Field(None, ge=0)
    workers_min: int | None = Field(None, ge=0)
    rest_base_url: str | None = None
    #: false: never read the endpoint's settings (options and the fleet defaults only)
    read_endpoint: bool = True


def attempt_billing(st: RunpodJobStatus | None, worker: dict[str, Any] | None, *, prices: GpuPrices,
                    gpu_type: str, gpus_per_worker: int, idle_timeout_s: float) -> Billing:
    """The bill of one attempt, the one place it is computed (:meth:`RunpodBackend.billing` and the fleet
    simulator, ``gpu/simulate.py``, call it): (``delayTime`` + ``executionTime``) x $/GPU-s of the GPU type
    that ran it (``worker["gpus"]``, else ``gpu_type``) x its GPUs (else ``gpus_per_worker``), and as
    ``idle_usd`` ``idle_timeout_s`` x the same rate when a worker took the attempt and it did not end
    TIMED_OUT (see the module docstring, "Run costs")."""
    gpus = [str(g).split(" (")[0] for g in (worker or {}).get("gpus") or []]
    gpu = gpus[0] if gpus else gpu_type
    n = len(gpus) or gpus_per_worker
    delay = int(getattr(st, "delay_time_ms", 0) or 0) if st is not None else 0
    execution = int(getattr(st, "execution_time_ms", 0) or 0) if st is not None else 0
    rate = prices.price(gpu) * n
    usd = (delay + execution) / 1000.0 * rate
    # a worker that took the attempt idles its idle timeout afterwards (an upper bound: it may take the
    # next job at once, or have died); not after TIMED_OUT ("the job fails and the worker stops",
    # endpoint-configurations.mdx), nor for an attempt no worker took (still queued, cancelled there)
    ran = bool(execution or getattr(st, "worker_id", None))
    status = str(getattr(st, "status", "") or "")
    idle_s = idle_timeout_s if ran and status and status != "TIMED_OUT" else 0.0
    return Billing(delay_time_ms=delay, execution_time_ms=execution, gpu_type=gpu, gpus_per_worker=n,
                   cost_usd=round(usd, 6), idle_usd=round(idle_s * rate, 6))


def worker_settings(settings: BackendSettings) -> BackendSettings:
    """What the worker's runner gets: name, models, bounds, and as ``options`` the runner's own plus
    ``executor_options`` (the orchestrator-side keys stay here)."""
    opts = RunpodOptions.model_validate(settings.options)
    runner = opts.model_dump(include=set(RunnerSettings.model_fields))
    return settings.model_copy(update={"options": {**runner, **opts.executor_options}, "job_cache": False})


@dataclass
class _Entry:
    """One key tracked by this orchestrator."""

    key: str
    kind: str
    claimant: str
    make: Callable[[], dict[str, Any]] | None   # builds what to (re)send; None: adopted, not resendable
    episode_id: str | None = None
    job_id: str | None = None
    attempt: int = 1
    first_attempt: int = 1                  # the claim's first attempt: retries are counted from it
    state: Literal["pending", "sent", "foreign", "done"] = "pending"
    sent_at: float = 0.0
    seen: str = ""
    status_errors: int = 0
    done: threading.Event = field(default_factory=threading.Event)
    body: dict[str, Any] | None = None      # what make() built (kept for retries)


class RunpodBackend(Backend):
    Options = RunpodOptions

    def __init__(self, settings: BackendSettings, runs_dir: Path | str = "runs", show_progress: bool = True,
                 client: ServerlessClientLike | None = None,
                 management: ManagementLike | None = None) -> None:
        super().__init__(settings, runs_dir)
        self.options: RunpodOptions
        self.show_progress = show_progress
        self.client = client if client is not None else self._make_client()
        self.journal = Journal.in_run_dir(self.runs_dir)
        made = self._make_management() if management is None and client is None and \
            self.options.read_endpoint else None
        try:
            self.endpoint_costs = self._endpoint_costs(management or made)
        finally:
            if made is not None:
                made.close()
        #: jobs out at once: the option, else the endpoint's max workers (see RunpodOptions.max_in_flight)
        self.max_in_flight = self.options.max_in_flight or self.endpoint_costs.workers_max
        self._session_id = f"{this_owner()}:{uuid.uuid4().hex[:8]}"
        self._beat_at = time.monotonic()
        now = time.time()
        ec = self.endpoint_costs
        self.journal.open_session(Session(
            id=self._session_id, owner=this_owner(), endpoint_id=self._endpoint_id() or "", started=now,
            heartbeat=now, workers_min=ec.workers_min, gpus_per_worker=ec.gpus_per_worker, pool=ec.pool,
            active_usd_per_s=ec.workers_min * ec.gpus_per_worker * ec.active_usd_per_gpu_s,
            idle_timeout_s=ec.idle_timeout_s, source=ec.source))
        self.worker_settings = worker_settings(settings)
        self._worker_json = self.worker_settings.model_dump(mode="json")
        self._entries: dict[str, _Entry] = {}
        self._pending: deque[str] = deque()
        self._sent: set[str] = set()
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None
        self._cancelled: set[str] = set()
        self._set_hashes: dict[str, str] = {}
        self._owner = f"{this_owner()}:{uuid.uuid4().hex[:8]}"   # host:pid:instance
        self._adopt()

    # ------------------------------------------------------------------ setup
    def _endpoint_id(self) -> str | None:
        return getattr(self.client, "endpoint_id", None) or self.options.endpoint_id or \
            os.environ.get("RUNPOD_ENDPOINT_ID")

    def _make_management(self) -> "ManagementClient | None":
        key = os.environ.get("RUNPOD_API_KEY")
        if not key:
            return None
        from gpu.runpod_api import ManagementClient, RetryPolicy

        # one GET at start: a short retry budget, the defaults stand in when it fails
        return ManagementClient(key, base_url=self.options.rest_base_url, timeout_s=10.0,
                                retry=RetryPolicy(attempts=2, max_seconds=5.0))

    def _endpoint_costs(self, management: ManagementLike | None) -> EndpointCosts:
        """The idle timeout, active workers, GPUs and pool the run costs are computed with: the endpoint's
        own settings (REST v2: what Runpod bills by), else ``options``, else ``gpu/fleet_defaults.yaml``
        (see the module docstring)."""
        from gpu import prices
        from gpu.endpoint import fleet_settings

        o, ep, why = self.options, None, ""
        endpoint_id = self._endpoint_id()
        if management is not None and endpoint_id:
            try:
                ep = management.get(endpoint_id)
            except (RunpodAPIError, OSError) as exc:
                why = f" (reading endpoint {endpoint_id} failed: {str(exc)[:200]})"
                _log.warning("run costs: could not read endpoint %s (%s); using the options and "
                             "gpu/fleet_defaults.yaml", endpoint_id, str(exc)[:200])
        workers, gpu = (ep or {}).get("workers") or {}, (ep or {}).get("gpu") or {}
        fleet = fleet_settings()
        sources: list[str] = []

        def pick(name: str, option: Any, endpoint: Any, default: Any) -> Any:
            if endpoint is not None:
                if option is not None and float(option) != float(endpoint):
                    _log.warning("run costs: backend.options.%s=%s, but endpoint %s has %s: the endpoint's "
                                 "setting is what Runpod bills, so it is used", name, option, endpoint_id,
                                 endpoint)
                sources.append(f"{name}: endpoint {endpoint_id}")
                return endpoint
            if option is not None:
                sources.append(f"{name}: options")
                return option
            sources.append(f"{name}: gpu/fleet_defaults.yaml{why}")
            return default

        idle = float(pick("idle_timeout_s", o.idle_timeout_s, workers.get("idleTimeout"),
                          fleet["idle_timeout_s"]))
        wmin = int(pick("workers_min", o.workers_min, workers.get("min"), fleet["workers_min"]))
        wmax = int(pick("workers_max", None, workers.get("max"), fleet["workers_max"]))
        gpus = int(gpu.get("count") or o.gpus_per_worker)
        pools = list(gpu.get("pools") or [])
        pool = pools[0] if pools else (prices.pool_for_gpu(o.gpu_type, o.prices.pools) or "")
        try:
            active = prices.price_per_s(pool, active=True)
        except KeyError:
            active = max(prices.FLEX_USD_PER_S.values())
            _log.warning("no active price for pool %r: active workers billed at the dearest flex rate", pool)
        return EndpointCosts(idle_timeout_s=idle, workers_min=wmin, workers_max=wmax, gpus_per_worker=gpus,
                             pool=pool, active_usd_per_gpu_s=active, source="; ".join(sources))

    def _make_client(self) -> ServerlessClientLike:
        endpoint = self.options.endpoint_id or os.environ.get("RUNPOD_ENDPOINT_ID")
        key = os.environ.get("RUNPOD_API_KEY")
        if not key or not endpoint:
            missing = " and ".join(n for n, v in (("RUNPOD_API_KEY", key), ("an endpoint id", endpoint))
                                   if not v)
            raise ValueError(f"backend runpod needs {missing}: export RUNPOD_API_KEY=<key> and "
                             "RUNPOD_ENDPOINT_ID=<id> (or backend.options.endpoint_id=<id>); the endpoint is "
                             "created by the gpu endpoint tooling (gpu/README.md)")
        from gpu.runpod_api import ServerlessClient

        return ServerlessClient(endpoint, key, base_url=self.options.base_url)

    def _adopt(self) -> None:
        """Track every job the journal has in flight (a restart: re-attach by id, never resend)."""
        rows = self.journal.in_flight()
        for row in rows:
            self._entries[row.key] = _Entry(key=row.key, kind=row.kind, claimant=row.claimant, make=None,
                                            episode_id=row.episode_id, job_id=row.job_id, attempt=row.attempt,
                                            first_attempt=row.first_attempt, state="foreign",
                                            sent_at=time.monotonic())
        if rows:
            self._say(f"re-attaching {len(rows)} job(s) in flight from the journal "
                      f"({sum(r.job_id is not None for r in rows)} with a Runpod id)")
            self._start_poller()

    def _say(self, msg: str) -> None:
        _log.info(msg)
        if self.show_progress:
            print(f"[{time.strftime('%H:%M:%S')}] runpod: {msg}", file=sys.stderr, flush=True)

    def _start_poller(self) -> None:
        with self._lock:
            if self._poller is None or not self._poller.is_alive():
                self._poller = threading.Thread(target=self._poll_loop, name="runpod-poller", daemon=True)
                self._poller.start()

    # ------------------------------------------------------------------ keys and prices
    def _key(self, bundle: JobBundle) -> str:
        from ait_env.secrets import hidden_set_hash

        worker = {"settings": self._worker_json, "executor": self.options.executor,
                  "require_revision": self.options.require_revision}
        nonce = bundle.job_id if self.options.rerun else "0"
        family = bundle.manifest.family
        if family not in self._set_hashes:
            self._set_hashes[family] = hidden_set_hash(family)
        return f"{job_key(bundle, worker, '', self._set_hashes[family])}:{nonce}"

    def _estimate(self) -> float:
        o = self.options
        return o.estimated_job_s * o.prices.price(o.gpu_type) * o.gpus_per_worker

    def estimate_cost_usd(self, bundle: JobBundle) -> float:  # noqa: ARG002
        return self._estimate()

    def billing(self, st: RunpodJobStatus | None, worker: dict[str, Any] | None = None) -> Billing:
        """The bill of one attempt (see the module docstring; :func:`attempt_billing`)."""
        ec = getattr(self, "endpoint_costs", None)   # None: a backend built for its billing alone (tests)
        o, idle = self.options, ec.idle_timeout_s if ec is not None else 0.0
        return attempt_billing(st, worker, prices=o.prices, gpu_type=o.gpu_type,
                               gpus_per_worker=o.gpus_per_worker, idle_timeout_s=idle)

    def _idle_estimate(self) -> float:
        o = self.options
        return self.endpoint_costs.idle_timeout_s * o.prices.price(o.gpu_type) * o.gpus_per_worker

    def run_costs(self) -> RunCosts:
        """This run dir's costs so far: jobs (the agents' charges), idle (upper bound), active workers over
        the sessions' wall time (this one up to now while open), and their total, in USD."""
        live = frozenset() if self.closed else frozenset({self._session_id})
        return self.journal.run_costs(live=live)

    def charge_run_costs(self, ledger: CostLedger) -> RunCosts:
        """Append to the env's cost ``ledger`` the idle and active USD of this run dir not charged before
        (records ``kind="gpu_idle"`` and ``"gpu_active"``, no episode: run costs, not an agent's), once across
        orchestrators (:meth:`Journal.take_run_charges`); the ``gpu_job`` records the env writes hold the
        jobs. Returns the run costs charged up to. Call it at the end of a run (after :meth:`close`, the
        active workers stop counting) or whenever the ledger should catch up."""
        from ait_env.ledger import CostRecord

        costs = self.run_costs()
        for part, usd in self.journal.take_run_charges(costs).items():
            if usd > 0:
                ledger.append(CostRecord(kind=f"gpu_{part}", usd=usd, meta={
                    "backend": self.name, "journal": str(self.journal.path), "run_total_usd": costs.total}))
        return costs

    def _over_budget(self, episode_id: str | None) -> str:
        """Why one more attempt may not be sent ("" when it may)."""
        o, est = self.options, self._estimate()
        if o.run_budget_usd is not None:
            costs = self.run_costs()
            with self._lock:
                out = len(self._sent)
            each = est + self._idle_estimate()
            if costs.total + (out + 1) * each > o.run_budget_usd:
                return (f"run budget exceeded: spent ${costs.total:.2f} (jobs ${costs.jobs:.2f}, idle "
                        f"${costs.idle:.2f}, active workers ${costs.active:.2f}) + {out} job(s) in flight "
                        f"and this one at ~${each:.2f} each > ${o.run_budget_usd:.2f} (journal "
                        f"{self.journal.path}). Raise backend.options.run_budget_usd or start a new run dir.")
        if o.episode_budget_usd is not None and episode_id is not None:
            spent = self.journal.spent_usd(episode_id)
            if spent + est > o.episode_budget_usd:
                return (f"episode budget exceeded: episode {episode_id} spent ${spent:.2f} + this job "
                        f"~${est:.2f} > ${o.episode_budget_usd:.2f}. Raise "
                        "backend.options.episode_budget_usd.")
        return ""

    # ------------------------------------------------------------------ submit / wait
    def _payload(self, bundle: JobBundle) -> dict[str, Any]:
        from gpu.worker import pack_bundle

        return {"kind": "job", "executor": self.options.executor,
                "settings": self._worker_json, "bundle": pack_bundle(bundle.root),
                "baselines": [e.model_dump(mode="json") for e in self.baselines.entries().values()],
                "require_revision": self.options.require_revision, "timeout_s": self.options.job_timeout_s}

    def submit(self, bundle: JobBundle) -> JobHandle:
        key = self._key(bundle)
        self._track(key, "job", bundle.job_id, bundle.manifest.episode_id, lambda: self._payload(bundle))
        return JobHandle(job_id=bundle.job_id, backend=self.name, meta={"key": key, "root": str(bundle.root)})

    def _track(self, key: str, kind: str, claimant: str, episode_id: str | None,
               payload: Callable[[], dict[str, Any]] | None) -> _Entry:
        """Claim ``key`` (or join it) and track it; sends it at once when a slot is free. ``payload()``
        builds what to send (called when it is sent; None: this caller cannot resend it)."""
        if self.closed:
            raise RuntimeError("the runpod backend is closed; build a new one")
        with self._lock:  # one claim per key and process at a time (two episodes, one identical job)
            entry = self._entries.get(key)
            if entry is not None and entry.state != "done":
                if entry.make is None:   # adopted after a restart: now it can be resent if needed
                    entry.make = payload
                return entry
            row, new = self.journal.claim(key, claimant=claimant, kind=kind, episode_id=episode_id,
                                          owner=self._owner)
            entry = _Entry(key=key, kind=kind, claimant=claimant, make=payload, episode_id=episode_id,
                           job_id=row.job_id, attempt=row.attempt, first_attempt=row.first_attempt)
            self._entries[key] = entry
            if row.final and not new:
                entry.state, entry.make = "done", None
                entry.done.set()
                self._say(f"{claimant}: served from the journal (job {row.job_id}, "
                          f"{row.result_status or row.status})")
                return entry
            if not new:
                entry.state, entry.sent_at = "foreign", time.monotonic()
                self._say(f"{claimant}: already in flight as {row.job_id or '(being sent)'}; attached")
            elif why := self._over_budget(episode_id):
                self.journal.finish(key, None, "infra_failed", f"dispatch refused: {why}")
                entry.state = "done"
                entry.done.set()
                self._say(f"{claimant}: refused ({why})")
                return entry
            else:
                self._pending.append(key)
        self._dispatch()
        self._start_poller()
        return entry

    def wait(self, handle: JobHandle, timeout: float | None = None) -> JobResult:
        key = handle.meta["key"]
        with self._lock:
            entry = self._entries.get(key)
        if entry is None:  # a handle from another instance: follow the journal's row
            row = self.journal.get(key)
            if row is None:
                raise KeyError(f"job {handle.job_id} ({key}) is not in the journal {self.journal.path}")
            entry = self._track(key, row.kind, handle.job_id, row.episode_id, None)
        if not entry.done.wait(timeout):
            raise TimeoutError(f"runpod job {handle.job_id} did not finish within {timeout} s (it keeps "
                               "running; wait again, or a restarted orchestrator re-attaches it)")
        row = self.journal.get(key)
        assert row is not None
        return self._result(handle.job_id, row)

    def _result(self, job_id: str, row: JournalRow) -> JobResult:
        charge = self.journal.take_charge(row.key)
        timings = {"runpod_delay_s": row.delay_time_ms / 1000,
                   "runpod_execution_s": row.execution_time_ms / 1000,
                   "runpod_attempts": float(row.attempt - row.first_attempt + 1)}
        if row.status == "completed" and row.result is not None and row.kind == "job":
            res = JobResult.model_validate(row.result["result"])
            served = charge is None
            return res.model_copy(update={
                "job_id": job_id, "backend": self.name, "cost_usd": charge or 0.0, "cache_hit": served,
                "cached_from": res.job_id if served else "", "timings": {**res.timings, **timings}})
        if not row.final:   # the backend was closed while this job was out
            return JobResult(job_id=job_id, backend=self.name, status="infra_failed", timings=timings,
                             error=f"the runpod backend was closed while job {row.job_id} was "
                                   f"{row.status}; it keeps running on Runpod and a new backend on this run "
                                   "dir re-attaches it")
        error = row.error or (row.result or {}).get("result", {}).get("error", "") or f"ended {row.status}"
        return JobResult(job_id=job_id, backend=self.name, status="infra_failed", error=error,
                         cost_usd=charge or 0.0, timings=timings)

    # ------------------------------------------------------------------ dispatch
    def _dispatch(self) -> None:
        """Send queued jobs while fewer than ``max_in_flight`` are out (any thread may call it)."""
        while True:
            with self._lock:
                if not self._pending or len(self._sent) >= self.max_in_flight:
                    return
                entry = self._entries[self._pending.popleft()]
                if entry.state != "pending":
                    continue
                self._sent.add(entry.key)
                entry.state = "sent"
            self._send(entry)

    def _send(self, entry: _Entry) -> None:
        assert entry.make is not None
        if entry.attempt > entry.first_attempt:
            why = self._over_budget(entry.episode_id)
            if why:
                self._end(entry, None, f"retry refused: {why}")
                return
        try:
            if entry.body is None:
                entry.body = entry.make()
        except (OSError, ValueError) as exc:   # e.g. a bundle over the /run payload limit
            self._end(entry, None, f"the job could not be packed for Runpod: {exc}")
            return
        try:
            job_id = self.client.run(entry.body)
        except SubmitUncertain as exc:
            # No idempotency key exists on /run and no route lists jobs: a job may have been queued (and
            # billed) unseen. Resending could pay twice, so the job ends infra_failed (never the agent's).
            self._end(entry, None, f"the run call got no clear answer ({exc}); not resent, since a job may "
                                   "have been queued unseen (look at the endpoint's health before retrying)")
            return
        except RunpodAPIError as exc:
            status = getattr(exc, "status", 0) or 0
            if status and status < 500 and status != 429:  # ours: bad key, payload too large, no endpoint
                self._end(entry, None, f"Runpod refused the job ({exc}); check RUNPOD_API_KEY, the endpoint "
                                       "id and the payload size (10 MB for /run)")
            else:
                self._attempt_failed(entry, "failed",
                                     f"the run call failed after the client's retries: {exc}")
            return
        except OSError as exc:
            self._attempt_failed(entry, "failed", f"the run call failed: {type(exc).__name__}: {exc}")
            return
        entry.job_id, entry.sent_at, entry.seen, entry.status_errors = job_id, time.monotonic(), "", 0
        if not self.journal.attach(entry.key, job_id, entry.attempt):
            self._cancel(job_id)  # the row moved on meanwhile (another orchestrator): ours is surplus
            with self._lock:
                self._sent.discard(entry.key)
                entry.job_id, entry.state = None, "foreign"
            self._follow(entry)
            return
        self._say(f"{entry.claimant}: submitted as {job_id}"
                  + (f" (attempt {entry.attempt})" if entry.attempt > 1 else ""))
        self._wake.set()

    def _cancel(self, job_id: str) -> None:
        try:
            self.client.cancel(job_id)
        except Exception as exc:  # noqa: BLE001 - best effort
            _log.warning("could not cancel Runpod job %s: %s", job_id, exc)

    # ------------------------------------------------------------------ the poller
    def _poll_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._sweep()
                if time.monotonic() - self._beat_at > 30:   # a crashed session ends at its last beat
                    self._beat_at = time.monotonic()
                    self.journal.beat(self._session_id)
            except Exception:  # noqa: BLE001 - the poller must outlive one bad sweep
                _log.exception("runpod poller sweep failed; retrying")
            self._wake.wait(self.options.poll_interval_s)
            self._wake.clear()

    def _sweep(self) -> None:
        self._dispatch()
        with self._lock:  # a "sent" entry without an id is being sent right now
            live = [e for e in self._entries.values()
                    if e.state == "foreign" or (e.state == "sent" and e.job_id is not None)]
        ids = [e.job_id for e in live if e.job_id is not None]
        many = getattr(self.client, "status_many", None)
        answers: dict[str, Any] = many(ids) if many is not None and len(ids) > 1 else {}
        for entry in live:
            if self._stop.is_set():
                return
            if entry.job_id is None:
                self._follow(entry)
            else:
                self._poll(entry, answers.get(entry.job_id))

    def _follow(self, entry: _Entry) -> None:
        """An entry whose current attempt another orchestrator owns: take its id, or its end, from the
        journal; take over a claim whose owner died before sending it."""
        row = self.journal.get(entry.key)
        if row is None:
            return
        if row.final:
            self._done(entry)
            return
        if row.job_id is not None:
            entry.job_id, entry.attempt, entry.state = row.job_id, row.attempt, "foreign"
            return
        stale = (row.owner != self._owner and
                 (not owner_alive(row.owner) or time.time() - row.updated > self.options.claim_stale_s))
        if stale:
            if entry.make is None:
                self.journal.finish(entry.key, None, "infra_failed",
                                    "the orchestrator that claimed this job died before sending it, and "
                                    "this one has not got its bundle; submit the job again")
                self._done(entry)
            elif self.journal.take_over(entry.key, row.attempt, row.owner, owner=self._owner):
                with self._lock:
                    self._sent.discard(entry.key)
                    entry.state, entry.attempt, entry.job_id = "pending", row.attempt, None
                    self._pending.append(entry.key)

    def _poll(self, entry: _Entry, answer: Any = None) -> None:
        """Act on the status of ``entry``'s attempt (``answer``: already fetched, a status or an error)."""
        job_id = entry.job_id
        assert job_id is not None
        try:
            if isinstance(answer, Exception):
                raise answer
            st = answer if answer is not None else self.client.status(job_id)
        except ResultExpired:
            self._attempt_failed(entry, "expired", f"the result of {job_id} expired before it was read "
                                                   "(Runpod keeps /run results 30 minutes)")
            return
        except (RunpodAPIError, OSError) as exc:
            entry.status_errors += 1
            if entry.status_errors >= self.options.status_error_budget:
                self._attempt_failed(entry, "failed", f"the status of {job_id} could not be read "
                                                      f"{entry.status_errors} times in a row: {exc}")
            return
        entry.status_errors = 0
        if st.status in _IN_FLIGHT:
            if st.status != entry.seen:
                entry.seen = st.status
                self.journal.update_status(entry.key, _IN_FLIGHT[st.status], job_id)  # type: ignore[arg-type]
                where = "in queue" if st.status == "IN_QUEUE" else "running"
                self._say(f"{entry.claimant}: {where} ({job_id}"
                          + (f" on worker {st.worker_id})" if st.worker_id else ")"))
            limit = self.options.deadline_s
            if limit is not None and time.monotonic() - entry.sent_at > limit:
                self._cancel(job_id)
                self._attempt_failed(entry, "timed_out",
                                     f"no result from {job_id} within deadline_s={limit:.0f} s",
                                     self.billing(st))
            return
        if st.status == "COMPLETED":
            self._completed(entry, st)
        elif st.status == "CANCELLED" and job_id in self._cancelled:
            self._end(entry, job_id, "cancelled by this orchestrator (close)", self.billing(st), "cancelled")
        elif st.status in ("FAILED", "TIMED_OUT", "CANCELLED"):
            what = {"FAILED": "failed without a result from our handler (worker lost, image pull, out of "
                              "GPUs)",
                    "TIMED_OUT": "timed out on Runpod (the endpoint's execution timeout)",
                    "CANCELLED": "was cancelled on Runpod's side"}[st.status]
            detail = f": {str(st.error)[:300]}" if st.error else ""
            self._attempt_failed(entry, "timed_out" if st.status == "TIMED_OUT" else "failed",
                                 f"Runpod job {job_id} {what}{detail}", self.billing(st))
        else:
            _log.warning("Runpod job %s has an unknown status %r; polling on", job_id, st.status)

    def _completed(self, entry: _Entry, st: RunpodJobStatus) -> None:
        job_id = entry.job_id
        out = st.output
        if not (isinstance(out, dict) and isinstance(out.get("result"), dict)):
            self._attempt_failed(entry, "failed", f"Runpod job {job_id} completed without our handler's "
                                                  f"result (output {str(out)[:200]!r})", self.billing(st))
            return
        result = out["result"]
        worker = result.get("worker") or {}
        bill = self.billing(st, worker)
        problem = self._non_replica(worker)
        if problem:
            self._attempt_failed(entry, "failed", f"non-replica worker: {problem}", bill)
            return
        if entry.kind == "job":
            try:
                JobResult.model_validate(result)
            except ValueError as exc:
                self._attempt_failed(entry, "failed", f"the worker's result does not validate: {exc}", bill)
                return
            measured = [BaselineEntry.model_validate(e) for e in out.get("baselines") or []]
            if measured:
                self.baselines.put(measured)
        if self.journal.record_result(entry.key, job_id, out, bill, str(result.get("status", ""))):
            billed_s = (bill.delay_time_ms + bill.execution_time_ms) / 1000
            self._say(f"{entry.claimant}: done ({job_id}: {result.get('status')}, {bill.gpus_per_worker}x "
                      f"{bill.gpu_type}, {billed_s:.0f} s billed, ${bill.cost_usd:.4f}; idle <= "
                      f"${bill.idle_usd:.4f} to the run)")
            self._done(entry)
        else:  # another orchestrator recorded it, or moved the row on
            self._follow(entry)

    def _non_replica(self, worker: dict[str, Any]) -> str:
        """Why the worker that produced a result is not the pinned one ("" when it is)."""
        o, problems = self.options, []
        if o.require_revision and worker.get("image_revision") != o.require_revision:
            problems.append(f"image revision {worker.get('image_revision')!r}, pinned {o.require_revision!r}")
        versions = worker.get("versions") or {}
        problems += [f"{k} {versions.get(k) or 'missing'}, pinned {v}" for k, v in o.expected_versions.items()
                     if versions.get(k) != v]
        return "; ".join(problems)

    def _attempt_failed(self, entry: _Entry, status: Literal["failed", "timed_out", "expired"], why: str,
                        bill: Billing | None = None) -> None:
        """A Runpod-side failure of the current attempt: retry within the budget, else infra_failed."""
        budget, used = self.options.retry_budget, entry.attempt - entry.first_attempt + 1
        if entry.make is None and entry.state == "foreign":
            row = self.journal.get(entry.key)
            if row is not None and row.owner != self._owner and owner_alive(row.owner):
                return  # its live owner has the bundle and retries it; we follow the journal
        if used > budget or entry.make is None:
            tail = (f"; gave up after {used} attempt(s) (retry_budget={budget})" if entry.make
                    else "; not resent (this orchestrator re-attached it after a restart and has not got its "
                         "bundle)")
            self._end(entry, entry.job_id, why + tail, bill)
            return
        attempt = self.journal.next_attempt(entry.key, entry.job_id, status, why, bill, owner=self._owner)
        with self._lock:
            self._sent.discard(entry.key)
        if attempt is None:  # another orchestrator moved it on
            entry.job_id = None
            entry.state = "foreign"
            self._follow(entry)
            return
        self._say(f"{entry.claimant}: attempt {entry.attempt} lost ({why}); retrying")
        with self._lock:
            entry.job_id, entry.attempt, entry.state = None, attempt, "pending"
            self._pending.append(entry.key)
        self._wake.set()

    def _end(self, entry: _Entry, job_id: str | None, why: str, bill: Billing | None = None,
             status: Literal["infra_failed", "cancelled"] = "infra_failed") -> None:
        if self.journal.finish(entry.key, job_id, status, why, bill):
            self._say(f"{entry.claimant}: {status} ({why})")
            self._done(entry)
        else:
            self._follow(entry)

    def _done(self, entry: _Entry) -> None:
        with self._lock:
            self._sent.discard(entry.key)
            entry.state = "done"
            entry.make = entry.body = None
        entry.done.set()
        self._wake.set()

    # ------------------------------------------------------------------ baselines and lifecycle
    def measure_baseline(self, family: str, model: str) -> BaselineEntry:
        """The untrained ``model`` on ``family``'s hidden set, measured by a Runpod worker (a request of
        kind "baseline" through the same handler and journal)."""
        from ait_env.secrets import hidden_set_hash

        spec = {"family": family, "model": model, "settings": self.worker_settings.model_dump(mode="json"),
                "executor": self.options.executor, "hidden_set": hidden_set_hash(family)}
        key = "baseline:" + hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:32] + ":0"
        payload = {"kind": "baseline", "executor": self.options.executor, "family": family, "model": model,
                   "settings": spec["settings"], "require_revision": self.options.require_revision,
                   "timeout_s": self.options.job_timeout_s}
        entry = self._track(key, "baseline", f"baseline-{family}-{model}", None, lambda: payload)
        entry.done.wait()
        row = self.journal.get(key)
        assert row is not None
        self.journal.take_charge(key)
        outcome = (row.result or {}).get("result") or {}
        if row.status != "completed" or outcome.get("status") != "succeeded" or not outcome.get("entry"):
            why = row.error or outcome.get("error") or f"ended {row.status}"
            raise RuntimeError(f"runpod could not measure {model} on {family}: {why}")
        return BaselineEntry.model_validate(outcome["entry"])

    def spent_usd(self) -> float:
        """USD billed to jobs on this run dir's journal (every attempt, every orchestrator); the idle and
        active run costs are in :meth:`run_costs`."""
        return self.journal.spent_usd()

    def close(self) -> None:
        """Stop the poller. Jobs in flight keep running on Runpod (a restart re-attaches them) unless
        ``cancel_on_close``."""
        if self.closed:
            return
        if self.options.cancel_on_close:
            with self._lock:
                live = [e for e in self._entries.values() if e.state == "sent" and e.job_id]
            for e in live:
                assert e.job_id is not None
                self._cancelled.add(e.job_id)
                self._cancel(e.job_id)
                self._end(e, e.job_id, "cancelled by this orchestrator (close)", None, "cancelled")
        self._stop.set()
        self._wake.set()
        if self._poller is not None:
            self._poller.join(timeout=30)
        with self._lock:   # wake every waiter: its job is no longer tracked here
            waiting = [e for e in self._entries.values() if not e.done.is_set()]
        for e in waiting:
            e.done.set()
        self.journal.close_session(self._session_id)
        super().close()
        c = self.run_costs()
        self._say(f"run costs so far: ${c.total:.4f} (jobs ${c.jobs:.4f}, idle <= ${c.idle:.4f}, active "
                  f"workers ${c.active:.4f} over {c.wall_s:.0f} s); check them: python -m gpu.reconcile "
                  f"--runs-dir {self.runs_dir}")
