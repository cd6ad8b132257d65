"""Runpod Serverless endpoint management over REST API v2 (``https://api.runpod.io/v2/serverless``):
:class:`EndpointSpec` (what ``python -m fleet.endpoint up`` deploys), :class:`ManagementClient` (list, find by
name, create or update, set workers, list workers, delete; :meth:`ManagementClient.billing`, the Serverless
billing history), :func:`upsert_endpoint` and :func:`delete_endpoint`. The transport, retries and errors are
the job API's (:mod:`fleet.runpod_api`).

Runpod facts relied on (stored copies: runpod/docs a900806e of 2026-08-20; runpod-python 1.12.0)
-----------------------------------------------------------------------------------------------
- **Why REST v2 for management** (docs ``api-reference-v2/openapi.json``, ``migrate-from-v1.mdx``):
  REST v1 (``rest.runpod.io/v1``) "is deprecated and will be retired on November 15, 2026"; the SDK's
  GraphQL helpers (``api/ctl_commands.py``) can create a template and an endpoint but cannot delete an
  endpoint or change its workers, and build their queries by string interpolation without escaping
  (``api/mutations/templates.py``: an env value with a quote breaks the query). v2 takes the container
  directly on the endpoint (``image``, ``env``, ``disk``: no separate template), ``gpu: {pools, count}``,
  ``workers: {min, max, idleTimeout}``, ``timeout`` (ms), ``flashboot``, ``networkVolumes``; ``DELETE
  /v2/serverless/{id}`` "permanently deletes a serverless endpoint and its bound template ... all workers
  are terminated". The GraphQL page (``sdks/graphql/manage-endpoints.mdx``) requires min and max workers
  at 0 before ``deleteEndpoint``; v2 states no such rule, and :func:`delete_endpoint` scales to 0 first
  anyway. Errors are RFC 9457 objects ``{title, status, detail, errors}``; a 429 carries ``Retry-After``
  in seconds (openapi ``TooManyRequestsError``).
- GPU selection: v2 takes serverless **pool** ids (``AMPERE_24``, ``ADA_24``, ``AMPERE_48``,
  ``ADA_48_PRO``, ``AMPERE_80``, ``ADA_80_PRO``, ``HOPPER_141``; ``references/gpu-types.mdx``), "workers
  are placed on whichever listed pool has capacity"; the console's "up to three GPU types in priority
  order" (``endpoint-configurations.mdx``) is kept as the order of :attr:`EndpointSpec.gpu_type_ids`.
- **Billing** (``api-reference-v2/openapi.json``, operation ``listServerlessBilling``, ``GET
  /v2/billing/serverless``): query ``startTime``/``endTime`` (RFC 3339; start "snapped down" and end
  "snapped up" to bucket boundaries, end exclusive; defaults 30 days ago / now), ``bucketSize`` (``hour``,
  ``day`` (default), ``week``, ``month``, ``year``), ``lastN`` (exclusive with the times) and
  ``serverlessId`` ("Filter to a specific serverless endpoint"; without it "one record is emitted per
  serverless endpoint per bucket"). Answer ``{"records": [{startTime, endTime, serverlessId, totalAmount,
  gpuAmount, cpuAmount, diskAmount, feeAmount}], "metadata": {query, recordCount, totals,
  uniqueServerlessCount}}``, amounts in USD. Not to be confused with ``GET /v2/billing/endpoints``, which
  is Runpod's *public* endpoints (``listEndpointBilling``). REST v1's ``GET /billing/endpoints``
  (``api-reference/openapi.json``, ``EndpointBilling``: ``endpointId``, ``grouping``, records ``amount``,
  ``timeBilledMs``, ``diskSpaceBilledGb``, ``time``) retired with v1 on 2026-11-15 and is not used.
"""

from __future__ import annotations

import os
import time
from datetime import datetime, timezone
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field, field_validator

from fleet.runpod_api import RetryPolicy, RunpodAPIError, _Http

DEFAULT_REST_BASE_URL = "https://api.runpod.io/v2"
REST_BASE_ENV = "AIT_RUNPOD_REST_BASE_URL"        # ours: the SDK has none for REST v2
BucketSize = Literal["hour", "day", "week", "month", "year"]
BUCKET_SIZES: tuple[str, ...] = ("hour", "day", "week", "month", "year")   # openapi BillingBucketSize


