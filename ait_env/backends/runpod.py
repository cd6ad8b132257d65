"""The ``runpod`` backend: job bundles run by the GPU worker (``gpu/worker.py``) on a Runpod Serverless
queue-based endpoint. This module is the backend's face (keys, payloads, results, baselines, run costs);
the dispatch core it drives is :class:`fleet.dispatch.Dispatcher` (queue, submitters, poller, deadlines,
retries, budgets, owners: the same for every engine) with Runpod as its engine
(:class:`fleet.runpod_engine.RunpodEngine`: the job API, bills, the endpoint's settings).

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
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ait_env.backends.base import Backend, JobHandle
from ait_env.hidden.baselines import BaselineEntry
from ait_env.jobs.bundle import JobBundle
from ait_env.jobs.cache import job_key
from ait_env.jobs.result import JobResult
from ait_env.jobs.settings import BackendSettings, worker_settings
from fleet.billing import EndpointCosts, Limits, ManagementLike, RunpodJobStatus, ServerlessClientLike
from fleet.dispatch import Dispatcher
from fleet.journal import Billing, Journal, JournalRow, RunCosts
from fleet.runpod_engine import RunpodEngine
from fleet.settings import RunpodOptions

if TYPE_CHECKING:
    from ait_env.observe.ledger import CostLedger


class RunpodBackend(Backend):
    Options = RunpodOptions
    #: the command that checks this backend's journal against the provider's own bill
    reconcile_module = "fleet.reconcile"

    def __init__(self, settings: BackendSettings, runs_dir: Path | str | None = None, show_progress: bool = True,
                 client: ServerlessClientLike | None = None, management: ManagementLike | None = None, *,
                 clock: Callable[[], float] = time.time, threads: bool = True) -> None:
        """``client``/``management``: stand-ins for Runpod (tests, the simulator); ``clock``: the wall clock
        every deadline, heartbeat and journal time is read from; ``threads=False``: no submitter or poller
        thread is started, the caller drives them with :meth:`pump` (a simulated clock)."""
        super().__init__(settings, runs_dir)
        self.options: RunpodOptions
        self.engine = RunpodEngine(self.options, client, management)
        self.worker_settings = worker_settings(settings)
        self._worker_json = self.worker_settings.model_dump(mode="json")
        self._set_hashes: dict[str, str] = {}
        self.dispatch = Dispatcher(self.engine, Journal.in_run_dir(self.runs_dir, now=clock), self.options,
                                   wall_clock_s=settings.bounds.wall_clock_minutes * 60,
                                   on_result=self._check_output, show_progress=show_progress, clock=clock,
                                   threads=threads)

    # ------------------------------------------------------------------ what the dispatch core and its engine hold
    @property
    def show_progress(self) -> bool:
        """Progress lines on stderr (settable)."""
        return self.dispatch.show_progress

    @show_progress.setter
    def show_progress(self, on: bool) -> None:
        self.dispatch.show_progress = on

    @property
    def client(self) -> ServerlessClientLike:
        return self.engine.client

    @property
    def journal(self) -> Journal:
        return self.dispatch.journal

    @property
    def endpoint_costs(self) -> EndpointCosts:
        return self.engine.endpoint_costs

    @property
    def max_in_flight(self) -> int:
        return self.dispatch.max_in_flight

    def rest_base_url(self) -> str:
        return self.engine.rest_base_url()

    def limits(self, kind: str = "job") -> Limits:
        """One attempt's limits and bounds (:meth:`fleet.dispatch.Dispatcher.limits`)."""
        return self.dispatch.limits(kind)

    def wait_bound_s(self, kind: str = "job") -> float:
        return self.dispatch.wait_bound_s(kind)

    def billing(self, st: RunpodJobStatus | None, worker: dict[str, Any] | None = None) -> Billing:
        """The bill of one attempt (:func:`fleet.billing.attempt_billing`)."""
        return self.engine.bill(st, worker)

    def estimate_cost_usd(self, bundle: JobBundle) -> float:  # noqa: ARG002
        """The job's bound: what one attempt can bill at most (its ttl x the dearest pool's rate x GPUs)
        plus the idle bound after it. A budget reserves it (the env's ledger, this backend's journal)."""
        return self.dispatch.estimate_cost_usd("job")

    def run_costs(self) -> RunCosts:
        """This run dir's costs so far (:meth:`fleet.dispatch.Dispatcher.run_costs`)."""
        return self.dispatch.run_costs()

    def pump(self) -> None:
        """One turn of the submitters and the poller on the caller's thread (``threads=False``)."""
        self.dispatch.pump()

    def spent_usd(self) -> float:
        """USD billed to jobs on this run dir's journal (every attempt, every orchestrator); the idle and
        active run costs are in :meth:`run_costs`."""
        return self.journal.spent_usd()

    def charge_run_costs(self, ledger: CostLedger) -> RunCosts:
        """Append to the env's cost ``ledger`` the idle, active and controller USD of this run dir not charged
        before (:func:`fleet.run_charges.charge_run_parts`: no episode, run costs, not an agent's), once across
        orchestrators (:meth:`Journal.take_run_charges`); the ``gpu_job`` records the env writes hold the
        jobs. Returns the run costs charged up to. Call it at the end of a run (after :meth:`close`, the
        active workers stop counting) or whenever the ledger should catch up."""
        from fleet.run_charges import charge_run_parts

        self.recover_torn_charges(ledger)
        costs = self.run_costs()
        charge_run_parts(self.journal, ledger, costs, {"backend": self.name})
        return costs

    def recover_torn_charges(self, ledger: CostLedger) -> int:
        """Write to ``ledger`` each job charge this run dir's journal handed to an episode process that is
        over (closed, or gone: :meth:`fleet.journal.Journal.session_over`) and that the ledger has no record of: a process
        killed between taking the charge (:meth:`fleet.journal.Journal.collect`) and writing it would
        otherwise lose it for good, and its reservation would hold the budget for a day. The record is the
        episode's (``kind="gpu_job"``, its ``episode_id``, ``meta["recovered"]``) and closes the job's
        reservation. Returns how many were written."""
        from ait_env.observe.ledger import CostRecord

        n = 0
        for row in self.journal.torn_charges(self.options.owner_stale_s):
            rec = CostRecord(kind="gpu_job", episode_id=row.episode_id, usd=row.cost_usd, meta={
                "job_id": row.claimant, "backend": self.name, "status": row.result_status or row.status,
                "cache_hit": False, "recovered": True, "journal": str(self.journal.path), "key": row.key})
            if ledger.recover_charge(rec):
                n += 1
                self.dispatch.say(f"{row.claimant}: its charge of ${row.cost_usd:.4f} was taken by episode "
                                  f"{row.episode_id}, which ended before writing it to {ledger.path}: written now")
        return n

    # ------------------------------------------------------------------ keys, payloads, results
    def _key(self, bundle: JobBundle) -> str:
        worker = {"settings": self._worker_json, "executor": self.options.executor,
                  "require_revision": self.options.require_revision}
        nonce = bundle.job_id if self.options.rerun else "0"
        family = bundle.manifest.family
        if family not in self._set_hashes:   # one context per family for the process's life (its seeds are fixed)
            self._set_hashes[family] = self.job_context(family, []).hidden_set_hash
        return f"{job_key(bundle, worker, '', self._set_hashes[family])}:{nonce}"

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

        self.dispatch.track(key, "job", bundle.job_id, bundle.manifest.episode_id, make)
        return JobHandle(job_id=bundle.job_id, backend=self.name, meta={"key": key, "root": str(bundle.root)})

    def wait(self, handle: JobHandle, timeout: float | None = None) -> JobResult:
        """The job's result, once it ended (:meth:`fleet.dispatch.Dispatcher.wait`: by default at most
        :meth:`wait_bound_s`, then the job is ended here, ``infra_failed``)."""
        row, charge = self.dispatch.wait(handle.meta["key"], handle.job_id, timeout)
        return self._result(handle.job_id, row, charge)

    def _check_output(self, kind: str, out: dict[str, Any]) -> str:
        """A completed attempt's handler output: a job's result must validate; baselines it measured go to
        this backend's store. Why it is not a result ("" when it is)."""
        if kind != "job":
            return ""
        try:
            JobResult.model_validate(out["result"])
        except ValueError as exc:
            return f"the worker's result does not validate: {exc}"
        measured = [BaselineEntry.model_validate(e) for e in out.get("baselines") or []]
        if measured:
            self.baselines.put(measured)
        return ""

    def _result(self, job_id: str, row: JournalRow, charge: float | None) -> JobResult:
        """The job's result from its row; ``charge``: its cost when this caller is the one charged (else
        None: served, or charged before)."""
        p = self.name   # runpod_*, skypilot_*: the engine's figures
        timings = {f"{p}_delay_s": row.delay_time_ms / 1000,
                   f"{p}_execution_s": row.execution_time_ms / 1000,
                   f"{p}_attempts": float(row.attempt - row.first_attempt + 1)}
        if row.estimated_usd:
            timings[f"{p}_estimated_usd"] = row.estimated_usd
        if row.status == "completed" and row.result is not None and row.kind == "job":
            res = JobResult.model_validate(row.result["result"])
            served = charge is None
            return res.model_copy(update={
                "job_id": job_id, "backend": self.name, "cost_usd": charge or 0.0, "cache_hit": served,
                "cached_from": res.job_id if served else "", "timings": {**res.timings, **timings}})
        if not row.final:   # the backend was closed while this job was out
            return JobResult(job_id=job_id, backend=self.name, status="infra_failed", timings=timings,
                             error=f"the {self.name} backend was closed while job {row.job_id} was "
                                   f"{row.status}; it keeps running on {self.engine.name} and a new backend on this run "
                                   "dir re-attaches it")
        error = row.error or (row.result or {}).get("result", {}).get("error", "") or f"ended {row.status}"
        return JobResult(job_id=job_id, backend=self.name, status="infra_failed", error=error,
                         cost_usd=charge or 0.0, timings=timings)

    # ------------------------------------------------------------------ baselines and lifecycle
    def measure_baseline(self, family: str, model: str) -> BaselineEntry:
        """The untrained ``model`` on ``family``'s hidden set, measured by a Runpod worker (a request of
        kind "baseline" through the same handler and journal)."""
        spec = {"family": family, "model": model, "settings": self.worker_settings.model_dump(mode="json"),
                "executor": self.options.executor, "hidden_set": self.job_context(family, [model]).hidden_set_hash}
        key = "baseline:" + hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:32] + ":0"
        payload = {"kind": "baseline", "executor": self.options.executor, "family": family, "model": model,
                   "settings": spec["settings"], "require_revision": self.options.require_revision,
                   "timeout_s": self.options.job_timeout_s}
        row = self.dispatch.settle(key, "baseline", f"baseline-{family}-{model}", lambda: payload)
        outcome = (row.result or {}).get("result") or {}
        if row.status != "completed" or outcome.get("status") != "succeeded" or not outcome.get("entry"):
            why = row.error or outcome.get("error") or f"ended {row.status}"
            raise RuntimeError(f"{self.name} could not measure {model} on {family}: {why}")
        return BaselineEntry.model_validate(outcome["entry"])

    def close(self) -> None:
        """Stop the dispatch core and close this orchestrator's session (:meth:`fleet.dispatch.Dispatcher.close`:
        jobs in flight keep running on Runpod and are adopted by the next backend on this run dir, unless
        ``cancel_on_close``), then say what the run cost."""
        if self.closed:
            return
        self.dispatch.close()
        super().close()
        c = self.run_costs()
        est = f"; ${c.estimated:.4f} of it estimated at bounds (python -m {self.reconcile_module} --correct)" \
            if c.estimated and self.reconcile_module == "fleet.reconcile" else \
            (f"; ${c.estimated:.4f} of it estimated at bounds" if c.estimated else "")
        self.dispatch.say(f"run costs so far: ${c.total:.4f} (jobs ${c.jobs:.4f}, idle <= ${c.idle:.4f}, active "
                           f"workers ${c.active:.4f} over {c.wall_s:.0f} s{est}); check them: python -m "
                           f"{self.reconcile_module} --runs-dir {self.runs_dir}")
