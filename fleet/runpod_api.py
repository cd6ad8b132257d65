"""One small client for Runpod Serverless: the job API of a queue-based endpoint, and the transport and errors
it shares with endpoint management (:mod:`fleet.runpod_management`).

Contract
--------
- :class:`ServerlessClient` (one endpoint's job API, ``https://api.runpod.ai/v2/<endpoint_id>/...``):
  ``run(input) -> job id``, ``status(id) -> RunpodJob``, ``status_many(ids)``, ``stream(id)``,
  ``cancel(id)``, ``retry(id)``, ``health() -> dict``, ``purge_queue() -> dict``. Thread-safe: one
  ``httpx.Client`` (a keep-alive connection pool) shared by every thread.
- :class:`ManagementClient` (REST API v2, ``https://api.runpod.io/v2/serverless``): list, find by name,
  create or update from an :class:`EndpointSpec`, set workers, list workers, delete; and
  :meth:`ManagementClient.billing`, the Serverless billing history (``GET /v2/billing/serverless``).
- Errors: :class:`RunpodAPIError` (HTTP status, a short body, and what to fix); :class:`ResultExpired`
  (a 404 on ``status``/``stream``: the job is gone, see below); :class:`SubmitUncertain` (``run`` got no
  clear answer: the job may or may not be queued).
- Retries: 408, 429, 5xx and connection errors are retried with exponential backoff and full jitter, honouring
  ``Retry-After``, within :class:`RetryPolicy` (attempts and seconds). Other 4xx are raised at once.
  ``run`` is not idempotent (a repeated ``POST /run`` queues and bills a second job), so it is retried only
  when the request surely did not create a job (429, connection refused); a 5xx or a read timeout on
  ``run`` raises :class:`SubmitUncertain` unless the caller passes ``retry_ambiguous=True``.

Runpod facts relied on (stored copies: runpod/docs a900806e of 2026-08-20; runpod-python 1.12.0)
-----------------------------------------------------------------------------------------------
- Job routes and JSON: docs ``serverless/endpoints/operation-reference.mdx``: ``POST /run``
  (``{"input": ...}`` -> ``{"id", "status"}``), ``GET /status/<id>`` (``id, status, delayTime,
  executionTime, output``; ``workerId`` is not in that page's example but in the same job response of
  ``public-endpoints/models/flux-dev.mdx``), ``GET /stream/<id>`` (``{"status", "stream":
  [{"output": ...}]}``, runpod-python ``endpoint/runner.py::Job.stream``), ``POST /cancel/<id>``
  (``{"id", "status": "CANCELLED"}``),
  ``POST /retry/<id>`` (FAILED or TIMED_OUT jobs only, same id, ``{"id", "status": "IN_QUEUE"}``),
  ``GET /health`` (``{"jobs": {completed, failed, inProgress, inQueue, retried}, "workers": {idle,
  running, ...}}``), ``POST /purge-queue`` (``{"removed", "status"}``; queued jobs only).
  States: IN_QUEUE, IN_PROGRESS, COMPLETED, FAILED, CANCELLED, TIMED_OUT (``job-states.mdx``; its
  ``RUNNING`` is a doc bug, runpod/docs#511).
- **Expiry**: results of ``/run`` are kept 30 minutes after completion (operation-reference, ``/retry``
  note; ``send-requests.mdx`` "Result retention"); "If TTL expires ... status checks return 404"
  (``send-requests.mdx``, "TTL vs. execution timeout"). The body of that 404 is not documented; any 404
  on a job route is :class:`ResultExpired` (the caller's journal knows whether it submitted that id).
- **Progress**: the worker's ``progress_update(job, msg)`` posts ``{"status": "IN_PROGRESS", "output":
  msg}`` to the job's result URL (runpod-python ``serverless/modules/rp_progress.py``), and "Progress
  updates will be available when the job status is polled" (``workers/handler-functions.mdx``). So the
  client sees the *latest* progress message as ``output`` of an IN_PROGRESS status
  (:attr:`RunpodJob.progress`), not a history; ``/stream`` carries only a generator handler's yields.
- Authentication: ``Authorization: Bearer <key>`` (runpod-python ``endpoint/runner.py::RunPodClient``).
  ``/run`` payloads are limited to 10 MB (operation-reference). No batched status route exists, hence
  :meth:`ServerlessClient.status_many` (parallel single calls on the pooled connections).
- **Why not ``runpod.Endpoint``** (runpod-python 1.12.0 ``endpoint/runner.py``): its retry adapter is
  mounted for ``http://`` only (none on ``https://``, i.e. none against Runpod), covers 408/429 and not
  5xx; ``Job.status()`` returns the state string only (no delayTime, executionTime, workerId, output of a
  running job); it has no ``retry``; it reads the key from ``runpod.api_key``, not ``RUNPOD_API_KEY``;
  and importing ``runpod`` takes ~3 s and is not installed in this project's main venv. The base URL
  default and its variable follow it: ``RUNPOD_ENDPOINT_BASE_URL``, else ``https://api.runpod.ai/v2``
  (``runpod/__init__.py``).
- Endpoint management (REST v2) and the billing history: :mod:`fleet.runpod_management`.
Not verified against a live account (there is none here): how soon a bucket's billing is complete
and whether its ``gpuAmount`` covers idle and active worker time as the pricing page says, the 404
body, ``workerId`` in ``/status`` of a queue-based endpoint, rate limits of the job API, whether v2
keeps the pool order as a priority.
"""