class EndpointSpec(BaseModel):
    """What ``python -m fleet.endpoint up`` deploys: a queue-based endpoint running the worker image."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=191)
    image: str = Field(min_length=1)
    #: serverless GPU pool ids in priority order (v2 ``gpu.pools``: AMPERE_24, ADA_24, AMPERE_48, ...)
    gpu_type_ids: list[str] = Field(min_length=1, max_length=3)
    #: GPU type ids subtracted from those pools (v2 ``gpu.excludedTypes``)
    excluded_gpu_types: list[str] = Field(default_factory=list)
    gpu_count: int = Field(1, ge=1)
    workers_min: int = Field(0, ge=0)
    workers_max: int = Field(3, ge=0)
    idle_timeout_s: int = Field(5, ge=1, le=3600)
    execution_timeout_s: int = Field(600, ge=5, le=7 * 86400)
    flashboot: bool = True
    network_volume_id: str | None = None
    #: the worker's environment: no secret values, only Runpod secret references such as
    #: ``{"AIT_SECRETS_JSON": "{{ RUNPOD_SECRET_ait_seeds }}"}``
    env: dict[str, str] = Field(default_factory=dict)
    container_disk_gb: int = Field(20, ge=1)
    queue_delay_s: float = Field(4.0, ge=0.5)
    allowed_cuda_versions: list[str] = Field(default_factory=list)

    @field_validator("env")
    @classmethod
    def _no_secret_values(cls, env: dict[str, str]) -> dict[str, str]:
        bad = [k for k, v in env.items() if _looks_secret(k) and "RUNPOD_SECRET_" not in v]
        if bad:
            raise ValueError(f"env {bad}: a credential-like variable must be a Runpod secret reference "
                             "('{{ RUNPOD_SECRET_<name> }}'), never a value in the endpoint's config")
        return env

    def body(self) -> dict[str, Any]:
        """The REST v2 ``CreateEndpointRequest`` / ``UpdateEndpointRequest`` body."""
        gpu: dict[str, Any] = {"pools": list(self.gpu_type_ids), "count": self.gpu_count}
        if self.excluded_gpu_types:
            gpu["excludedTypes"] = list(self.excluded_gpu_types)
        if self.allowed_cuda_versions:
            gpu["allowedCudaVersions"] = list(self.allowed_cuda_versions)
        return {"name": self.name, "type": "QUEUE", "image": self.image, "env": dict(self.env),
                "disk": self.container_disk_gb, "gpu": gpu,
                "workers": {"min": self.workers_min, "max": self.workers_max,
                            "idleTimeout": self.idle_timeout_s},
                "scaling": {"type": "QUEUE_DELAY", "queueDelay": self.queue_delay_s},
                "timeout": self.execution_timeout_s * 1000,
                "flashboot": "FLASHBOOT" if self.flashboot else "OFF",
                "networkVolumes": [self.network_volume_id] if self.network_volume_id else []}


_SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL")


def _looks_secret(name: str) -> bool:
    return any(w in name.upper() for w in _SECRET_WORDS)


class ManagementClient:
    """Serverless endpoints through REST API v2 (``/v2/serverless``). ``base_url`` defaults to
    ``$AIT_RUNPOD_REST_BASE_URL`` or ``https://api.runpod.io/v2``."""

    def __init__(self, api_key: str, base_url: str | None = None, *, retry: RetryPolicy | None = None,
                 timeout_s: float = 30.0, transport: httpx.BaseTransport | None = None) -> None:
        base = base_url or os.environ.get(REST_BASE_ENV) or DEFAULT_REST_BASE_URL
        self._http = _Http(base, api_key, retry or RetryPolicy(), timeout_s, 4, transport)

    def __enter__(self) -> ManagementClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def list_endpoints(self) -> list[dict[str, Any]]:
        return list(self._http.request("GET", "/serverless").json().get("endpoints", []))

    def find(self, name: str) -> dict[str, Any] | None:
        """The endpoint called ``name``; an error if several are (remove the extra ones in the console)."""
        found = [e for e in self.list_endpoints() if e.get("name") == name]
        if len(found) > 1:
            raise RunpodAPIError(f"{len(found)} endpoints are named {name!r} ({[e['id'] for e in found]}): "
                                 "delete the extra ones (python -m fleet.endpoint down --id <id>)")
        return found[0] if found else None

    def get(self, endpoint_id: str) -> dict[str, Any]:
        return self._http.request("GET", f"/serverless/{endpoint_id}").json()

    def create(self, spec: EndpointSpec) -> dict[str, Any]:
        return self._http.request("POST", "/serverless", json=spec.body(), idempotent=False).json()

    def update(self, endpoint_id: str, spec: EndpointSpec) -> dict[str, Any]:
        body = {k: v for k, v in spec.body().items() if k != "type"}   # the routing type cannot change
        return self._http.request("PATCH", f"/serverless/{endpoint_id}", json=body).json()

    def set_workers(self, endpoint_id: str, workers_min: int, workers_max: int) -> dict[str, Any]:
        body = {"workers": {"min": workers_min, "max": workers_max}}
        return self._http.request("PATCH", f"/serverless/{endpoint_id}", json=body).json()

    def workers(self, endpoint_id: str) -> dict[str, Any]:
        """``{"workers": [...], "summary": {running, idle, initializing, throttled, unhealthy, total}}``."""
        return self._http.request("GET", f"/serverless/{endpoint_id}/workers").json()

    def delete(self, endpoint_id: str) -> None:
        self._http.request("DELETE", f"/serverless/{endpoint_id}")

    def billing(self, start: datetime, end: datetime, bucket_size: BucketSize = "day",
                serverless_id: str | None = None) -> dict[str, Any]:
        """``GET /v2/billing/serverless``: Serverless spend per bucket in ``[start, end)`` (UTC; Runpod widens
        the window to whole buckets), of one endpoint when ``serverless_id`` is given. Returns the answer as
        it is: ``{"records": [{startTime, endTime, serverlessId, totalAmount, gpuAmount, cpuAmount,
        diskAmount, feeAmount}], "metadata": {...}}`` (see the module docstring)."""
        if bucket_size not in BUCKET_SIZES:
            raise ValueError(f"bucket size {bucket_size!r}: expected one of {BUCKET_SIZES}")
        params = {"startTime": rfc3339(start), "endTime": rfc3339(end), "bucketSize": bucket_size}
        if serverless_id:
            params["serverlessId"] = serverless_id
        data = self._http.request("GET", "/billing/serverless", params=params).json()
        if not isinstance(data, dict) or not isinstance(data.get("records"), list):
            raise RunpodAPIError(f"GET /billing/serverless: no records in the answer {str(data)[:200]!r}",
                                 200, str(data)[:500], "GET", "/billing/serverless")
        return data


