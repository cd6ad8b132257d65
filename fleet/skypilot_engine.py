"""SkyPilot managed jobs on a pool as a dispatch engine (:class:`fleet.dispatch.Engine`): each attempt is one
managed job launched onto a named pool of identical workers (``sky jobs launch --pool``), through SkyPilot's
Python SDK, pinned at ``skypilot==0.14.1`` (the ``skypilot`` extra). Every SDK call returns a request id
and ``sky.get(request_id)`` waits for its result (``sky/client/sdk.py`` ``get``).

**How a job reaches the worker and its result comes back.** Inline, no bucket, no volume:

- the request (the same :class:`gpu.runpod_handler.HandlerInput` Runpod's handler takes: settings, the packed bundle,
  baselines, tag) is JSON, gzip-compressed and base64-encoded into the task's ``envs`` as
  ``AIT_REQUEST``; the task's ``run`` is ``python -m gpu.worker --request-env AIT_REQUEST``;
- the worker prints the handler's output to the job's log between ``AIT-RESULT-BEGIN`` and ``AIT-RESULT-END
  <sha256>`` markers (gzip + base64, in lines of 4,000 characters), and the engine reads the log with
  ``sky.jobs.tail_logs(job_id=..., follow=False, output_stream=...)`` once SkyPilot says SUCCEEDED.

Why: SkyPilot uploads local file mounts of a managed job to a bucket (its jobs config ``jobs.bucket`` or a
new one per job), which needs cloud storage credentials on top of the GPU infra; the envs and the log need
nothing but the pool. The hidden eval's seeds go as the task's ``secrets`` (``AIT_SECRETS_JSON`` from the
orchestrator's environment, else its private seeds, :func:`ait_env.hidden.secrets.worker_secrets_json`;
SkyPilot redacts secret values in what it shows). Limits: an environment variable passed to a process is at most ``MAX_ARG_STRLEN`` =
131,072 bytes on Linux (``execve(2)``), so the encoded request is capped at ``max_request_bytes`` (100,000
by default; a job's bundle is a few KB packed: ``ait_env.jobs.wire.pack_bundle``); a bigger one is refused
(:class:`~fleet.dispatch.SendRefused`) with how to fix it. The result travels through the log, which has no
size limit in SkyPilot but is kept only as long as the jobs controller keeps the job's log; it is read once
and journaled at once, as Runpod's results are.

**Statuses** (``sky/jobs/state.py`` ``ManagedJobStatus``) map to the dispatch vocabulary: PENDING, STARTING,
SUBMITTED → IN_QUEUE; RUNNING, RECOVERING (SkyPilot re-runs the job on another worker after a preemption
or a lost worker: ``job_recovery``), CANCELLING, WINDING_DOWN → IN_PROGRESS; SUCCEEDED → COMPLETED with the
output read from the log (a SUCCEEDED job without the markers is a COMPLETED without our handler's result,
which the dispatch core retries); FAILED, FAILED_SETUP, FAILED_PRECHECKS, FAILED_NO_RESOURCE,
FAILED_CONTROLLER → FAILED with SkyPilot's ``failure_reason``; CANCELLED → CANCELLED. A job the queue no
longer lists is :class:`~fleet.dispatch.AttemptGone`.

**Sends.** ``sky.jobs.launch(task, name=..., pool=...)`` → ``sky.get`` → ``(job_ids, handle)``. The job's
name carries the attempt's tag (``ait-<tag>``), so a launch whose answer is lost is found again by name
(``queue_v2(name_match=...)``): found, its id is used; not found, the send is
:class:`~fleet.dispatch.SendUncertain` (the launch request may still be queued at the API server). An
unreachable API server (``ApiServerConnectionError``, raised by the SDK's health check before the request is
sent) is :class:`~fleet.dispatch.SendFailed`; a task SkyPilot's parser refuses, a missing pool or a refused
login is :class:`~fleet.dispatch.SendRefused`.

**Bills.** A pool's workers are pods billed per second whether busy or not. Each attempt is charged its
share of the pod time it held: SkyPilot's ``job_duration`` (the job's running time summed over its
recoveries, ``sky/jobs/state.py``), rounded up to a second, x the dated on-demand pod price of the GPU that
ran it (:func:`fleet.prices.pod_price_per_s`, the worker's ``result.worker["gpus"]``, else ``gpu_type``) x
the GPUs the job was given, not the worker's: SkyPilot's scheduler runs two 1-GPU jobs on one 2-GPU worker
(``get_next_cluster_name``, sky/serve/serve_utils.py), so a whole-worker charge would bill that pod twice;
queue wait is not billed to the job (no pod is held for it). The pool's time between jobs is the run's
idle cost: each attempt a worker took carries ``idle_per_job_s`` x the same rate as its ``idle_usd`` (an
estimate: the simulator's idle pod time per job of the default pool, docs/fleet.md) until ``python -m
fleet.reconcile_pool --correct`` replaces it by SkyPilot's own cost report (``sky.cost_report``): the workers'
time up in the run's window minus its jobs, and the run's share of the jobs controller VM.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import logging
import math
import os
from dataclasses import dataclass
from typing import Any, Protocol

from fleet.billing import Limits
from fleet.dispatch import AttemptGone, SendFailed, SendRefused, SendUncertain
from fleet.journal import Billing, Session, this_owner
from fleet.settings import PoolSpec, SkypilotOptions

_log = logging.getLogger(__name__)

INSTALL_HINT = ("the skypilot backend needs SkyPilot's SDK: pip install -e '.[skypilot]' (skypilot==0.14.1), "
                "then `sky api info` / `sky check` for the infra the pool rents on")
REQUEST_ENV = "AIT_REQUEST"
#: the hidden eval's secret seeds the worker reads (as the Runpod endpoint's secret reference sets them):
#: copied from the orchestrator's environment into each job's task ``secrets`` when set there
SECRETS_ENV = "AIT_SECRETS_JSON"
RESULT_BEGIN, RESULT_END = "AIT-RESULT-BEGIN", "AIT-RESULT-END"
#: the skypilot backend's journal in its run dir (the Runpod backend's is fleet.journal.JOURNAL_NAME)
JOURNAL_NAME = "skypilot_journal.sqlite"
#: pod seconds per job not spent on a job (start-up and idle) in the default pool, as the simulator measured it
#: (`python -m fleet.simulate --skypilot --seeds 3`, 2026-12-02: 181 s; docs/fleet.md, "A SkyPilot pool")
DEFAULT_IDLE_PER_JOB_S = 181.0

#: ManagedJobStatus (sky/jobs/state.py, skypilot 0.14.1) -> the dispatch vocabulary
STATUS_MAP: dict[str, str] = {
    "PENDING": "IN_QUEUE", "SUBMITTED": "IN_QUEUE", "STARTING": "IN_QUEUE",
    "RUNNING": "IN_PROGRESS", "RECOVERING": "IN_PROGRESS", "CANCELLING": "IN_PROGRESS",
    "WINDING_DOWN": "IN_PROGRESS",
    "SUCCEEDED": "COMPLETED", "CANCELLED": "CANCELLED",
    "FAILED": "FAILED", "FAILED_SETUP": "FAILED", "FAILED_PRECHECKS": "FAILED",
    "FAILED_NO_RESOURCE": "FAILED", "FAILED_CONTROLLER": "FAILED",
}
#: the queue fields the engine reads (ManagedJobRecord, sky/schemas/api/responses.py)
QUEUE_FIELDS = ["job_id", "job_name", "status", "job_duration", "recovery_count", "failure_reason",
                "submitted_at", "start_at", "end_at", "current_cluster_name", "pool"]


# ---------------------------------------------------------------------------------------------- wire
def encode_request(body: dict[str, Any]) -> str:
    """The request as it travels in the task's envs: JSON, gzip, base64."""
    raw = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
    return base64.b64encode(gzip.compress(raw, 6, mtime=0)).decode()