from __future__ import annotations

import email.utils
import math
import os
import random
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field, model_validator

DEFAULT_JOB_BASE_URL = "https://api.runpod.ai/v2"
JOB_BASE_ENV = "RUNPOD_ENDPOINT_BASE_URL"        # the SDK's variable (runpod/__init__.py)
API_KEY_ENV = "RUNPOD_API_KEY"

JobState = Literal["IN_QUEUE", "IN_PROGRESS", "COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT"]
FINAL_STATES: frozenset[str] = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT"})
RESULT_RETENTION_S = 30 * 60   # results of /run, after completion (operation-reference.mdx)
MAX_RUN_PAYLOAD_BYTES = 10 * 2**20


# ---------------------------------------------------------------------------------------------- errors
class RunpodAPIError(RuntimeError):
    """A Runpod call failed: ``status`` (HTTP status, 0 for no answer), ``body`` (the first 500
    characters of the answer), ``method`` and ``path`` (never the key)."""

    def __init__(self, message: str, status: int = 0, body: str = "", method: str = "",
                 path: str = "", retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.status, self.body, self.method, self.path = status, body, method, path
        #: the answer's ``Retry-After`` in seconds (a 429 or 503 past the client's retry time), else None
        self.retry_after_s = retry_after_s


class ResultExpired(RunpodAPIError):
    """``status``/``stream`` of a job answered 404: its result is gone (kept 30 minutes after completion
    for ``/run``; deleted at once when the job's TTL runs out) or the id was never this endpoint's."""


class SubmitUncertain(RunpodAPIError):
    """A non-idempotent call (``run``, an endpoint create) got a 5xx or no answer after sending: it may
    have taken effect (a job queued and billed, an endpoint created) or not. Look before sending it again
    (``health``'s counts; :meth:`ManagementClient.find` for an endpoint)."""


def _hint(status: int) -> str:
    return {
        401: f"check {API_KEY_ENV}: the key is missing, wrong or revoked (console: Settings > API Keys)",
        403: "the key lacks access to this resource: give it Serverless read/write, or use the owner's key",
        404: "unknown endpoint or job id: check the endpoint id (python -m fleet.endpoint status)",
        400: "the request does not validate: read the body for the field to fix",
        402: "insufficient balance: add credit before retrying",
        413: f"payload too large: /run takes {MAX_RUN_PAYLOAD_BYTES // 2**20} MB at most",
        422: "the request does not validate: read the body for the field to fix",
        429: "rate limited past the retry budget: poll less often or raise RetryPolicy",
    }.get(status, "a server error past the retry budget: retry later" if status >= 500 else "")


# ---------------------------------------------------------------------------------------------- models
#: how long ``ServerlessClient.run`` waits for ``/run``'s answer: Runpod's HTTP proxy (Cloudflare) ends a
#: request after 100 s (524), so no answer comes later; a shorter wait would abandon a job that was queued and
#: answered late, which then can be neither read nor cancelled (it has no id here) and is charged at its bound
RUN_READ_TIMEOUT_S = 100.0


class RetryPolicy(BaseModel):
    """Exponential backoff with full jitter for 429, 5xx and connection errors: at most ``attempts``
    tries and ``max_seconds`` in all; a ``Retry-After`` header sets the wait (capped by the budget)."""

    model_config = ConfigDict(frozen=True)

    attempts: int = Field(6, ge=1)
    max_seconds: float = Field(60.0, ge=0)
    base_s: float = Field(0.25, gt=0)
    cap_s: float = Field(10.0, gt=0)

    def delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return max(0.0, retry_after)
        return random.uniform(0, min(self.cap_s, self.base_s * 2 ** attempt))


def reported_ms(value: Any) -> tuple[int | None, str]:
    """A billing duration as Runpod reports it (``delayTime``/``executionTime``, ms) -> (ms, problem): a finite,
    non-negative number (or a numeric string) is taken, rounded up to a whole ms; anything else gives
    ``None`` and says what it was (missing is ``(None, "")``). Never raises: the caller bills a bound."""
    if value is None:
        return None, ""
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None, f"not a number ({value[:40]!r})"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None, f"not a number ({type(value).__name__})"
    if isinstance(value, float) and not math.isfinite(value):   # an int of any size is finite (isfinite
        return None, f"not finite ({value})"                     # would overflow on a 400-digit one)
    if value < 0:
        return None, f"negative ({value})"
    return int(math.ceil(value)), ""



class RunpodJob(BaseModel):
    """A job's status as ``/status/<id>`` returns it. Unknown fields are kept (``model_extra``)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    id: str
    status: str
    output: Any = None
    error: Any = None
    delay_time_ms: int | None = Field(None, alias="delayTime")
    execution_time_ms: int | None = Field(None, alias="executionTime")
    worker_id: str | None = Field(None, alias="workerId")
    #: billing fields that were present but unusable (not a number, negative, not finite): they are read as
    #: missing, and the dispatcher charges the attempt's bound (fleet.billing.billing_problem)
    billing_notes: list[str] = Field(default_factory=list, exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _lenient_billing(cls, data: Any) -> Any:
        """A status is never refused for its billing fields (Runpod's answer is untrusted input)."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        notes = list(data.pop("billing_notes", None) or [])
        for alias, name in (("delayTime", "delay_time_ms"), ("executionTime", "execution_time_ms")):
            key = alias if alias in data else name if name in data else None
            if key is None:
                continue
            ms, problem = reported_ms(data[key])
            data[key] = ms
            if problem:
                notes.append(f"{alias} {problem}")
        worker = data.get("workerId", data.get("worker_id"))
        if worker is not None and not isinstance(worker, str):
            data["workerId" if "workerId" in data else "worker_id"] = str(worker)
        data["billing_notes"] = notes
        return data

    @property
    def final(self) -> bool:
        return self.status in FINAL_STATES

    @property
    def progress(self) -> Any:
        """The latest ``progress_update`` message while IN_PROGRESS (Runpod shows it as ``output``)."""
        return self.output if self.status == "IN_PROGRESS" else None


# ------------------------------------------------------------------------------------------- transport
def _retry_after(resp: httpx.Response) -> float | None:
    """The answer's ``Retry-After`` in seconds (delay-seconds or an HTTP date), None when absent or not a
    finite, non-negative figure."""
    value = resp.headers.get("Retry-After")
    if not value:
        return None
    try:
        seconds = float(value)
        return seconds if math.isfinite(seconds) and seconds >= 0 else None
    except ValueError:
        pass
    try:   # an HTTP date (RFC 9110 allows both forms)
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


class _Http:
    """The shared transport: one pooled ``httpx.Client``, bearer auth, the retry loop."""

    def __init__(self, base_url: str, api_key: str, retry: RetryPolicy, timeout_s: float,
                 max_connections: int, transport: httpx.BaseTransport | None = None) -> None:
        if not api_key:
            raise RunpodAPIError(f"no Runpod API key: set {API_KEY_ENV} (console: Settings > API Keys)")
        self.retry = retry
        self.client = httpx.Client(
            base_url=base_url.rstrip("/"), timeout=timeout_s, transport=transport,
            headers={"Authorization": f"Bearer {api_key}", "Accept": "application/json"},
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections))

    def request(self, method: str, path: str, *, json: Any = None, params: Mapping[str, Any] | None = None,
                idempotent: bool = True, retry: RetryPolicy | None = None,
                read_timeout_s: float | None = None) -> httpx.Response:
        """Send with retries; return a 2xx response, raise :class:`RunpodAPIError` otherwise.
        ``read_timeout_s``: how long to wait for this call's answer (else the client's timeout)."""
        policy = retry or self.retry
        start, attempt = time.monotonic(), 0
        timeout: Any = httpx.USE_CLIENT_DEFAULT
        if read_timeout_s is not None:
            base = self.client.timeout
            timeout = httpx.Timeout(base.connect, read=read_timeout_s, write=base.write, pool=base.pool)
        while True:
            wait: float | None = None
            try:
                resp = self.client.request(method, path, json=json, params=params, timeout=timeout)
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as e:   # nothing was sent
                err: RunpodAPIError = RunpodAPIError(f"{method} {path}: cannot connect ({e})", 0, "",
                                                     method, path)
            except httpx.TransportError as e:    # sent, no clear answer
                cls = RunpodAPIError if idempotent else SubmitUncertain
                err = cls(f"{method} {path}: no answer ({type(e).__name__}: {e})", 0, "", method, path)
                if not idempotent:
                    raise err from e
            else:
                if resp.status_code < 400:
                    return resp
                err = self._error(resp, method, path)
                if resp.status_code not in (408, 429) and resp.status_code < 500:
                    raise err
                if resp.status_code >= 500 and not idempotent:
                    raise SubmitUncertain(f"{err} (it may have taken effect, e.g. a job may be queued: look "
                                          "before sending it again)", err.status, err.body, method, path)
                wait = _retry_after(resp) if resp.status_code in (429, 503) else None
                err.retry_after_s = wait
            attempt += 1
            delay = policy.delay(attempt - 1, wait)
            if attempt >= policy.attempts or time.monotonic() - start + delay > policy.max_seconds:
                raise err   # a Retry-After longer than the time left: the caller waits it (retry_after_s)
            time.sleep(delay)

    @staticmethod
    def _error(resp: httpx.Response, method: str, path: str) -> RunpodAPIError:
        body = resp.text[:500]
        hint = _hint(resp.status_code)
        msg = f"{method} {path}: HTTP {resp.status_code}" + (f": {body}" if body else "")
        msg += f" — {hint}" if hint else ""
        return RunpodAPIError(msg, resp.status_code, body, method, path)

    def close(self) -> None:
        self.client.close()


# ------------------------------------------------------------------------------------------ the job API
class ServerlessClient:
    """The job API of one queue-based endpoint. ``base_url`` defaults to ``$RUNPOD_ENDPOINT_BASE_URL`` or
    ``https://api.runpod.ai/v2`` (the endpoint id is appended). Thread-safe; close it (or use ``with``)."""

    def __init__(self, endpoint_id: str, api_key: str, base_url: str | None = None, *,
                 retry: RetryPolicy | None = None, timeout_s: float = 10.0, max_connections: int = 64,
                 transport: httpx.BaseTransport | None = None, job_retry: RetryPolicy | None = None,
                 run_timeout_s: float = RUN_READ_TIMEOUT_S) -> None:
        """``retry``: the policy of every call; ``job_retry``: the one of ``status``/``stream``/``cancel``/
        ``retry`` when given (a caller that backs off by itself keeps them short); ``run_timeout_s``: how long
        ``run`` waits for ``/run``'s answer (a job queued and answered late is not lost as one abandoned)."""
        self.run_timeout_s = run_timeout_s
        if not endpoint_id or "/" in endpoint_id:
            raise ValueError(f"endpoint id {endpoint_id!r}: expected an id as fleet.endpoint status shows it")
        self.endpoint_id = endpoint_id
        self._job_retry = job_retry
        base = base_url or os.environ.get(JOB_BASE_ENV) or DEFAULT_JOB_BASE_URL
        self._http = _Http(f"{base.rstrip('/')}/{endpoint_id}", api_key, retry or RetryPolicy(), timeout_s,
                           max_connections, transport)

    def __enter__(self) -> ServerlessClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def run(self, input: dict[str, Any], *, execution_timeout_s: float | None = None,
            ttl_s: float | None = None, webhook: str | None = None, retry_ambiguous: bool = False) -> str:
        """Queue a job (``POST /run``); returns its id. ``execution_timeout_s``/``ttl_s`` become the
        request's ``policy`` (``executionTimeout``/``ttl`` in ms, send-requests.mdx). See the module
        docstring for when a failed submit is retried."""
        body: dict[str, Any] = {"input": input}
        policy = {k: int(v * 1000) for k, v in (("executionTimeout", execution_timeout_s), ("ttl", ttl_s))
                  if v is not None}
        if policy:
            body["policy"] = policy
        if webhook:
            body["webhook"] = webhook
        data = self._http.request("POST", "/run", json=body, idempotent=retry_ambiguous,
                                  read_timeout_s=self.run_timeout_s).json()
        if not isinstance(data, dict) or not data.get("id"):
            raise SubmitUncertain(f"POST /run: no job id in the answer {str(data)[:200]!r}", 200,
                                  str(data)[:500], "POST", "/run")
        return str(data["id"])

    def _job(self, method: str, route: str, job_id: str) -> httpx.Response:
        try:
            return self._http.request(method, f"/{route}/{job_id}", retry=self._job_retry)
        except RunpodAPIError as e:
            if e.status == 404:
                raise ResultExpired(f"job {job_id}: 404 on /{route} — its result expired (kept "
                                    f"{RESULT_RETENTION_S // 60} min after completion, or its TTL ran out) "
                                    "or it is not this endpoint's", 404, e.body, method, e.path) from e
            raise

    def status(self, job_id: str) -> RunpodJob:
        """``GET /status/<id>``. Raises :class:`ResultExpired` on 404."""
        return RunpodJob.model_validate(self._job("GET", "status", job_id).json())

    def status_many(self, job_ids: Iterable[str],
                    max_workers: int = 32) -> dict[str, RunpodJob | RunpodAPIError]:
        """Status of many jobs in parallel over the pooled connections (Runpod has no batch route); each
        value is the job or the error its call raised."""
        ids = list(dict.fromkeys(job_ids))

        def one(job_id: str) -> RunpodJob | RunpodAPIError:
            try:
                return self.status(job_id)
            except RunpodAPIError as e:
                return e

        if len(ids) <= 1:
            return {i: one(i) for i in ids}
        with ThreadPoolExecutor(max_workers=min(max_workers, len(ids))) as pool:
            return dict(zip(ids, pool.map(one, ids)))

    def stream(self, job_id: str) -> list[Any]:
        """``GET /stream/<id>``: the outputs a generator handler yielded since the last call (each item's
        ``output``). Our handler is not a generator: its progress is :attr:`RunpodJob.progress`."""
        data = self._job("GET", "stream", job_id).json()
        return [item.get("output") if isinstance(item, dict) else item for item in data.get("stream") or []]

    def cancel(self, job_id: str) -> RunpodJob:
        """``POST /cancel/<id>``: removes a queued job, stops a running one."""
        return RunpodJob.model_validate(self._job("POST", "cancel", job_id).json())

    def retry(self, job_id: str) -> RunpodJob:
        """``POST /retry/<id>``: requeue a FAILED or TIMED_OUT job under the same id."""
        return RunpodJob.model_validate(self._job("POST", "retry", job_id).json())

    def health(self) -> dict[str, Any]:
        """``GET /health``: ``{"jobs": {completed, failed, inProgress, inQueue, retried},
        "workers": {idle, running, ...}}``."""
        return self._http.request("GET", "/health").json()

    def purge_queue(self) -> dict[str, Any]:
        """``POST /purge-queue``: drop every queued job (running ones continue); ``{"removed", "status"}``."""
        return self._http.request("POST", "/purge-queue").json()
