"""The ``runpod`` backend: job bundles run by the GPU worker (``gpu/worker.py``) on a Runpod Serverless
queue-based endpoint, through :class:`fleet.runpod_api.ServerlessClient`.

Contract (docs/fleet.md, "Guarantees under faults", states each guarantee with the test that shows it):

- **One instance per run, shared by every episode.** :meth:`RunpodBackend.submit` returns at once (the
  job is packed, claimed in the journal, its budget reserved, and queued locally); :meth:`RunpodBackend.wait`
  blocks only its caller, by default at most :meth:`RunpodBackend.wait_bound_s` (derived from the job's
  wall clock). **Submitter threads** (``submit_threads``) record and send queued jobs while fewer than
  ``max_in_flight`` are out; **one poller thread** reads the status of every job in flight, checks every
  deadline on every sweep (also while status reads fail), cancels, and wakes each waiter when its job ends.
  The poller never sends, packs or sleeps on a ``Retry-After``: a slow ``/run`` delays no status read.
- **Durable, never paid twice** (:mod:`fleet.journal`, ``<runs_dir>/runpod_journal.sqlite``): a job's
  key is its content hash (:func:`ait_env.jobs.cache.job_key` over the bundle and the worker's settings)
  plus a nonce (``"0"``; ``rerun: true`` uses the bundle's job id, so a deliberate re-run is a new key).
  An identical job already finished is served from the journal (``cache_hit``, $0); one in flight, here
  or in another orchestrator on the same run dir, is attached to, not sent again. **Each attempt is
  recorded before it is sent**, with a client-generated tag that also goes in the request's input (``/run``
  has no idempotency key). Every row in flight has an owner, this orchestrator's journal session, that is
  alive *and* polling (its heartbeat); a row whose owner closed, died or stopped polling is adopted by
  whichever orchestrator on the run dir sees it first (at start, then every ``owner_stale_s / 2``).
  Results are recorded the moment they are seen (Runpod keeps ``/run`` results 30 minutes).
- **Every attempt has a bound**, sent to Runpod as the request's ``policy``: ``executionTimeout`` (the
  worker's own limit plus :data:`WORKER_OVERHEAD_S`) and ``ttl`` (the deadline plus ``ttl_margin_s``:
  "Total lifespan of the job ... When TTL expires, the job is deleted regardless of state",
  runpod/docs a900806e ``serverless/endpoints/send-requests.mdx``). No attempt can bill more than its
  ``ttl`` (:attr:`Limits.bound_s`) x the dearest rate of the endpoint's GPU pools x its GPUs.
- **Failures.** A status that cannot be read is not a lost job: its reads back off (``poll_interval_s``
  doubling up to ``status_backoff_max_s``) until the attempt's deadline (``deadline_s``, by default
  ``startup_allowance_s`` + the execution timeout). At the deadline the attempt is **cancelled before
  anything is sent again** (the cancel is retried with backoff until Runpod confirms it or the attempt's
  ttl has passed, when the job cannot run any more). Runpod-side failures (FAILED without a result from our
  handler, i.e. a lost worker; TIMED_OUT; CANCELLED by Runpod; a result expired before it was read (404);
  the deadline; a run call that surely queued nothing, e.g. a 429 or no connection, past the client's
  retries) are retried as new attempts (journaled) up to ``retry_budget`` times, then end
  ``infra_failed``. A run call without a clear answer (:class:`fleet.runpod_api.SubmitUncertain`: a job may
  be queued unseen, and without its id it cannot be cancelled) is not resent: the job ends
  ``infra_failed`` at once; so does a 4xx that is ours (key, endpoint, payload). A result from a worker
  whose image revision or versions differ from the pins (``require_revision``, ``expected_versions``) is
  **deterministic** (another endpoint image answers the same): the job ends ``infra_failed`` once with the
  reason, never retried at full cost and never served. The worker's own verdict (``succeeded``,
  ``job_failed``, or its ``infra_failed``: self-check refusal, its time limit) is returned as it is.
- **Costs** (:func:`attempt_billing`, the one place). Each attempt's billed seconds (``delayTime`` +
  ``executionTime`` of the status, rounded up to a whole second as Runpod rounds: queue wait and worker
  initialization are counted, which is an upper bound: see docs/fleet.md) x the dated $/GPU-second of the
  GPU type that ran it (the worker's ``result.worker["gpus"]``; ``gpu_type`` when unknown;
  :class:`GpuPrices`: its pool's flex rate in :mod:`fleet.prices`) x its GPUs. **An attempt that may have
  run and whose bill cannot be read** (status unreadable up to its end, result expired, the run call's
  answer lost, the orchestrator died between sending and recording the id) is charged at its upper bound:
  the time from its send to when it surely ended (a confirmed cancel, a 404) or else its ttl, x the
  dearest pool's rate x GPUs, plus the idle bound, marked ``estimated`` in the journal;
  ``python -m fleet.reconcile --correct`` replaces an estimate by the bill it can read later. The sum over a
  job's attempts is ``JobResult.cost_usd`` (the env writes it to the cost ledger).
- **Budgets** (one mechanism with the env's ledger, :mod:`ait_env.observe.ledger`): each job **reserves its
  bound** (:meth:`RunpodBackend.estimate_cost_usd`: ttl x rate x GPUs, plus the idle bound) in the
  journal when it is accepted (:meth:`Journal.reserve`, atomic across orchestrators), the reservation is
  re-checked when the job leaves the local queue (a retry reserves its new attempt there), and its bill
  replaces it when it ends. ``run_budget_usd`` counts jobs + idle + active + every open reservation;
  ``episode_budget_usd`` one episode's jobs + their reservations. A refused job ends ``infra_failed`` with
  the budget's message (never charged to the agent), as a :class:`ait_env.observe.ledger.BudgetExceeded` would.
  The budget can then be passed only by the error of bounds already held.
- **Run costs** (not the agent's: never in ``JobResult.cost_usd``). Runpod bills a worker "from when a
  worker starts until it fully stops" and its idle timeout after each request ("You're billed during idle
  time", runpod/docs ``serverless/pricing.mdx`` and ``serverless/endpoints/endpoint-configurations.mdx``,
  a900806e), and active workers "continuously, including when idle" (same page, "Active workers"). So:
  (a) **idle**: each attempt a worker took (it reports a worker id or an execution time), unless it
  ended TIMED_OUT ("the job fails and the worker stops", ``endpoint-configurations.mdx``), is charged
  the endpoint's idle timeout x the attempt's $/GPU-s x its GPUs, journaled as the attempt's ``idle_usd``.
  It is an **upper bound**: a worker that takes the next queued job at once does not idle. (b)
  **active**: ``workers_min`` x GPUs per worker x the pool's active $/GPU-s over each orchestrator
  session's wall time (journal ``sessions``; overlapping sessions count once). The active rate is the
  flex rate (Runpod's docs unified the two on 2026-05-13, :data:`fleet.prices.UNIFIED_SINCE`) unless
  ``active_usd_per_gpu_s`` gives a negotiated one. :meth:`RunpodBackend.run_costs` returns jobs, idle,
  active and total USD; :meth:`RunpodBackend.charge_run_costs` puts idle and active into the env's cost
  ledger once (``gpu_idle``/``gpu_active`` records). The idle timeout, ``workers_min``, GPUs per worker and
  the pools are read from the endpoint (REST v2 ``GET /serverless/<id>``: ``workers.idleTimeout``,
  ``workers.min``, ``gpu.count``, ``gpu.pools``: what Runpod bills by) when this backend built its own
  client, else from ``options``, else from ``fleet/fleet_defaults.yaml``. The REST base URL follows the job
  API's: ``rest_base_url``, else ``$AIT_RUNPOD_REST_BASE_URL``, else ``base_url`` when that was
  overridden (a fake's, a proxy's), else Runpod's. ``python -m fleet.reconcile`` compares the journal with
  Runpod's billing.
- **Baselines.** :meth:`RunpodBackend.measure_baseline` sends a ``kind: "baseline"`` request through the
  same handler and journal (``python scripts/seed_baselines.py backend=runpod``); baselines a job measured
  come back in the handler's output and go to this backend's user store.
- **Renderers.** :meth:`RunpodBackend.model_renderers` is the map of the executor the workers run
  (:func:`ait_env.runner.executor_renderers`).
- **Secrets.** The API key comes from ``$RUNPOD_API_KEY`` only; it is never logged, journaled or put in a
  result.

Options (:class:`RunpodOptions`, ``conf/backend/runpod.yaml``; unknown keys are refused).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal


from ait_env.backends.base import Backend, JobHandle
from ait_env.hidden.baselines import BaselineEntry
from ait_env.jobs.bundle import JobBundle
from ait_env.jobs.cache import job_key
from ait_env.jobs.result import JobResult
from ait_env.jobs.settings import EVAL_ALLOWANCE_S, BackendSettings, worker_settings
from fleet.billing import (EndpointCosts, Limits, ManagementLike, RunpodJobStatus, ServerlessClientLike,
                           attempt_billing)
from fleet.journal import Billing, Journal, JournalRow, RunCosts, Session, this_owner
from fleet.settings import RunpodOptions

from fleet.runpod_api import ResultExpired, RunpodAPIError, SubmitUncertain

if TYPE_CHECKING:
    from ait_env.observe.ledger import CostLedger
    from fleet.runpod_api import ManagementClient

_log = logging.getLogger(__name__)
_IN_FLIGHT = {"IN_QUEUE": "in_queue", "IN_PROGRESS": "in_progress"}
#: what a worker spends on a request besides the job's own limit (self-check, unpacking the bundle, killing
#: what the job left, packing the result): added to the worker's limit for Runpod's executionTimeout
WORKER_OVERHEAD_S = 300.0
#: Runpod's per-request policy limits (runpod/docs a900806e, send-requests.mdx: executionTimeout "Min 5
#: sec, max 7 days", ttl "Min 10 sec, max 7 days")
_EXEC_MIN_S, _TTL_MIN_S, _POLICY_MAX_S = 5.0, 10.0, 7 * 86400.0
#: jobs a submitter takes from the local queue at once (recorded in one transaction, then sent one by one)
_SEND_BATCH = 32
#: the longest a run call retries (fleet.runpod_api.RetryPolicy.max_seconds) plus a second
_RUN_RETRY_S = 61.0


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


@dataclass
class _Entry:
    """One key tracked by this orchestrator. States: ``pending`` (in the local queue), ``sending`` (a
    submitter has it), ``sent`` (ours, polled), ``cancelling`` (ours, a cancel is due or being retried),
    ``foreign`` (another live orchestrator owns the row: followed through the journal), ``done``."""

    key: str
    kind: str
    claimant: str
    make: Callable[[], dict[str, Any]] | None   # builds what to (re)send; None: adopted, not resendable
    episode_id: str | None = None
    job_id: str | None = None
    attempt: int = 1
    first_attempt: int = 1                  # the claim's first attempt: retries are counted from it
    state: Literal["pending", "sending", "sent", "cancelling", "foreign", "done"] = "pending"
    sent_at: float = 0.0                    # the journal's clock when the current attempt was sent
    next_poll: float = 0.0
    seen: str = ""
    status_errors: int = 0                  # status reads failed in a row (the backoff's exponent)
    last_error: str = ""
    cancel_status: Literal["failed", "timed_out"] = "timed_out"
    cancel_why: str = ""
    cancel_next: float = 0.0
    cancel_tries: int = 0
    done: threading.Event = field(default_factory=threading.Event)
    body: dict[str, Any] | None = None      # what make() built (kept for retries)


class RunpodBackend(Backend):
    Options = RunpodOptions

    def __init__(self, settings: BackendSettings, runs_dir: Path | str = "runs", show_progress: bool = True,
                 client: ServerlessClientLike | None = None, management: ManagementLike | None = None, *,
                 clock: Callable[[], float] = time.time, threads: bool = True) -> None:
        """``client``/``management``: stand-ins for Runpod (tests, the simulator); ``clock``: the wall clock
        every deadline, heartbeat and journal time is read from; ``threads=False``: no submitter or poller
        thread is started, the caller drives them with :meth:`pump` (a simulated clock)."""
        super().__init__(settings, runs_dir)
        self.options: RunpodOptions
        self.show_progress = show_progress
        self._clock = clock
        self._threads_on = threads
        self.client = client if client is not None else self._make_client()
        self.journal = Journal.in_run_dir(self.runs_dir, now=clock)
        made = self._make_management() if management is None and client is None and \
            self.options.read_endpoint else None
        try:
            self.endpoint_costs = self._endpoint_costs(management or made)
        finally:
            if made is not None:
                made.close()
        #: jobs out at once: the option, else the endpoint's max workers (see RunpodOptions.max_in_flight)
        self.max_in_flight = self.options.max_in_flight or self.endpoint_costs.workers_max
        # this orchestrator's session: the owner of every row it acts on (alive while it beats)
        self._session_id = f"{this_owner()}:{uuid.uuid4().hex[:8]}"
        self._owner = self._session_id
        now = self._clock()
        self._beat_at = now
        self._adopt_at = now + self.options.owner_stale_s / 2
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
        self._out: set[str] = set()          # our keys holding a slot (sending, sent, cancelling)
        self._lock = threading.RLock()
        self._cv = threading.Condition(self._lock)   # submitters wait on it for a queued job and a slot
        self._claim_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None
        self._submitters: list[threading.Thread] = []
        self._cancelled: set[str] = set()
        self._attaching: list[tuple[_Entry, str]] = []   # sent, their id not journaled yet
        self._set_hashes: dict[str, str] = {}
        self._adopt()

    # ------------------------------------------------------------------ setup
    def _endpoint_id(self) -> str | None:
        return getattr(self.client, "endpoint_id", None) or self.options.endpoint_id or \
            os.environ.get("RUNPOD_ENDPOINT_ID")

    def rest_base_url(self) -> str:
        """Where the REST v2 API (the endpoint's settings) is read: ``rest_base_url``, else
        ``$AIT_RUNPOD_REST_BASE_URL``, else the job API's base URL when it was overridden (``base_url`` or
        ``$RUNPOD_ENDPOINT_BASE_URL``: a fake or a proxy serves both), else Runpod's REST host."""
        from fleet.runpod_api import DEFAULT_REST_BASE_URL, JOB_BASE_ENV, REST_BASE_ENV

        return (self.options.rest_base_url or os.environ.get(REST_BASE_ENV) or self.options.base_url
                or os.environ.get(JOB_BASE_ENV) or DEFAULT_REST_BASE_URL)

    def _make_management(self) -> "ManagementClient | None":
        key = os.environ.get("RUNPOD_API_KEY")
        if not key:
            return None
        from fleet.runpod_api import ManagementClient, RetryPolicy

        # one GET at start: a short retry budget, the defaults stand in when it fails
        return ManagementClient(key, base_url=self.rest_base_url(), timeout_s=10.0,
                                retry=RetryPolicy(attempts=2, max_seconds=5.0))

    def _endpoint_costs(self, management: ManagementLike | None) -> EndpointCosts:
        """The idle timeout, active workers, GPUs and pools the run costs are computed with: the endpoint's
        own settings (REST v2: what Runpod bills by), else ``options``, else ``fleet/fleet_defaults.yaml``
        (see the module docstring)."""
        from fleet import prices
        from fleet.settings import fleet_settings

        o, ep, why = self.options, None, ""
        endpoint_id = self._endpoint_id()
        if management is not None and endpoint_id:
            try:
                ep = management.get(endpoint_id)
            except (RunpodAPIError, OSError) as exc:
                why = f" (reading endpoint {endpoint_id} failed: {str(exc)[:200]})"
                _log.warning("run costs: could not read endpoint %s (%s); using the options and "
                             "fleet/fleet_defaults.yaml", endpoint_id, str(exc)[:200])
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
            sources.append(f"{name}: fleet/fleet_defaults.yaml{why}")
            return default

        idle = float(pick("idle_timeout_s", o.idle_timeout_s, workers.get("idleTimeout"),
                          fleet["idle_timeout_s"]))
        wmin = int(pick("workers_min", o.workers_min, workers.get("min"), fleet["workers_min"]))
        wmax = int(pick("workers_max", None, workers.get("max"), fleet["workers_max"]))
        gpus = int(gpu.get("count") or o.gpus_per_worker)
        pools = [str(p) for p in gpu.get("pools") or []]
        if not pools:
            first = prices.pool_for_gpu(o.gpu_type, o.prices.pools)
            pools = [first] if first else []
        pool = pools[0] if pools else ""
        try:
            active = prices.price_per_s(pool, active=True, negotiated=o.active_usd_per_gpu_s)
        except KeyError:
            active = o.active_usd_per_gpu_s or max(prices.FLEX_USD_PER_S.values())
            _log.warning("no price for pool %r: active workers billed at the dearest flex rate", pool)
        sources.append("active rate: " + ("negotiated (options)" if o.active_usd_per_gpu_s is not None else
                                          f"flex (one price since {prices.UNIFIED_SINCE})"))
        return EndpointCosts(idle_timeout_s=idle, workers_min=wmin, workers_max=wmax, gpus_per_worker=gpus,
                             pool=pool, active_usd_per_gpu_s=active, source="; ".join(sources), pools=pools)

    def _make_client(self) -> ServerlessClientLike:
        endpoint = self.options.endpoint_id or os.environ.get("RUNPOD_ENDPOINT_ID")
        key = os.environ.get("RUNPOD_API_KEY")
        if not key or not endpoint:
            missing = " and ".join(n for n, v in (("RUNPOD_API_KEY", key), ("an endpoint id", endpoint))
                                   if not v)
            raise ValueError(f"backend runpod needs {missing}: export RUNPOD_API_KEY=<key> and "
                             "RUNPOD_ENDPOINT_ID=<id> (or backend.options.endpoint_id=<id>); the endpoint is "
                             "created by the gpu endpoint tooling (gpu/README.md)")
        from fleet.runpod_api import RetryPolicy, ServerlessClient

        # status and cancel: a short retry budget; the backend backs off and retries them itself, so one
        # status outage never holds the poller for the client's minute of retries
        return ServerlessClient(endpoint, key, base_url=self.options.base_url,
                                job_retry=RetryPolicy(attempts=2, max_seconds=5.0))

    def _adopt(self) -> None:
        """Track every job the journal has in flight at start: a row whose owner is alive is followed, one
        whose owner closed or died is adopted (re-attached by id, never resent blind)."""
        rows = self.journal.in_flight()
        for row in rows:
            self._entries[row.key] = _Entry(key=row.key, kind=row.kind, claimant=row.claimant, make=None,
                                            episode_id=row.episode_id, job_id=row.job_id, attempt=row.attempt,
                                            first_attempt=row.first_attempt, state="foreign")
        if rows:
            self._say(f"re-attaching {len(rows)} job(s) in flight from the journal "
                      f"({sum(r.job_id is not None for r in rows)} with a Runpod id)")
            for row in rows:
                self._follow(self._entries[row.key])
            self._start_threads()

    def _say(self, msg: str) -> None:
        _log.info(msg)
        if self.show_progress:
            print(f"[{time.strftime('%H:%M:%S')}] runpod: {msg}", file=sys.stderr, flush=True)

    def _start_threads(self) -> None:
        if not self._threads_on or self._stop.is_set():
            return
        if self._poller is not None and len(self._submitters) == self.options.submit_threads and \
                self._poller.is_alive():
            return   # the common case, without the lock (a submitter never exits before close)
        with self._lock:
            if self._poller is None or not self._poller.is_alive():
                self._poller = threading.Thread(target=self._poll_loop, name="runpod-poller", daemon=True)
                self._poller.start()
            self._submitters = [t for t in self._submitters if t.is_alive()]
            while len(self._submitters) < self.options.submit_threads:
                t = threading.Thread(target=self._submit_loop, name=f"runpod-submit-{len(self._submitters)}",
                                     daemon=True)
                t.start()
                self._submitters.append(t)

    # ------------------------------------------------------------------ keys, limits and prices
    def _key(self, bundle: JobBundle) -> str:
        from ait_env.hidden.secrets import hidden_set_hash

        worker = {"settings": self._worker_json, "executor": self.options.executor,
                  "require_revision": self.options.require_revision}
        nonce = bundle.job_id if self.options.rerun else "0"
        family = bundle.manifest.family
        if family not in self._set_hashes:
            self._set_hashes[family] = hidden_set_hash(family)
        return f"{job_key(bundle, worker, '', self._set_hashes[family])}:{nonce}"

    def _bound_rate(self) -> float:
        """$/s of one worker at the dearest rate it may be billed: the dearest of the endpoint's pools (or
        of ``gpu_type``) x GPUs per worker."""
        from fleet import prices

        o = self.options
        rates = [o.prices.price(o.gpu_type)]
        rates += [prices.FLEX_USD_PER_S[p] for p in self.endpoint_costs.pools if p in prices.FLEX_USD_PER_S]
        return max(rates) * max(self.endpoint_costs.gpus_per_worker, o.gpus_per_worker)

    def limits(self, kind: str = "job") -> Limits:
        """The time limits and bounds of one attempt of a ``kind`` request (see :class:`Limits`): the
        worker's limit is ``job_timeout_s``, else the bounds' wall clock plus the evals' allowance (a
        baseline: the allowance), as ``gpu/worker.py`` applies it."""
        cache: dict[str, Limits] = self.__dict__.setdefault("_limits", {})
        if kind not in cache:
            cache[kind] = self._make_limits(kind)
        return cache[kind]

    def _make_limits(self, kind: str) -> Limits:
        o = self.options
        worker = o.job_timeout_s or (EVAL_ALLOWANCE_S if kind == "baseline" else
                                     self.settings.bounds.wall_clock_minutes * 60 + EVAL_ALLOWANCE_S)
        execution = o.execution_timeout_s or worker + WORKER_OVERHEAD_S
        deadline = o.deadline_s or o.startup_allowance_s + execution
        bound = deadline + o.ttl_margin_s
        rate = self._bound_rate()
        return Limits(execution_s=execution, deadline_s=deadline, bound_s=bound,
                      job_usd=round(math.ceil(bound) * rate, 6),
                      idle_usd=round(self.endpoint_costs.idle_timeout_s * rate, 6))

    def estimate_cost_usd(self, bundle: JobBundle) -> float:  # noqa: ARG002
        """The job's bound: what one attempt can bill at most (its ttl x the dearest pool's rate x GPUs)
        plus the idle bound after it. A budget reserves it (the env's ledger, this backend's journal)."""
        lim = self.limits("job")
        return round(lim.job_usd + lim.idle_usd, 6)

    def wait_bound_s(self, kind: str = "job") -> float:
        """:meth:`wait`'s default limit: every attempt the retry budget allows at its bound, plus the status
        backoff and a minute (the option ``wait_timeout_s`` overrides it)."""
        o = self.options
        if o.wait_timeout_s is not None:
            return o.wait_timeout_s
        return (o.retry_budget + 1) * (self.limits(kind).bound_s + 2 * o.status_backoff_max_s) + 60.0

    def billing(self, st: RunpodJobStatus | None, worker: dict[str, Any] | None = None) -> Billing:
        """The bill of one attempt (see the module docstring; :func:`attempt_billing`)."""
        ec = getattr(self, "endpoint_costs", None)   # None: a backend built for its billing alone (tests)
        o, idle = self.options, ec.idle_timeout_s if ec is not None else 0.0
        return attempt_billing(st, worker, prices=o.prices, gpu_type=o.gpu_type,
                               gpus_per_worker=o.gpus_per_worker, idle_timeout_s=idle)

    def _bound_bill(self, entry: _Entry, until: float | None) -> Billing:
        """The upper bound of an attempt whose bill cannot be read, marked ``estimated``: from its send to
        ``until`` (when it surely ended: a confirmed cancel, a 404), or to its ttl when nothing says it ended,
        x the dearest rate x GPUs, plus the idle bound."""
        lim = self.limits(entry.kind)
        sent = entry.sent_at or self._clock()
        seconds = lim.bound_s if until is None else min(max(0.0, until - sent), lim.bound_s)
        seconds = math.ceil(seconds - 1e-9)
        rate = self._bound_rate()
        gpus = max(self.endpoint_costs.gpus_per_worker, self.options.gpus_per_worker)
        return Billing(execution_time_ms=int(seconds * 1000), gpu_type=self.options.gpu_type,
                       gpus_per_worker=gpus, cost_usd=round(seconds * rate, 6),
                       idle_usd=lim.idle_usd, estimated=True)

    def _bill(self, entry: _Entry, st: RunpodJobStatus | None, worker: dict[str, Any] | None = None) -> Billing:
        """The bill of a final status; a worker took the attempt but no execution time is reported: its
        bound up to now (estimated)."""
        if st is not None and st.execution_time_ms is None and getattr(st, "worker_id", None) and \
                st.status in ("FAILED", "TIMED_OUT", "CANCELLED"):
            return self._bound_bill(entry, self._clock())
        return self.billing(st, worker)

    def run_costs(self) -> RunCosts:
        """This run dir's costs so far: jobs (the agents' charges), idle (upper bound), active workers over
        the sessions' wall time (this one up to now while open), and their total, in USD; ``estimated``:
        what of it is charged at bounds; ``reserved``: the bounds of jobs in flight."""
        return self.journal.run_costs(live=self._live())

    def _live(self) -> frozenset[str]:
        return frozenset() if self.closed else frozenset({self._session_id})

    def charge_run_costs(self, ledger: CostLedger) -> RunCosts:
        """Append to the env's cost ``ledger`` the idle and active USD of this run dir not charged before
        (records ``kind="gpu_idle"`` and ``"gpu_active"``, no episode: run costs, not an agent's), once across
        orchestrators (:meth:`Journal.take_run_charges`); the ``gpu_job`` records the env writes hold the
        jobs. Returns the run costs charged up to. Call it at the end of a run (after :meth:`close`, the
        active workers stop counting) or whenever the ledger should catch up."""
        from ait_env.observe.ledger import CostRecord

        costs = self.run_costs()
        for part, usd in self.journal.take_run_charges(costs).items():
            if usd > 0:
                ledger.append(CostRecord(kind=f"gpu_{part}", usd=usd, meta={
                    "backend": self.name, "journal": str(self.journal.path), "run_total_usd": costs.total}))
        return costs

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

    # ------------------------------------------------------------------ submit / wait
    def _payload(self, bundle: JobBundle) -> dict[str, Any]:
        from ait_env.jobs.wire import pack_bundle

        return {"kind": "job", "executor": self.options.executor,
                "settings": self._worker_json, "bundle": pack_bundle(bundle.root),
                "baselines": [e.model_dump(mode="json") for e in self.baselines.entries().values()],
                "require_revision": self.options.require_revision, "timeout_s": self.options.job_timeout_s}

    def submit(self, bundle: JobBundle) -> JobHandle:
        """Claim the job and queue it; its payload is packed here, on the caller's thread (a few ms), so the
        submitters only record and send."""
        key = self._key(bundle)
        try:
            body: dict[str, Any] | None = self._payload(bundle)
        except (OSError, ValueError):   # packed again when sent, where the error ends the job infra_failed
            body = None

        def make() -> dict[str, Any]:
            return body if body is not None else self._payload(bundle)

        self._track(key, "job", bundle.job_id, bundle.manifest.episode_id, make)
        return JobHandle(job_id=bundle.job_id, backend=self.name, meta={"key": key, "root": str(bundle.root)})

    def _track(self, key: str, kind: str, claimant: str, episode_id: str | None,
               payload: Callable[[], dict[str, Any]] | None) -> _Entry:
        """Claim ``key`` (or join it) and track it: a new claim reserves its bound and is queued for a
        submitter. ``payload()`` builds what to send (called when it is sent; None: this caller cannot
        resend it)."""
        if self.closed:
            raise RuntimeError("the runpod backend is closed; build a new one")
        # one claim per key and process at a time (two episodes, one identical job): claims queue on their
        # own lock, so the journal transaction never holds up the submitters and the poller
        with self._claim_lock:
            with self._lock:
                entry = self._entries.get(key)
                if entry is not None and entry.state != "done":
                    if entry.make is None:   # adopted after a restart: now it can be resent if needed
                        entry.make = payload
                    return entry
            row, new = self.journal.claim(key, claimant=claimant, kind=kind, episode_id=episode_id,
                                          owner=self._owner)
            entry = _Entry(key=key, kind=kind, claimant=claimant, make=payload, episode_id=episode_id,
                           job_id=row.job_id, attempt=row.attempt, first_attempt=row.first_attempt)
            if row.final and not new:
                entry.state, entry.make = "done", None
                entry.done.set()
                self._say(f"{claimant}: served from the journal (job {row.job_id}, "
                          f"{row.result_status or row.status})")
            elif not new:
                entry.state = "foreign"
                self._say(f"{claimant}: already in flight as {row.job_id or '(being sent)'}; attached")
            elif why := self._reserve(entry):
                self.journal.finish(key, None, "infra_failed", f"dispatch refused: {why}")
                entry.state = "done"
                entry.done.set()
                self._say(f"{claimant}: refused ({why})")
            with self._cv:
                there = self._entries.get(key)
                if there is not None and there.state != "done":   # the poller adopted the row meanwhile
                    return there
                self._entries[key] = entry
                if entry.state == "pending":
                    self._pending.append(key)
                    self._cv.notify()
        if entry.state == "foreign":
            self._follow(entry)
        if entry.state != "done":
            self._start_threads()
        return entry

    def wait(self, handle: JobHandle, timeout: float | None = None) -> JobResult:
        """The job's result, once it ended. ``timeout``: raise ``TimeoutError`` after that many seconds (the
        job keeps running); None: at most :meth:`wait_bound_s`, after which the job is ended here
        (cancelled, charged at its bound, ``infra_failed``): no waiter blocks forever."""
        key = handle.meta["key"]
        with self._lock:
            entry = self._entries.get(key)
        if entry is None:  # a handle from another instance: follow the journal's row
            row = self.journal.get(key)
            if row is None:
                raise KeyError(f"job {handle.job_id} ({key}) is not in the journal {self.journal.path}")
            entry = self._track(key, row.kind, handle.job_id, row.episode_id, None)
        limit = timeout if timeout is not None else self.wait_bound_s(entry.kind)
        if not entry.done.wait(limit):
            if timeout is not None:
                raise TimeoutError(f"runpod job {handle.job_id} did not finish within {timeout} s (it keeps "
                                   "running; wait again, or a restarted orchestrator re-attaches it)")
            self._give_up(entry, f"no end within wait()'s bound of {limit:.0f} s (wait_bound_s: every "
                                 "attempt's ttl plus the status backoff)")
        row, charge = self.journal.collect(key)
        assert row is not None
        return self._result(handle.job_id, row, charge)

    def _give_up(self, entry: _Entry, why: str) -> None:
        """End a job nothing else ended in time: cancel its attempt (best effort), charge the attempt at its
        bound, finish it ``infra_failed``."""
        row = self.journal.get(entry.key)
        if row is not None and not row.final:
            sent = self.journal.attempt_row(entry.key, row.attempt) or {}
            bill = None
            if row.job_id:
                self._cancel(row.job_id)
            if row.job_id or sent.get("sent_at") is not None:
                entry.sent_at = float(sent.get("sent_at") or row.submitted_at or entry.sent_at or 0.0)
                bill = self._bound_bill(entry, None)
            if self.journal.finish(entry.key, row.job_id, "infra_failed", why, bill):
                self._say(f"{entry.claimant}: infra_failed ({why})")
        self._done(entry)

    def _result(self, job_id: str, row: JournalRow, charge: float | None) -> JobResult:
        """The job's result from its row; ``charge``: its cost when this caller is the one charged (else
        None: served, or charged before)."""
        timings = {"runpod_delay_s": row.delay_time_ms / 1000,
                   "runpod_execution_s": row.execution_time_ms / 1000,
                   "runpod_attempts": float(row.attempt - row.first_attempt + 1)}
        if row.estimated_usd:
            timings["runpod_estimated_usd"] = row.estimated_usd
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

    # ------------------------------------------------------------------ submitters
    def _submit_loop(self) -> None:
        while not self._stop.is_set():
            try:
                if not self._send_next(block=True):
                    continue
            except Exception:  # noqa: BLE001 - a submitter must outlive one bad send
                _log.exception("runpod submitter failed; going on")

    def _send_next(self, block: bool = False) -> bool:
        """Take the queued jobs free slots allow (up to :data:`_SEND_BATCH`) and send them; False when there
        was none."""
        with self._cv:
            while True:
                while self._pending and self._entries[self._pending[0]].state != "pending":
                    self._pending.popleft()
                if self._pending and len(self._out) < self.max_in_flight:
                    break
                if not block or self._stop.is_set():
                    return False
                self._cv.wait(1.0)
                if self._stop.is_set():
                    return False
            batch: list[_Entry] = []
            while self._pending and len(self._out) < self.max_in_flight and len(batch) < _SEND_BATCH:
                entry = self._entries[self._pending.popleft()]
                if entry.state != "pending":
                    continue
                entry.state = "sending"
                self._out.add(entry.key)
                batch.append(entry)
        self._send(batch)
        return True

    def _send(self, batch: list[_Entry]) -> None:
        """Send the entries' current attempts: re-check each one's budget, pack it if it is not yet, record
        them all (tag, time: one transaction), then run each; the ids go to the journal in one transaction
        too (:meth:`_attach_sent`, by this thread or the poller, whichever comes first)."""
        ready: list[_Entry] = []
        for entry in batch:
            why = self._reserve(entry)   # the budget, re-checked as the job leaves the local queue
            if why:
                self._end(entry, None, f"dispatch refused: {why}")
                continue
            try:
                if entry.body is None:
                    assert entry.make is not None
                    entry.body = entry.make()
            except (OSError, ValueError) as exc:   # e.g. a bundle over the /run payload limit
                self._end(entry, None, f"the job could not be packed for Runpod: {exc}")
                continue
            ready.append(entry)
        if not ready:
            return
        tags = [uuid.uuid4().hex for _ in ready]
        now = self._clock()
        # hard_end: the last moment the attempt can run (its ttl from a send as late as the client's retries
        # allow); a row with an attempt sent unseen is not claimed again before it
        sent = self.journal.mark_sending_many(
            [(e.key, e.attempt, tag, now + self.limits(e.kind).bound_s + _RUN_RETRY_S)
             for e, tag in zip(ready, tags)], owner=self._owner)
        for entry, tag, sent_at in zip(ready, tags, sent):
            if sent_at is None:
                self._to_foreign(entry)   # the row moved on meanwhile (adopted elsewhere, or final)
                continue
            entry.sent_at = sent_at
            self._run(entry, tag)
        self._attach_sent()

    def _run(self, entry: _Entry, tag: str) -> None:
        """``POST /run`` of the entry's attempt (recorded as sending, with ``tag``) and what its answer means."""
        assert entry.body is not None
        lim = self.limits(entry.kind)
        try:
            job_id = self.client.run({**entry.body, "tag": tag},
                                     execution_timeout_s=min(max(lim.execution_s, _EXEC_MIN_S), _POLICY_MAX_S),
                                     ttl_s=min(max(lim.bound_s, _TTL_MIN_S), _POLICY_MAX_S))
        except SubmitUncertain as exc:
            # /run has no idempotency key and no route lists an endpoint's jobs: a job may be queued (and
            # billed) unseen, and without its id it cannot be cancelled. It is charged at its bound (its
            # ttl caps its life) and not resent, which could run it twice.
            self._end(entry, None, f"the run call got no clear answer ({exc}); not resent, since a job may "
                                   f"have been queued unseen (tag {tag}): charged at its bound, estimated; the "
                                   f"same job is not sent again before "
                                   f"{_utc(entry.sent_at + lim.bound_s + _RUN_RETRY_S)}",
                      self._bound_bill(entry, None))
            return
        except RunpodAPIError as exc:
            status = getattr(exc, "status", 0) or 0
            if status and status < 500 and status != 429:  # ours: bad key, payload too large, no endpoint
                self._end(entry, None, f"Runpod refused the job ({exc}); check RUNPOD_API_KEY, the endpoint "
                                       "id and the payload size (10 MB for /run)", Billing())
            else:   # surely not queued (429, no connection: fleet.runpod_api raises SubmitUncertain otherwise)
                self._attempt_failed(entry, "failed", f"the run call failed after the client's retries: {exc}",
                                     Billing())
            return
        except OSError as exc:
            self._attempt_failed(entry, "failed", f"the run call failed: {type(exc).__name__}: {exc}", Billing())
            return
        with self._lock:
            self._attaching.append((entry, job_id))

    def _attach_sent(self) -> None:
        """Journal the ids of the attempts sent since the last call (one transaction) and start polling
        them. Submitters call it after their batch, the poller at every sweep, so a run call that hangs
        never holds up the ids of those sent before it."""
        with self._lock:
            items, self._attaching = self._attaching, []
        if not items:
            return
        done = self.journal.attach_many([(e.key, job_id, e.attempt) for e, job_id in items])
        now = self._clock()
        for (entry, job_id), attached in zip(items, done):
            if not attached:
                self._cancel(job_id)   # the row moved on meanwhile (adopted and ended elsewhere): surplus
                self._to_foreign(entry)
                continue
            with self._lock:
                entry.job_id, entry.seen, entry.status_errors, entry.next_poll = job_id, "", 0, now
                if entry.state == "sending":
                    entry.state = "sent"
            self._say(f"{entry.claimant}: submitted as {job_id}"
                      + (f" (attempt {entry.attempt})" if entry.attempt > 1 else ""))

    def _cancel(self, job_id: str) -> bool:
        """Cancel a job on Runpod; True when Runpod answered (it is cancelled, or already gone: 404)."""
        try:
            self.client.cancel(job_id)
        except ResultExpired:
            return True
        except Exception as exc:  # noqa: BLE001 - the caller retries
            _log.warning("could not cancel Runpod job %s: %s", job_id, exc)
            return False
        return True

    # ------------------------------------------------------------------ the poller
    def pump(self) -> None:
        """One turn of the submitters and the poller, on the caller's thread (``threads=False``: a test
        or simulator drives the backend on its own clock)."""
        while self._send_next(block=False):
            pass
        self._sweep()

    def _poll_loop(self) -> None:
        """A sweep every ``poll_interval_s`` (never more often: a sweep goes over every job tracked), until
        :meth:`close` wakes it."""
        while not self._stop.is_set():
            try:
                self._sweep()
            except Exception:  # noqa: BLE001 - the poller must outlive one bad sweep
                _log.exception("runpod poller sweep failed; retrying")
            self._wake.wait(self.options.poll_interval_s)

    def _sweep(self) -> None:
        """Beat; adopt rows whose owner is gone; read the statuses that are due (backing off the unreadable
        ones); check every deadline; push every cancel that is due; follow rows others own."""
        o, now = self.options, self._clock()
        if now - self._beat_at >= o.owner_stale_s / 4:
            self._beat_at = now
            self.journal.beat(self._session_id)
        if now >= self._adopt_at:
            self._adopt_at = now + o.owner_stale_s / 2
            self._adopt_orphans()
        self._attach_sent()
        own: list[_Entry] = []
        foreign: list[_Entry] = []
        with self._lock:
            for e in self._entries.values():
                if e.state == "done":
                    continue
                if e.state == "foreign":
                    foreign.append(e)
                elif e.state in ("sent", "cancelling") and e.job_id:
                    own.append(e)
        due = [e for e in own if e.state == "sent" and e.next_poll <= now]
        answers = self._statuses([e.job_id for e in due if e.job_id])
        batch: list[tuple[_Entry, RunpodJobStatus, dict[str, Any], Billing]] = []
        for entry in due:
            if self._stop.is_set():
                break
            if entry.state == "sent" and entry.job_id in answers:
                self._poll(entry, answers[entry.job_id], batch)
        self._record(batch)
        now = self._clock()
        for entry in own:   # deadlines: on every sweep, whatever the status reads did
            if entry.state == "sent" and now >= entry.sent_at + self.limits(entry.kind).deadline_s:
                limit = self.limits(entry.kind).deadline_s
                seen = f" (status unreadable {entry.status_errors} time(s): {entry.last_error[:200]})" \
                    if entry.status_errors else ""
                self._begin_cancel(entry, "timed_out", f"no result from {entry.job_id} within its deadline of "
                                                       f"{limit:.0f} s{seen}")
            elif entry.state == "cancelling" and now >= entry.cancel_next:
                self._try_cancel(entry)
        for entry in foreign:
            self._follow(entry)

    def _statuses(self, ids: list[str]) -> dict[str, Any]:
        """The status of each id, or the error its read raised."""
        if not ids:
            return {}
        many = getattr(self.client, "status_many", None)
        try:
            if many is not None and len(ids) > 1:
                return dict(many(ids))
        except Exception as exc:  # noqa: BLE001 - every id gets the error
            return {i: exc for i in ids}
        out: dict[str, Any] = {}
        for i in ids:
            try:
                out[i] = self.client.status(i)
            except Exception as exc:  # noqa: BLE001
                out[i] = exc
        return out

    def _poll(self, entry: _Entry, answer: Any, batch: list[Any] | None = None) -> None:
        """Act on the status of ``entry``'s attempt (``answer``: a status or the error its read raised);
        results to record go to ``batch`` when given (:meth:`_record`)."""
        job_id, o, now = entry.job_id, self.options, self._clock()
        assert job_id is not None
        if isinstance(answer, ResultExpired):
            # the job is gone (its result expired, or its ttl ran out): it may have run up to now
            self._attempt_failed(entry, "expired", f"the result of {job_id} expired before it was read "
                                                   "(Runpod keeps /run results 30 minutes); charged at its "
                                                   "bound, estimated", self._bound_bill(entry, now))
            return
        if isinstance(answer, Exception):
            entry.status_errors += 1
            entry.last_error = f"{type(answer).__name__}: {answer}"
            entry.next_poll = now + min(o.status_backoff_max_s, o.poll_interval_s * 2 ** entry.status_errors)
            if entry.status_errors in (1, 4) or entry.status_errors % 10 == 0:
                _log.warning("status of Runpod job %s unreadable (%d in a row; next read in %.1f s; its "
                             "deadline decides): %s", job_id, entry.status_errors, entry.next_poll - now,
                             entry.last_error[:300])
            return
        st = answer
        entry.status_errors, entry.next_poll = 0, now + o.poll_interval_s
        if st.status in _IN_FLIGHT:
            if st.status != entry.seen:
                entry.seen = st.status
                self.journal.update_status(entry.key, _IN_FLIGHT[st.status], job_id)  # type: ignore[arg-type]
                where = "in queue" if st.status == "IN_QUEUE" else "running"
                self._say(f"{entry.claimant}: {where} ({job_id}"
                          + (f" on worker {st.worker_id})" if st.worker_id else ")"))
            return
        self._final(entry, st, batch)

    def _final(self, entry: _Entry, st: RunpodJobStatus, batch: list[Any] | None = None) -> None:
        """Act on a final status of the current attempt."""
        job_id = entry.job_id
        if st.status == "COMPLETED":
            self._completed(entry, st, batch)
        elif st.status == "CANCELLED" and job_id in self._cancelled:
            self._end(entry, job_id, "cancelled by this orchestrator (close)", self._bill(entry, st), "cancelled")
        elif st.status in ("FAILED", "TIMED_OUT", "CANCELLED"):
            what = {"FAILED": "failed without a result from our handler (worker lost, image pull, out of "
                              "GPUs)",
                    "TIMED_OUT": "timed out on Runpod (the request's execution timeout)",
                    "CANCELLED": "was cancelled on Runpod's side"}[st.status]
            detail = f": {str(st.error)[:300]}" if st.error else ""
            self._attempt_failed(entry, "timed_out" if st.status == "TIMED_OUT" else "failed",
                                 f"Runpod job {job_id} {what}{detail}", self._bill(entry, st))
        else:
            _log.warning("Runpod job %s has an unknown status %r; polling on", job_id, st.status)

    def _begin_cancel(self, entry: _Entry, status: Literal["failed", "timed_out"], why: str) -> None:
        with self._lock:
            if entry.state != "sent":
                return
            entry.state, entry.cancel_status, entry.cancel_why = "cancelling", status, why
            entry.cancel_tries, entry.cancel_next = 0, self._clock()
        self._try_cancel(entry)

    def _try_cancel(self, entry: _Entry) -> None:
        """Cancel the attempt; once Runpod confirms (or its ttl passed: it cannot run any more), bill it and
        retry or end the job. Until then nothing is sent again; the cancel is retried with backoff."""
        job_id, o, now = entry.job_id, self.options, self._clock()
        assert job_id is not None
        confirmed = self._cancel(job_id)
        lim = self.limits(entry.kind)
        if not confirmed:
            entry.cancel_tries += 1
            if now < entry.sent_at + lim.bound_s:
                entry.cancel_next = now + min(o.status_backoff_max_s, o.poll_interval_s * 2 ** entry.cancel_tries)
                return
            why = f"{entry.cancel_why}; the cancel was not confirmed, but its ttl of {lim.bound_s:.0f} s has passed"
            self._attempt_failed(entry, entry.cancel_status, why + "; charged at its bound, estimated",
                                 self._bound_bill(entry, None))
            return
        try:   # its final bill (or a result that came just before the cancel)
            st = self.client.status(job_id)
        except (RunpodAPIError, OSError):
            st = None
        if st is not None and st.status == "COMPLETED":
            self._completed(entry, st)
            return
        if st is None or st.status not in ("CANCELLED", "FAILED", "TIMED_OUT"):
            bill = self._bound_bill(entry, now)   # cancelled by now, its bill unread
            why = entry.cancel_why + "; cancelled, its bill unread: charged up to the cancel, estimated"
        else:
            bill, why = self._bill(entry, st), entry.cancel_why + "; cancelled"
        self._attempt_failed(entry, entry.cancel_status, why, bill)

    def _completed(self, entry: _Entry, st: RunpodJobStatus, batch: list[Any] | None = None) -> None:
        """A COMPLETED attempt: check its result and record it (into ``batch`` when given)."""
        job_id = entry.job_id
        out = st.output
        if not (isinstance(out, dict) and isinstance(out.get("result"), dict)):
            self._attempt_failed(entry, "failed", f"Runpod job {job_id} completed without our handler's "
                                                  f"result (output {str(out)[:200]!r})", self._bill(entry, st))
            return
        result = out["result"]
        worker = result.get("worker") or {}
        bill = self.billing(st, worker)
        problem = self._non_replica(worker)
        if problem:   # deterministic: the endpoint's workers run another image or versions than pinned
            self._end(entry, job_id, f"non-replica worker: {problem}. Not retried: every worker of this "
                                     "endpoint would answer the same; deploy the pinned image (python -m "
                                     "fleet.endpoint up) or change require_revision/expected_versions", bill)
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
        if batch is not None:
            batch.append((entry, st, out, bill))
        else:
            self._record([(entry, st, out, bill)])

    def _record(self, batch: list[tuple[_Entry, RunpodJobStatus, dict[str, Any], Billing]]) -> None:
        """Record the results of ``batch`` (one write transaction) and end their jobs."""
        if not batch:
            return
        done = self.journal.record_results([(e.key, e.job_id, out, bill, str(out["result"].get("status", "")))
                                            for e, _, out, bill in batch])
        for (entry, _, out, bill), recorded in zip(batch, done):
            if not recorded:   # another orchestrator recorded it, or moved the row on
                self._to_foreign(entry)
                continue
            billed_s = math.ceil((bill.delay_time_ms + bill.execution_time_ms) / 1000 - 1e-9)
            self._say(f"{entry.claimant}: done ({entry.job_id}: {out['result'].get('status')}, "
                      f"{bill.gpus_per_worker}x {bill.gpu_type}, {billed_s} s billed, ${bill.cost_usd:.4f}; "
                      f"idle <= ${bill.idle_usd:.4f} to the run)")
            self._done(entry)

    def _non_replica(self, worker: dict[str, Any]) -> str:
        """Why the worker that produced a result is not the pinned one ("" when it is)."""
        o, problems = self.options, []
        if o.require_revision and worker.get("image_revision") != o.require_revision:
            problems.append(f"image revision {worker.get('image_revision')!r}, pinned {o.require_revision!r}")
        versions = worker.get("versions") or {}
        problems += [f"{k} {versions.get(k) or 'missing'}, pinned {v}" for k, v in o.expected_versions.items()
                     if versions.get(k) != v]
        return "; ".join(problems)

    # ------------------------------------------------------------------ owners: follow and adopt
    def _follow(self, entry: _Entry) -> None:
        """An entry whose row another orchestrator owns: take its end from the journal; adopt the row when
        its owner closed, died or stopped polling."""
        row = self.journal.get(entry.key)
        if row is None:
            return
        if row.final:
            self._done(entry)
            return
        if row.owner == self._owner:
            self._own(entry, row)
            return
        if not self.journal.owner_live(row.owner, self.options.owner_stale_s):
            adopted = self.journal.adopt(entry.key, row.owner, self._owner)
            if adopted is not None:
                self._say(f"{entry.claimant}: adopted from {row.owner} (closed, gone or not polling)")
                self._own(entry, adopted)
            return
        entry.job_id, entry.attempt = row.job_id, row.attempt

    def _own(self, entry: _Entry, row: JournalRow) -> None:
        """Act on a row this orchestrator now owns, by where its current attempt is."""
        a = self.journal.attempt_row(entry.key, row.attempt) or {}
        with self._lock:
            entry.attempt, entry.first_attempt = row.attempt, row.first_attempt
            entry.sent_at = float(a.get("sent_at") or row.submitted_at or self._clock())
            if row.job_id is not None:                      # sent and recorded: poll it
                entry.job_id, entry.state, entry.next_poll = row.job_id, "sent", self._clock()
                entry.status_errors, entry.seen = 0, ""
                self._out.add(entry.key)
                return
            entry.job_id = None
        if a.get("sent_at") is not None:                    # sent, its id never recorded
            until = a.get("hard_end") or entry.sent_at + self.limits(entry.kind).bound_s
            self._end(entry, None, f"attempt {row.attempt} was sent (tag {a.get('tag')}) but its Runpod id was "
                                   "never recorded (the orchestrator that sent it ended first, or the answer was "
                                   "lost): it may run unseen and cannot be cancelled without its id; charged at "
                                   f"its bound, estimated, and not sent again before {_utc(float(until))}",
                      self._bound_bill(entry, None))
        elif entry.make is not None:                        # claimed, never sent: send it
            with self._cv:
                entry.state = "pending"
                self._pending.append(entry.key)
                self._cv.notify()
            self._start_threads()
        else:
            self._end(entry, None, "the orchestrator that claimed this job ended before sending it, and this "
                                   "one has not got its bundle; submit the job again")

    def _to_foreign(self, entry: _Entry) -> None:
        with self._lock:
            self._out.discard(entry.key)
            entry.state = "foreign"
        self._follow(entry)

    def _adopt_orphans(self) -> None:
        """Rows in flight whose owner is gone (closed, dead, not polling): this orchestrator adopts them."""
        live: dict[str, bool] = {}
        for row in self.journal.in_flight():
            if row.owner == self._owner:
                continue
            if row.owner not in live:
                live[row.owner] = self.journal.owner_live(row.owner, self.options.owner_stale_s)
            if live[row.owner]:
                continue
            with self._lock:
                entry = self._entries.get(row.key)
                if entry is None or entry.state == "done":
                    entry = _Entry(key=row.key, kind=row.kind, claimant=row.claimant, make=None,
                                   episode_id=row.episode_id, state="foreign")
                    self._entries[row.key] = entry
            if entry.state == "foreign":
                self._follow(entry)

    # ------------------------------------------------------------------ attempts end
    def _attempt_failed(self, entry: _Entry, status: Literal["failed", "timed_out", "expired"], why: str,
                        bill: Billing | None = None) -> None:
        """A Runpod-side failure of the current attempt (already over: cancelled, gone, or never queued):
        retry within the budget, else infra_failed."""
        budget, used = self.options.retry_budget, entry.attempt - entry.first_attempt + 1
        if used > budget or entry.make is None:
            tail = (f"; gave up after {used} attempt(s) (retry_budget={budget})" if entry.make
                    else "; not resent (this orchestrator re-attached it after a restart and has not got its "
                         "bundle)")
            self._end(entry, entry.job_id, why + tail, bill)
            return
        attempt = self.journal.next_attempt(entry.key, entry.job_id, status, why, bill, owner=self._owner)
        if attempt is None:  # another orchestrator moved it on
            self._to_foreign(entry)
            return
        self._say(f"{entry.claimant}: attempt {entry.attempt} lost ({why}); retrying")
        with self._cv:
            self._out.discard(entry.key)
            entry.job_id, entry.attempt, entry.state, entry.sent_at = None, attempt, "pending", 0.0
            self._pending.append(entry.key)
            self._cv.notify()

    def _end(self, entry: _Entry, job_id: str | None, why: str, bill: Billing | None = None,
             status: Literal["infra_failed", "cancelled"] = "infra_failed") -> None:
        if self.journal.finish(entry.key, job_id, status, why, bill):
            self._say(f"{entry.claimant}: {status} ({why})")
            self._done(entry)
        else:
            self._to_foreign(entry)

    def _done(self, entry: _Entry) -> None:
        with self._cv:
            self._out.discard(entry.key)
            entry.state = "done"
            entry.make = entry.body = None
            self._cv.notify()
        entry.done.set()

    # ------------------------------------------------------------------ baselines and lifecycle
    def measure_baseline(self, family: str, model: str) -> BaselineEntry:
        """The untrained ``model`` on ``family``'s hidden set, measured by a Runpod worker (a request of
        kind "baseline" through the same handler and journal)."""
        from ait_env.hidden.secrets import hidden_set_hash

        spec = {"family": family, "model": model, "settings": self.worker_settings.model_dump(mode="json"),
                "executor": self.options.executor, "hidden_set": hidden_set_hash(family)}
        key = "baseline:" + hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:32] + ":0"
        payload = {"kind": "baseline", "executor": self.options.executor, "family": family, "model": model,
                   "settings": spec["settings"], "require_revision": self.options.require_revision,
                   "timeout_s": self.options.job_timeout_s}
        entry = self._track(key, "baseline", f"baseline-{family}-{model}", None, lambda: payload)
        limit = self.wait_bound_s("baseline")
        if not entry.done.wait(limit):
            self._give_up(entry, f"no end within the bound of {limit:.0f} s")
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
        """Stop the submitters and the poller and close this orchestrator's session: its jobs in flight keep
        running on Runpod and any backend on this run dir adopts them (a new one at start), unless
        ``cancel_on_close``."""
        if self.closed:
            return
        if self.options.cancel_on_close:
            with self._lock:
                live = [e for e in self._entries.values() if e.state in ("sent", "cancelling") and e.job_id]
            for e in live:
                assert e.job_id is not None
                self._cancelled.add(e.job_id)
                self._cancel(e.job_id)
                try:
                    st = self.client.status(e.job_id)
                except (RunpodAPIError, OSError):
                    st = None
                bill = self._bill(e, st) if st is not None and st.status != "IN_PROGRESS" and \
                    st.status != "IN_QUEUE" else self._bound_bill(e, self._clock())
                self._end(e, e.job_id, "cancelled by this orchestrator (close)", bill, "cancelled")
        self._stop.set()
        with self._cv:
            self._cv.notify_all()
        self._wake.set()
        if self._poller is not None:
            self._poller.join(timeout=30)
        for t in self._submitters:   # one may be sleeping out a Retry-After: its send ends on its own, and
            t.join(timeout=10)       # its attach lands on a closed session's row, which others adopt
        self._attach_sent()
        with self._lock:   # wake every waiter: its job is no longer tracked here
            waiting = [e for e in self._entries.values() if not e.done.is_set()]
        for e in waiting:
            e.done.set()
        self.journal.close_session(self._session_id)
        super().close()
        c = self.run_costs()
        est = f"; ${c.estimated:.4f} of it estimated at bounds (python -m fleet.reconcile --correct)" \
            if c.estimated else ""
        self._say(f"run costs so far: ${c.total:.4f} (jobs ${c.jobs:.4f}, idle <= ${c.idle:.4f}, active "
                  f"workers ${c.active:.4f} over {c.wall_s:.0f} s{est}); check them: python -m fleet.reconcile "
                  f"--runs-dir {self.runs_dir}")