def decode_request(text: str) -> dict[str, Any]:
    return json.loads(gzip.decompress(base64.b64decode(text)))


def result_lines(output: dict[str, Any], width: int = 4000) -> list[str]:
    """The handler's output as log lines between the markers (what ``gpu.worker --request-env`` prints)."""
    blob = base64.b64encode(gzip.compress(json.dumps(output, separators=(",", ":")).encode(), 6, mtime=0)).decode()
    return [RESULT_BEGIN, *(blob[i:i + width] for i in range(0, len(blob), width)),
            f"{RESULT_END} {hashlib.sha256(blob.encode()).hexdigest()}"]


def parse_result(log: str) -> dict[str, Any] | None:
    """The handler's output from a job's log (the last complete, intact block), or None."""
    lines = [ln.strip() for ln in log.splitlines()]
    found: dict[str, Any] | None = None
    i = 0
    while i < len(lines):
        if lines[i].endswith(RESULT_BEGIN):
            chunks: list[str] = []
            j = i + 1
            while j < len(lines) and RESULT_END not in lines[j]:
                chunks.append(lines[j].split(" ")[-1])   # a log prefix (time, worker) may precede the chunk
                j += 1
            if j < len(lines):
                blob = "".join(chunks)
                if lines[j].split(RESULT_END, 1)[1].strip() == hashlib.sha256(blob.encode()).hexdigest():
                    try:
                        found = json.loads(gzip.decompress(base64.b64decode(blob)))
                    except (ValueError, OSError):
                        pass
            i = j
        i += 1
    return found


