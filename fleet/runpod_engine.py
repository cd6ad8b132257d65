"""Runpod Serverless as a dispatch engine (:class:`fleet.dispatch.Engine`): one queue-based endpoint's job
API (:class:`fleet.runpod_api.ServerlessClient`) and what its attempts cost.

- **Send**: ``POST /run`` with the attempt's ``policy``: ``executionTimeout`` (the worker's limit plus
  :data:`fleet.dispatch.WORKER_OVERHEAD_S`) and ``ttl`` (the deadline plus ``ttl_margin_s``: "Total lifespan
  of the job ... When TTL expires, the job is deleted regardless of state", runpod/docs a900806e
  ``serverless/endpoints/send-requests.mdx``), clamped to Runpod's limits. A 5xx or no answer after sending
  (:class:`fleet.runpod_api.SubmitUncertain`) is :class:`~fleet.dispatch.SendUncertain`; a 4xx that is ours
  (key, endpoint, payload) is :class:`~fleet.dispatch.SendRefused`; a 429 or no connection past the client's
  retries is :class:`~fleet.dispatch.SendFailed`.
- **Status**: Runpod's job statuses are the dispatch vocabulary; a 404 (result expired, ttl passed) is
  :class:`~fleet.dispatch.AttemptGone`. ``status_many`` is used when the client has it.
- **Bills** (:func:`fleet.billing.attempt_billing`), the dearest rate an attempt may be billed at (the
  endpoint's pools, ``gpu_type``) and the run costs' settings (:class:`fleet.billing.EndpointCosts`: the
  idle timeout, workers, GPUs and pools, read from the endpoint, REST v2 ``GET /serverless/<id>``, when this
  engine built its own client, else from ``options``, else from ``fleet/fleet_defaults.yaml``).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from fleet.billing import EndpointCosts, Limits, ManagementLike, RunpodJobStatus, ServerlessClientLike, attempt_billing
from fleet.dispatch import AttemptGone, SendFailed, SendRefused, SendUncertain
from fleet.journal import Billing, Session, this_owner
from fleet.runpod_api import ResultExpired, RunpodAPIError, SubmitUncertain
from fleet.settings import RunpodOptions

if TYPE_CHECKING:
    from fleet.runpod_management import ManagementClient

_log = logging.getLogger(__name__)
#: Runpod's per-request policy limits (runpod/docs a900806e, send-requests.mdx: executionTimeout "Min 5
#: sec, max 7 days", ttl "Min 10 sec, max 7 days")
_EXEC_MIN_S, _TTL_MIN_S, _POLICY_MAX_S = 5.0, 10.0, 7 * 86400.0


class RunpodEngine:
    """One Runpod Serverless endpoint as a :class:`fleet.dispatch.Engine` (see the module docstring)."""

    name = "runpod"
    #: the longest a run call can queue its job after it was recorded: its retries
    #: (fleet.runpod_api.RetryPolicy.max_seconds, 60 s) plus the last call's wait for its answer
    #: (fleet.runpod_api.RUN_READ_TIMEOUT_S, 100 s) plus a second
    send_retry_s = 161.0
    #: how long after its end Runpod still answers an attempt's status: a /run result is kept 30 minutes
    #: (runpod docs, serverless/endpoints/send-requests.mdx, "Result retention")
    status_kept_s = 1800.0

    def __init__(self, options: RunpodOptions, client: ServerlessClientLike | None = None,
                 management: ManagementLike | None = None) -> None:
        """``client``/``management``: stand-ins for Runpod (tests, the simulator); without them the engine
        builds its own from ``$RUNPOD_API_KEY`` and the endpoint id, and reads the endpoint's settings."""
        self.options = options
        self.client = client if client is not None else self._make_client()
        made = self._make_management() if management is None and client is None and \
            options.read_endpoint else None
        try:
            self.endpoint_costs = self._endpoint_costs(management or made)
        finally:
            if made is not None:
                made.close()

    @property
    def idle_timeout_s(self) -> float:
        return self.endpoint_costs.idle_timeout_s

    @property
    def workers_max(self) -> int:
        return self.endpoint_costs.workers_max

    # ------------------------------------------------------------------ setup
    def _endpoint_id(self) -> str | None:
        return getattr(self.client, "endpoint_id", None) or self.options.endpoint_id or \
            os.environ.get("RUNPOD_ENDPOINT_ID")

    def rest_base_url(self) -> str:
        """Where the REST v2 API (the endpoint's settings) is read: ``rest_base_url``, else
        ``$AIT_RUNPOD_REST_BASE_URL``, else the job API's base URL when it was overridden (``base_url`` or
        ``$RUNPOD_ENDPOINT_BASE_URL``: a fake or a proxy serves both), else Runpod's REST host."""
        from fleet.runpod_api import JOB_BASE_ENV
        from fleet.runpod_management import DEFAULT_REST_BASE_URL, REST_BASE_ENV

        return (self.options.rest_base_url or os.environ.get(REST_BASE_ENV) or self.options.base_url
                or os.environ.get(JOB_BASE_ENV) or DEFAULT_REST_BASE_URL)

    def _make_management(self) -> "ManagementClient | None":
        key = os.environ.get("RUNPOD_API_KEY")
        if not key:
            return None
        from fleet.runpod_api import RetryPolicy
        from fleet.runpod_management import ManagementClient

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
                             "created by the endpoint tool: python -m fleet.endpoint up (docs/fleet.md)")
        from fleet.runpod_api import RetryPolicy, ServerlessClient

        # status and cancel: a short retry budget; the backend backs off and retries them itself, so one
        # status outage never holds the poller for the client's minute of retries
        return ServerlessClient(endpoint, key, base_url=self.options.base_url,
                                job_retry=RetryPolicy(attempts=2, max_seconds=5.0))

    # ------------------------------------------------------------------ the Engine protocol
    def session(self, session_id: str, started: float) -> Session:
        """This orchestrator's journal session: what its active workers cost while it is open."""
        ec = self.endpoint_costs
        return Session(id=session_id, owner=this_owner(), endpoint_id=self._endpoint_id() or "", started=started,
                       heartbeat=started, workers_min=ec.workers_min, gpus_per_worker=ec.gpus_per_worker,
                       pool=ec.pool, active_usd_per_s=ec.workers_min * ec.gpus_per_worker * ec.active_usd_per_gpu_s,
                       idle_timeout_s=ec.idle_timeout_s, source=ec.source)

    def send(self, body: dict[str, Any], limits: Limits) -> str:
        """``POST /run`` of one attempt with its policy (see the module docstring for what a failure means)."""
        try:
            return self.client.run(body, execution_timeout_s=min(max(limits.execution_s, _EXEC_MIN_S), _POLICY_MAX_S),
                                   ttl_s=min(max(limits.bound_s, _TTL_MIN_S), _POLICY_MAX_S))
        except SubmitUncertain as exc:
            raise SendUncertain(str(exc)) from exc
        except RunpodAPIError as exc:
            status = getattr(exc, "status", 0) or 0
            if status and status < 500 and status != 429:  # ours: bad key, payload too large, no endpoint
                raise SendRefused(f"Runpod refused the job ({exc}); check RUNPOD_API_KEY, the endpoint id and "
                                  "the payload size (10 MB for /run)") from exc
            # surely not queued (429, no connection: fleet.runpod_api raises SubmitUncertain otherwise)
            raise SendFailed(f"the run call failed after the client's retries: {exc}",
                             getattr(exc, "retry_after_s", None)) from exc
        except OSError as exc:
            raise SendFailed(f"the run call failed: {type(exc).__name__}: {exc}") from exc

    @staticmethod
    def _gone(answer: Any) -> Any:
        if isinstance(answer, ResultExpired):
            return AttemptGone(f"Runpod keeps /run results 30 minutes: {answer}")
        return answer

    def statuses(self, ids: list[str]) -> dict[str, Any]:
        """The status of each id, or the error its read raised (a 404: :class:`~fleet.dispatch.AttemptGone`)."""
        many = getattr(self.client, "status_many", None)
        if many is not None and len(ids) > 1:
            return {i: self._gone(a) for i, a in dict(many(ids)).items()}
        out: dict[str, Any] = {}
        for i in ids:
            try:
                out[i] = self.client.status(i)
            except Exception as exc:  # noqa: BLE001 - the dispatcher backs off and its deadline decides
                out[i] = self._gone(exc)
        return out

    def read(self, job_id: str) -> RunpodJobStatus | None:
        """One status, or None when it cannot be read."""
        try:
            return self.client.status(job_id)
        except (RunpodAPIError, OSError):
            return None

    def find(self, tag: str) -> str | None:
        """None: a Serverless endpoint cannot list its jobs (``/run``, ``/status/{id}``, ``/cancel/{id}`` are
        all by id), so an attempt whose id was lost cannot be found again by its tag."""
        return None

    def cancel(self, job_id: str) -> bool:
        """Cancel a job on Runpod; True when Runpod answered (it is cancelled, or already gone: 404). Other
        errors propagate (the dispatcher retries)."""
        try:
            self.client.cancel(job_id)
        except ResultExpired:
            return True
        return True

    def bill(self, st: RunpodJobStatus | None, worker: dict[str, Any] | None = None) -> Billing:
        """The bill of one attempt (:func:`fleet.billing.attempt_billing`, the one place it is computed)."""
        ec = getattr(self, "endpoint_costs", None)
        o, idle = self.options, ec.idle_timeout_s if ec is not None else 0.0
        return attempt_billing(st, worker, prices=o.prices, gpu_type=o.gpu_type,
                               gpus_per_worker=o.gpus_per_worker, idle_timeout_s=idle)

    def bound_rate(self) -> float:
        """$/s of one worker at the dearest rate it may be billed: the dearest of the endpoint's pools (or
        of ``gpu_type``) x GPUs per worker."""
        from fleet import prices

        o = self.options
        rates = [o.prices.price(o.gpu_type)]
        rates += [prices.FLEX_USD_PER_S[p] for p in self.endpoint_costs.pools if p in prices.FLEX_USD_PER_S]
        return max(rates) * max(self.endpoint_costs.gpus_per_worker, o.gpus_per_worker)

    def bound_gpus(self) -> tuple[str, int]:
        """The GPU type and GPUs a bound bill is recorded with."""
        return self.options.gpu_type, max(self.endpoint_costs.gpus_per_worker, self.options.gpus_per_worker)