def rfc3339(t: datetime) -> str:
    """``t`` in UTC as ``YYYY-MM-DDTHH:MM:SSZ`` (a naive ``t`` is taken as UTC)."""
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(value: str) -> datetime:
    """An RFC 3339 time of a billing record (``...Z`` or an offset) as an aware UTC datetime."""
    t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return (t if t.tzinfo else t.replace(tzinfo=timezone.utc)).astimezone(timezone.utc)


def upsert_endpoint(mgmt: ManagementClient, spec: EndpointSpec) -> tuple[dict[str, Any], bool]:
    """Create the endpoint named ``spec.name`` or update it to ``spec``; ``(endpoint, created)``."""
    existing = mgmt.find(spec.name)
    if existing is None:
        return mgmt.create(spec), True
    return mgmt.update(existing["id"], spec), False


def delete_endpoint(mgmt: ManagementClient, endpoint_id: str, *, wait_s: float = 600.0,
                    poll_s: float = 5.0) -> None:
    """Scale to 0 workers, wait until none is allocated, delete, and check the listing no longer has it.
    Raises :class:`RunpodAPIError` (with what is left) if workers stay past ``wait_s``."""
    mgmt.set_workers(endpoint_id, 0, 0)
    deadline = time.monotonic() + wait_s
    while True:
        summary = mgmt.workers(endpoint_id).get("summary", {})
        if not summary.get("total", 0):
            break
        if time.monotonic() > deadline:
            raise RunpodAPIError(f"endpoint {endpoint_id}: workers {summary} still allocated {wait_s:.0f} s "
                                 "after scaling to 0 (a running job finishes first): run down again later, "
                                 "or purge the queue and cancel its jobs first")
        time.sleep(poll_s)
    mgmt.delete(endpoint_id)
    if any(e.get("id") == endpoint_id for e in mgmt.list_endpoints()):
        raise RunpodAPIError(f"endpoint {endpoint_id} is still listed after DELETE: check the console")