# ---------------------------------------------------------------------------------------------- YAML
def _accelerators(pool: PoolSpec, gpus: int) -> dict[str, Any]:
    """The accelerator choice of a pool's workers and of its jobs: one accelerator as a single resource, more
    as ``any_of`` (whichever the optimizer finds). Not ``ordered``: SkyPilot's API server refuses a pool
    with ordered resources ("Ordered resources are not supported for pools", ``validate_service_task`` in
    sky/serve/serve_utils.py, 0.14.1, called by ``sky/serve/server/impl.py`` ``up`` and ``update``)."""
    if len(pool.accelerators) == 1:
        return {"accelerators": {pool.accelerators[0]: gpus}}
    return {"any_of": [{"accelerators": {acc: gpus}} for acc in pool.accelerators]}


def _resources(pool: PoolSpec, gpus: int) -> dict[str, Any]:
    image = {"image_id": pool.image} if pool.image else {}
    return {"infra": pool.infra, **image, "disk_size": pool.disk_gb, "use_spot": pool.use_spot,
            **_accelerators(pool, gpus)}


def pool_yaml(pool: PoolSpec, gpus_per_worker: int) -> dict[str, Any]:
    """The pool's YAML (``sky jobs pool apply``): workers' resources (any of the accelerators), the worker's image
    (setup: its self-check), and the pool section (fixed ``workers``, or ``min_workers``/``max_workers``
    with the queue-length autoscaler's delays)."""
    section: dict[str, Any]
    if pool.workers is not None:
        section = {"workers": pool.workers}
    else:
        section = {"min_workers": pool.min_workers, "max_workers": pool.max_workers,
                   "queue_length_threshold": pool.queue_length_threshold,
                   "upscale_delay_seconds": pool.upscale_delay_s,
                   "downscale_delay_seconds": pool.downscale_delay_s}
    return {"name": pool.name, "resources": _resources(pool, gpus_per_worker), "pool": section,
            "setup": "python -m gpu.worker --selfcheck --backend gpu || true"}


def job_yaml(body: dict[str, Any], *, name: str, pool: PoolSpec, gpus: int,
             secrets: dict[str, str] | None = None) -> dict[str, Any]:
    """One attempt's task YAML: the request inline in ``envs``, the worker as ``run``, the pool's
    accelerators with this job's GPU count (SkyPilot places it on a worker with that many GPUs free: two
    1-GPU jobs share a 2-GPU worker, ``get_next_cluster_name`` in sky/serve/serve_utils.py), and ``secrets`` (SkyPilot task secrets: env vars of the job
    whose values SkyPilot redacts, ``sky/task.py``): the hidden eval's seeds, ``AIT_SECRETS_JSON``."""
    config: dict[str, Any] = {
        "name": name, "resources": _accelerators(pool, gpus),
        "envs": {REQUEST_ENV: encode_request(body)}, "run": f"python -m gpu.worker --request-env {REQUEST_ENV}"}
    if secrets:
        config["secrets"] = dict(secrets)
    return config


# ---------------------------------------------------------------------------------------------- the SDK
class SkyModule(Protocol):
    """The part of the ``sky`` package the engine calls (``sky.get``, ``sky.Task``, ``sky.jobs``, ``sky.serve``)."""

    Task: Any
    jobs: Any
    serve: Any

    def get(self, request_id: Any) -> Any: ...


def import_sky() -> SkyModule:
    """The installed SkyPilot SDK, or an error that says how to install it."""
    try:
        import sky  # type: ignore[import-not-found]
    except ImportError as exc:
        raise RuntimeError(INSTALL_HINT) from exc
    return sky  # type: ignore[no-any-return]


class SkySDK:
    """SkyPilot's SDK as the engine uses it (``sky`` is the package, or a fake with its calls): each call
    sends a request to the API server and waits for it with ``sky.get``. Files cited are skypilot 0.14.1."""

    def __init__(self, sky: SkyModule | None = None) -> None:
        self.sky = sky if sky is not None else import_sky()

    def task(self, config: dict[str, Any]) -> Any:
        """``sky.Task.from_yaml_config`` (sky/task.py): SkyPilot's own parser and schema check."""
        return self.sky.Task.from_yaml_config(config)

    def launch(self, config: dict[str, Any], name: str, pool: str) -> int:
        """``sky.jobs.launch(task, name, pool)`` (sky/jobs/client/sdk.py) -> ``(job_ids, handle)``."""
        job_ids, _ = self.sky.get(self.sky.jobs.launch(self.task(config), name=name, pool=pool))
        if not job_ids:
            raise RuntimeError(f"sky.jobs.launch returned no job id for {name}")
        return int(job_ids[0])

    def queue(self, job_ids: list[int] | None = None, name_match: str | None = None) -> list[dict[str, Any]]:
        """``sky.jobs.queue_v2`` (sky/jobs/client/sdk.py) -> ``(records, total, status_counts, total)``;
        records as dicts (``ManagedJobRecord``, sky/schemas/api/responses.py)."""
        kwargs: dict[str, Any] = {"refresh": False, "skip_finished": False, "job_ids": job_ids,
                                  "fields": QUEUE_FIELDS}
        if name_match is not None:
            kwargs["name_match"] = name_match
        records = self.sky.get(self.sky.jobs.queue_v2(**kwargs))[0]
        out = []
        for r in records:
            d = r.model_dump() if hasattr(r, "model_dump") else dict(r)
            st = d.get("status")
            d["status"] = getattr(st, "value", st)
            out.append(d)
        return out

    def cancel(self, job_ids: list[int]) -> None:
        """``sky.jobs.cancel(job_ids=...)`` (sky/jobs/client/sdk.py)."""
        self.sky.get(self.sky.jobs.cancel(job_ids=job_ids))

    def logs(self, job_id: int) -> str:
        """``sky.jobs.tail_logs(job_id, follow=False, output_stream=...)`` (sky/jobs/client/sdk.py): the job's
        whole log so far."""
        buf = io.StringIO()
        self.sky.jobs.tail_logs(job_id=job_id, follow=False, output_stream=buf)
        return buf.getvalue()

    # the pool (python -m fleet.pool)
    def pool_apply(self, config: dict[str, Any], pool_name: str) -> None:
        """``sky.jobs.pool_apply(task, pool_name, mode)`` (sky/jobs/client/sdk.py; mode: a rolling update,
        ``sky.serve.UpdateMode.ROLLING``, sky/serve/serve_utils.py)."""
        mode = self.sky.serve.UpdateMode.ROLLING
        self.sky.get(self.sky.jobs.pool_apply(self.task(config), pool_name, mode=mode))

    def pool_status(self, pool_name: str) -> list[dict[str, Any]]:
        """``sky.jobs.pool_status(pool_names)`` (sky/jobs/client/sdk.py)."""
        return list(self.sky.get(self.sky.jobs.pool_status(pool_name)) or [])

    def pool_down(self, pool_name: str) -> None:
        """``sky.jobs.pool_down(pool_names)`` (sky/jobs/client/sdk.py)."""
        self.sky.get(self.sky.jobs.pool_down(pool_name))

    def cost_report(self, days: int | None = None) -> list[dict[str, Any]]:
        """``sky.cost_report(days)`` (sky/client/sdk.py; computed by sky/core.py ``cost_report``): one record
        per cluster of the API server's history, downed ones included, with ``name``, ``usage_intervals``
        (``[(start, end or None)]``, epoch seconds), ``duration`` and ``total_cost`` (SkyPilot's catalog
        price of the cluster's resources x its time up x its nodes: an estimate, not the cloud's invoice)."""
        return [dict(r) for r in self.sky.get(self.sky.cost_report(days=days)) or []]


# ---------------------------------------------------------------------------------------------- statuses
@dataclass
class SkyJobStatus:
    """One managed job's status in the dispatch vocabulary (fields of :class:`fleet.billing.RunpodJobStatus`)."""

    id: str
    status: str
    output: Any = None
    error: Any = None
    delay_time_ms: int | None = 0
    execution_time_ms: int | None = None
    worker_id: str | None = None
    sky_status: str = ""
    recovery_count: int = 0


def to_status(record: dict[str, Any], output: Any = None) -> SkyJobStatus:
    sky_status = str(record.get("status") or "")
    duration = record.get("job_duration")
    ran = duration is not None and float(duration) > 0
    return SkyJobStatus(id=str(record.get("job_id")), status=STATUS_MAP.get(sky_status, sky_status),
                        output=output, error=record.get("failure_reason"),
                        execution_time_ms=int(float(duration) * 1000) if ran else None,
                        worker_id=record.get("current_cluster_name") or None, sky_status=sky_status,
                        recovery_count=int(record.get("recovery_count") or 0))


# ---------------------------------------------------------------------------------------------- the engine
class SkypilotEngine:
    """A SkyPilot pool as a :class:`fleet.dispatch.Engine` (see the module docstring)."""

    name = "skypilot"
    #: a launch waits for its request (sky.get); nothing is retried after it was recorded but the lookup
    send_retry_s = 120.0
    #: how long after its end the jobs controller still answers an attempt's status: its queue keeps every
    #: job (sky/jobs/state.py), so without a bound
    status_kept_s = math.inf

    def __init__(self, options: SkypilotOptions, sdk: SkySDK | None = None) -> None:
        self.options = options
        self.sdk = sdk if sdk is not None else SkySDK()
        #: GPUs each attempt this engine launched asked for (its bill's share of the worker); an attempt
        #: adopted from another orchestrator is billed for the GPUs its worker reports visible
        self._job_gpus: dict[str, int] = {}

    @property
    def pool(self) -> PoolSpec:
        return self.options.pool

    @property
    def idle_timeout_s(self) -> float:
        o = self.options
        return DEFAULT_IDLE_PER_JOB_S if o.idle_per_job_s is None else o.idle_per_job_s

    @property
    def workers_max(self) -> int:
        p = self.pool
        return p.workers if p.workers is not None else p.max_workers

    def gpus_per_worker(self) -> int:
        from ait_env.jobs.gpus import gpus_for_job

        if self.pool.gpus_per_worker is not None:
            return self.pool.gpus_per_worker
        return self.options.gpus_per_job or max(gpus_for_job(m, s).gpus for m, s in self.sizing())

    def sizing(self) -> list[tuple[str, int]]:
        """The (model, seq_len) pairs the pool is sized for (set by the backend: its allowed models)."""
        return getattr(self, "_sizing", None) or [("Qwen/Qwen3-1.7B", 8192)]

    def session(self, session_id: str, started: float) -> Session:
        """This orchestrator's journal session: a pool has no always-on cost the journal adds per second
        (``min_workers`` pods and the jobs controller are billed by the pool: ``python -m fleet.pool cost`` reads
        SkyPilot's report of them, ``python -m fleet.reconcile_pool`` compares the workers' with the journal)."""
        return Session(id=session_id, owner=this_owner(), endpoint_id=f"pool:{self.pool.name}", started=started,
                       heartbeat=started, workers_min=0, gpus_per_worker=self.gpus_per_worker(),
                       pool=self.pool.accelerators[0], active_usd_per_s=0.0, idle_timeout_s=self.idle_timeout_s,
                       source=f"SkyPilot pool {self.pool.name} (idle per job: "
                              f"{'options' if self.options.idle_per_job_s is not None else 'simulator default'})")

    def send(self, body: dict[str, Any], limits: Limits) -> str:
        """Launch one attempt as a managed job on the pool (see the module docstring for failures)."""
        body = dict(body)
        gpus = int(body.pop("_gpus", 0) or self.options.gpus_per_job or 1)
        tag = str(body.get("tag") or "")
        name = f"ait-{tag}" if tag else "ait-job"
        from ait_env.hidden.secrets import worker_secrets_json

        seeds = os.environ.get(SECRETS_ENV) or worker_secrets_json()   # set explicitly, else this run's private seeds
        config = job_yaml(body, name=name, pool=self.pool, gpus=gpus, secrets={SECRETS_ENV: seeds} if seeds else None)
        size = len(config["envs"][REQUEST_ENV])
        if size > self.options.max_request_bytes:
            raise SendRefused(f"the request is {size} bytes encoded, over max_request_bytes="
                              f"{self.options.max_request_bytes} (an environment variable is at most 131,072 "
                              "bytes: execve(2)); make the job's files smaller, or use backend=runpod (10 MB)")
        try:
            task_ok = self.sdk.task(config) is not None
        except Exception as exc:
            raise SendRefused(f"SkyPilot refused the job's task YAML ({type(exc).__name__}: {exc}); this is "
                              "a bug in fleet/skypilot_engine.py job_yaml or the pool options") from exc
        assert task_ok
        try:
            job_id = str(self.sdk.launch(config, name=name, pool=self.pool.name))
            self._job_gpus[job_id] = gpus
            return job_id
        except Exception as exc:
            kind = type(exc).__name__
            if kind == "ApiServerConnectionError" or isinstance(exc, ConnectionRefusedError):
                # raised by the SDK's health check before the request is sent (sky/server/common.py
                # check_server_healthy_or_start; sky/exceptions.py): surely nothing launched
                raise SendFailed(f"the SkyPilot API server could not be reached ({exc}); check `sky api info`") \
                    from exc
            if kind in ("ApiServerAuthenticationError", "UsageError", "NotSupportedError") or \
                    isinstance(exc, (ValueError, TypeError, PermissionError)):
                raise SendRefused(f"SkyPilot refused the launch ({kind}: {exc}); check the API server's login and "
                                  f"that the pool {self.pool.name!r} exists: python -m fleet.pool status") from exc
            found = self._find(name)   # the request may have run at the server: look the job up by name
            if found:
                self._job_gpus[found] = gpus
                return found
            raise SendUncertain(f"sky.jobs.launch got no clear answer ({kind}: {exc}) and no job named {name} is "
                                "listed (the launch request may still be queued at the API server)") from exc

    def find(self, tag: str) -> str | None:
        """The managed job launched with ``tag`` (named ``ait-<tag>`` by :meth:`send`), if the queue lists it."""
        return self._find(f"ait-{tag}") if tag else None

    def _find(self, name: str) -> str | None:
        try:
            hits = [r for r in self.sdk.queue(name_match=name) if r.get("job_name") == name]
        except Exception:  # noqa: BLE001 - unknown: the caller decides
            return None
        return str(hits[-1]["job_id"]) if hits else None

    def statuses(self, ids: list[str]) -> dict[str, Any]:
        """The status of each id (one ``queue_v2`` call), the output of a SUCCEEDED one read from its log; an
        id the queue does not list is :class:`~fleet.dispatch.AttemptGone`."""
        try:
            records = {str(r.get("job_id")): r for r in self.sdk.queue([int(i) for i in ids])}
        except Exception as exc:  # noqa: BLE001 - every id gets the error; the dispatcher backs off
            return {i: exc for i in ids}
        out: dict[str, Any] = {}
        for i in ids:
            rec = records.get(i)
            if rec is None:
                out[i] = AttemptGone(f"SkyPilot's queue no longer lists managed job {i}")
                continue
            try:
                out[i] = self._status(rec)
            except Exception as exc:  # noqa: BLE001 - the log could not be read: read again later
                out[i] = exc
        return out

    def _status(self, rec: dict[str, Any]) -> SkyJobStatus:
        st = to_status(rec)
        if st.status == "COMPLETED":
            st.output = parse_result(self.sdk.logs(int(rec["job_id"])))
        return st

    def read(self, job_id: str) -> SkyJobStatus | None:
        """One status, or None when it cannot be read."""
        got = self.statuses([job_id]).get(job_id)
        return got if isinstance(got, SkyJobStatus) else None

    def cancel(self, job_id: str) -> bool:
        """``sky jobs cancel``; True when SkyPilot answered (errors propagate: the dispatcher retries)."""
        self.sdk.cancel([int(job_id)])
        return True

    def _rate(self, gpu_type: str, gpus: int) -> float:
        from fleet import prices

        return prices.pod_price_per_s(gpu_type) * gpus

    def bill(self, st: Any, worker: dict[str, Any] | None = None) -> Billing:
        """The job's share of its worker: pod time the attempt held (``job_duration``, rounded up to a
        second) x the pod price of the GPU that ran it x the GPUs it was given, and the idle estimate after it
        (see the module docstring). Its GPUs: what it was launched with (SkyPilot gives a pool job that many of
        its worker's GPUs, and may run another job on the rest), else the GPUs its worker reports visible to it
        (``gpu.selfcheck.detect_gpus``), else a whole worker; never more than a worker has."""
        gpus = [str(g).split(" (")[0] for g in (worker or {}).get("gpus") or []]
        gpu = gpus[0] if gpus else self.options.gpu_type
        asked = self._job_gpus.get(str(getattr(st, "id", ""))) if st is not None else None
        n = min(asked or len(gpus) or self.gpus_per_worker(), self.gpus_per_worker())
        execution = int(getattr(st, "execution_time_ms", 0) or 0) if st is not None else 0
        rate = self._rate(gpu, n)
        ran = bool(execution or getattr(st, "worker_id", None))
        return Billing(delay_time_ms=0, execution_time_ms=execution, gpu_type=gpu, gpus_per_worker=n,
                       cost_usd=round(math.ceil(execution / 1000 - 1e-9) * rate, 6),
                       idle_usd=round(self.idle_timeout_s * rate, 6) if ran else 0.0)

    def bound_rate(self) -> float:
        """$/s of one worker at the dearest pod price among the pool's accelerators x its GPUs."""
        from fleet import prices

        return max(prices.pod_price_per_s(prices.skypilot_gpu_type(a)) for a in self.pool.accelerators) * \
            self.gpus_per_worker()

    def bound_gpus(self) -> tuple[str, int]:
        return self.options.gpu_type, self.gpus_per_worker()


