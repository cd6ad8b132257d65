"""A fake Runpod Serverless on 127.0.0.1: the job API of one queue-based endpoint, the REST v2 endpoint
management the client uses, and local worker processes that run the REAL worker handler.

Public start API
----------------
::

    from tests.gpu.fake_runpod import start_fake_runpod
    with start_fake_runpod(workers=2, worker_env=env) as fake:     # FakeRunpod, started
        client = ServerlessClient(fake.endpoint_id, fake.api_key, base_url=fake.job_base_url)
        mgmt = ManagementClient(fake.api_key, base_url=fake.rest_base_url)
    # stopped: every worker process and everything below it is gone (checked; an error otherwise)

or :func:`fakes`, a factory for a test module's fixture (``make(workers=0, instant=True, ...)``; every fake
it made is stopped at the end; a plain function, since tests/gpu has no conftest.py).
``python -m tests.gpu.fake_runpod --serve`` runs one by hand.

Arguments of :class:`FakeRunpod`: ``workers`` (worker processes, each runs
``gpu.runpod_handler.handle_input(input, progress, cancel)``, one job at a time), ``instant`` (no processes: every
job completes as soon as it is submitted, with ``instant_output``; for throughput benchmarks),
``result_ttl_s`` (results of finished jobs are kept this long, then 404; Runpod: 30 min),
``max_worker_retries`` (a job whose worker dies is requeued this many times, then FAILED),
``worker_env`` (the workers' environment), ``scale_down_s`` (management: how long allocated workers take
to go after scaling to 0), ``instant_delay_ms`` / ``instant_execution_ms`` (instant mode: each job is
reported as having taken that cold start and execution, ending when it was submitted),
``default_endpoint`` (the ``gpu``/``workers`` settings the billing of ``endpoint_id`` uses).

Billing (``GET /v2/billing/serverless``, ``api-reference-v2/openapi.json`` ``listServerlessBilling``:
``startTime``, ``endTime``, ``bucketSize`` (``hour`` or ``day`` here), ``serverlessId`` -> ``{"records":
[{startTime, endTime, serverlessId, totalAmount, gpuAmount, cpuAmount, diskAmount, feeAmount}],
"metadata": {...}}``) bills what its workers' time would cost at :mod:`fleet.prices` rates of the endpoint's
first pool x its GPUs: per job a worker ran, its cold start (instant mode) plus execution, rounded up to a
whole second ("rounded up to the nearest second", ``serverless/pricing.mdx``), plus the idle timeout after
it unless it TIMED_OUT; and ``workers.min`` active workers from the endpoint's creation (or the fake's
start) to now at the active rate. A queued job's wait is not billed (the fake's workers are always up).
Each charge is spread over the buckets its time span covers. ``bill_extra(usd, at)`` adds a charge Runpod
would have billed and the journal would not know of (an injected discrepancy).

Fault knobs (methods, or ``POST /_fake/faults`` with the same names as JSON keys):
``fail_next(route, status, count, retry_after)`` (the next ``count`` calls of a route — ``run``,
``status``, ``stream``, ``cancel``, ``retry``, ``health``, ``purge-queue``, ``serverless`` — answer
``status``; ``billing`` too), ``stick_next(count)`` (the next submitted jobs stay IN_QUEUE until
cancelled or purged), ``kill_next(count, after_s)`` (the worker that takes each of the next jobs is
SIGKILLed with its whole tree ``after_s`` into the job), ``kill_worker_of(job_id)``, ``expire(job_id)``
(its result is gone at once; it stays billed), ``bill_extra(usd, at, endpoint)`` (see Billing),
``skew_versions(worker, versions)`` (that worker's results carry other versions in
``result.worker.versions``, as a worker that is not a replica would), ``lose_answers(count)`` (the next
``count`` run calls queue their job, then answer 502: the job runs, its id never reaches the caller).

Routes and JSON follow the real API (stored copies: runpod/docs a900806e, runpod-python 1.12.0):
``POST /v2/<ep>/run`` -> ``{"id", "status": "IN_QUEUE"}``; ``GET /v2/<ep>/status/<id>`` -> ``{id, status,
delayTime, executionTime, workerId, output, error}`` (``workerId``:
``public-endpoints/models/flux-dev.mdx``); ``GET /stream/<id>`` -> ``{"status", "stream": []}``
(runpod-python ``endpoint/runner.py::Job.stream``; our handler is no generator); ``POST /cancel/<id>`` ->
``{"id", "status": "CANCELLED"}``; ``POST /retry/<id>`` (FAILED/TIMED_OUT only) -> ``{"id", "status":
"IN_QUEUE"}``; ``GET /health`` -> ``{"jobs": {completed, failed, inProgress, inQueue, retried},
"workers": {idle, running}}``; ``POST /purge-queue`` -> ``{"removed", "status": "completed"}`` (all from
``serverless/endpoints/operation-reference.mdx``). A ``policy`` (``executionTimeout``, ``ttl`` in ms,
``send-requests.mdx``) is honoured: past ``executionTimeout`` a job is TIMED_OUT, past ``ttl`` it is gone
(404, as that page says). A ``progress_update`` message shows as ``output`` of an IN_PROGRESS status
(runpod-python ``serverless/modules/rp_progress.py`` posts ``{"status": "IN_PROGRESS", "output": msg}``;
``handler-functions.mdx``: "available when the job status is polled"). Management: ``GET/POST
/v2/serverless``, ``GET/PATCH/DELETE /v2/serverless/<id>``, ``GET /v2/serverless/<id>/workers``
(``api-reference-v2/openapi.json``; errors as RFC 9457 ``{title, status, detail}``). Authorization:
``Bearer <key>`` (or the bare key, as the docs' curl examples send it); anything else is 401.

Assumptions (no live account to check): the 404 body of an expired job (``{"error": "job ... not
found"}``); a purged job reads CANCELLED afterwards; Runpod's "automatic retries" of a job whose worker
died are modelled as requeueing it at the head of the queue (``health.jobs.retried`` counts them).
Worker routes (``/_fake/worker/...``) are this fake's own stand-in for the SDK's job-take/job-done calls.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import signal
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

ROOT = Path(__file__).resolve().parents[2]
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT"}
JOB_ROUTES = {"run", "runsync", "status", "stream", "cancel", "retry", "health", "purge-queue"}
INSTANT_OUTPUT: dict[str, Any] = {"kind": "job", "result": {"status": "succeeded", "post_score": 0.5,
                                                            "worker": {"versions": {}}}, "baselines": []}


def _as_handler_would(output: Any, payload: Any) -> Any:
    """A canned job output answered for ``payload``: its result names the job the payload carries, as the real
    handler's does (gpu/worker.py returns the bundle's JobResult, whose ``job_id`` is the bundle's)."""
    if not (isinstance(output, dict) and isinstance(output.get("result"), dict) and "job_id" in output["result"]
            and isinstance(payload, dict) and payload.get("bundle")):
        return output
    from tests.fakes.runpod_client import bundle_job_id

    return {**output, "result": {**output["result"], "job_id": bundle_job_id(payload)}}


@dataclass
class _Job:
    id: str
    input: Any
    created: float
    execution_timeout_s: float | None = None
    ttl_s: float | None = None
    status: str = "IN_QUEUE"
    started: float | None = None
    finished: float | None = None
    output: Any = None
    error: Any = None
    worker: int | None = None
    attempts: int = 0
    stuck: bool = False
    endpoint: str = ""
    cold_start_s: float = 0.0

    def view(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "status": self.status}
        if self.started is not None:
            out["delayTime"] = int((self.started - self.created) * 1000)
            out["workerId"] = f"fake-worker-{self.worker}" if self.worker is not None else None
        if self.finished is not None and self.started is not None:
            out["executionTime"] = int((self.finished - self.started) * 1000)
        if self.output is not None:
            out["output"] = self.output
        if self.error is not None:
            out["error"] = self.error
        return out


@dataclass
class _Worker:
    index: int
    tree: Any = None                 # ait_env.processes.ProcessTree
    job: str | None = None
    kill_at: float | None = None
    versions: dict[str, str] | None = None
    log: Path | None = None


@dataclass
class _Faults:
    fail: dict[str, deque[tuple[int, float | None]]] = field(default_factory=dict)
    stick: int = 0
    kill: deque[float] = field(default_factory=deque)
    lose: int = 0


class FakeRunpod:
    """See the module docstring. Thread-safe; every state change happens under ``self.cond``."""

    def __init__(self, *, api_key: str = "rp-fake-key-0123456789", endpoint_id: str = "fake-ep",
                 workers: int = 0, instant: bool = False, instant_output: Any = None,
                 result_ttl_s: float = 1800.0, max_worker_retries: int = 1,
                 worker_env: dict[str, str] | None = None, log_dir: Path | None = None,
                 scale_down_s: float = 0.0, instant_delay_ms: int = 0, instant_execution_ms: int = 0,
                 default_endpoint: dict[str, Any] | None = None) -> None:
        self.api_key, self.endpoint_id = api_key, endpoint_id
        self.instant = instant
        self.instant_output = INSTANT_OUTPUT if instant_output is None else instant_output
        self.result_ttl_s, self.max_worker_retries = result_ttl_s, max_worker_retries
        self.worker_env = dict(worker_env if worker_env is not None else os.environ)
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="fake-runpod-"))
        self.scale_down_s = scale_down_s
        self.instant_delay_ms, self.instant_execution_ms = instant_delay_ms, instant_execution_ms
        self.default_endpoint = default_endpoint or {"gpu": {"pools": ["AMPERE_24"], "count": 2},
                                                     "workers": {"min": 0, "idleTimeout": 5}}
        self.extra_bills: list[tuple[float, float, str]] = []    # (at, usd, endpoint)
        self.gone: list[_Job] = []                                 # forgotten jobs a worker ran (billed)
        self.started_at = time.time()
        self.cond = threading.Condition()
        self.jobs: dict[str, _Job] = {}
        self.queue: deque[str] = deque()
        self.retried = 0
        self.faults = _Faults()
        self.workers = [_Worker(i) for i in range(workers)]
        self.endpoints: dict[str, dict[str, Any]] = {}
        self.requests = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.server: ThreadingHTTPServer | None = None

    # ------------------------------------------------------------------------------------------ lifecycle
    @property
    def url(self) -> str:
        assert self.server is not None, "start() first"
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    @property
    def job_base_url(self) -> str:
        return f"{self.url}/v2"

    @property
    def rest_base_url(self) -> str:
        return f"{self.url}/v2"

    def start(self) -> FakeRunpod:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_class(self))
        self.server.daemon_threads = True
        self._spawn(self.server.serve_forever, "fake-runpod-http")
        self._spawn(self._monitor, "fake-runpod-monitor")
        for w in self.workers:
            self._start_worker(w)
        return self

    def _spawn(self, target: Any, name: str) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def stop(self) -> None:
        """Stop the server and kill every worker tree; raises if a process survived."""
        self._stop.set()
        with self.cond:
            self.cond.notify_all()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        errors = []
        for w in self.workers:
            try:
                self._kill_tree(w)
            except RuntimeError as e:
                errors.append(str(e))
        for t in self._threads:
            t.join(timeout=5)
        if errors:
            raise RuntimeError("; ".join(errors))

    def __enter__(self) -> FakeRunpod:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -------------------------------------------------------------------------------------------- workers
    def _start_worker(self, w: _Worker) -> None:
        from ait_env.processes import ProcessTree

        w.log = self.log_dir / f"worker-{w.index}.log"
        env = {**self.worker_env, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        with open(w.log, "ab") as log:
            w.tree = ProcessTree(grace_s=2.0).start(
                [sys.executable, "-m", "tests.gpu.fake_runpod", "--worker", self.url, str(w.index)],
                env=env, cwd=ROOT, stdout=log)

    def _kill_tree(self, w: _Worker) -> None:
        """SIGSTOP the worker and every process below it (none can fork past the snapshot), then SIGKILL
        them, then the tree's own sweep (group and tagged processes)."""
        if w.tree is None or w.tree.proc is None:
            return
        from ait_env.processes import live_descendants

        frozen: set[int] = set()
        for _ in range(20):
            pids = ({w.tree.pid} if w.tree.poll() is None else set()) | live_descendants(w.tree.pid)
            if pids <= frozen:
                break
            for pid in pids - frozen:
                _signal(pid, signal.SIGSTOP)
            frozen |= pids
        for pid in frozen:
            _signal(pid, signal.SIGKILL)
        w.tree.kill()

    def _worker_died(self, w: _Worker, why: str) -> None:
        """Called under the lock: the worker is gone; requeue or fail its job, start a new worker."""
        job = self.jobs.get(w.job) if w.job else None
        w.job, w.kill_at = None, None
        if job is not None and job.status == "IN_PROGRESS":
            job.worker, job.output = None, None
            if job.attempts <= self.max_worker_retries:
                job.status, job.started = "IN_QUEUE", None
                self.queue.appendleft(job.id)
                self.retried += 1
            else:
                job.status, job.finished, job.error = "FAILED", time.time(), f"worker died: {why}"
        if not self._stop.is_set():
            self._kill_tree(w)
            self._start_worker(w)
        self.cond.notify_all()

    def _monitor(self) -> None:
        """Deadlines: kills scheduled by ``kill_next``, dead workers, execution timeouts, TTLs, expiry."""
        last_scan = 0.0
        while not self._stop.is_set():
            with self.cond:
                now = time.time()
                for w in self.workers:
                    if w.kill_at is not None and now >= w.kill_at:
                        self._worker_died(w, "killed by the fault injector")
                    elif w.tree is not None and w.tree.poll() is not None:
                        self._worker_died(w, f"exited with {w.tree.poll()}")
                if now - last_scan > 0.2:
                    last_scan = now
                    for job in list(self.jobs.values()):
                        self._deadlines(job, now)
                self.cond.wait(timeout=0.05)

    def _deadlines(self, job: _Job, now: float) -> None:
        if job.ttl_s is not None and now > job.created + job.ttl_s:
            self._forget(job.id)
        elif job.status == "IN_PROGRESS" and job.execution_timeout_s is not None \
                and job.started is not None and now > job.started + job.execution_timeout_s:
            job.status, job.finished, job.error = "TIMED_OUT", now, "execution timeout"
        elif job.status in FINAL and job.finished is not None and now > job.finished + self.result_ttl_s:
            self._forget(job.id)

    def _forget(self, job_id: str) -> None:
        job = self.jobs.pop(job_id, None)
        if job is not None and job.worker is not None:
            self.gone.append(job)      # its result is gone, its bill is not
        try:
            self.queue.remove(job_id)
        except ValueError:
            pass

    def _take(self, index: int, wait_s: float) -> _Job | None:
        """A worker takes the oldest runnable job (FIFO; stuck jobs are skipped), waiting up to ``wait_s``."""
        deadline = time.time() + wait_s
        with self.cond:
            w = self.workers[index]
            while not self._stop.is_set():
                for job_id in list(self.queue):
                    job = self.jobs.get(job_id)
                    if job is None or job.status != "IN_QUEUE":
                        self.queue.remove(job_id)
                        continue
                    if job.stuck:
                        continue
                    self.queue.remove(job_id)
                    job.status, job.started, job.worker = "IN_PROGRESS", time.time(), index
                    job.attempts += 1
                    w.job = job.id
                    if self.faults.kill:
                        w.kill_at = time.time() + self.faults.kill.popleft()
                    return job
                left = deadline - time.time()
                if left <= 0:
                    return None
                self.cond.wait(timeout=left)
        return None

    # ---------------------------------------------------------------------------------------- fault knobs
    def fail_next(self, route: str, status: int, count: int = 1, retry_after: float | None = None) -> None:
        with self.cond:
            self.faults.fail.setdefault(route, deque()).extend([(status, retry_after)] * count)

    def stick_next(self, count: int = 1) -> None:
        with self.cond:
            self.faults.stick += count

    def lose_answers(self, count: int = 1) -> None:
        """The next ``count`` run calls queue their job and then answer 502 (a 5xx whose job is queued)."""
        with self.cond:
            self.faults.lose += count

    def kill_next(self, count: int = 1, after_s: float = 1.0) -> None:
        with self.cond:
            self.faults.kill.extend([after_s] * count)

    def kill_worker_of(self, job_id: str) -> None:
        with self.cond:
            for w in self.workers:
                if w.job == job_id:
                    self._worker_died(w, "killed by the fault injector")
                    return
        raise KeyError(f"no worker runs {job_id}")

    def expire(self, job_id: str) -> None:
        with self.cond:
            self._forget(job_id)

    def skew_versions(self, worker: int, versions: dict[str, str]) -> None:
        with self.cond:
            self.workers[worker].versions = dict(versions)

    def apply_faults(self, spec: dict[str, Any]) -> None:
        """``POST /_fake/faults``: the knobs above by name."""
        for f in spec.get("fail_next", []):
            self.fail_next(f["route"], int(f["status"]), int(f.get("count", 1)), f.get("retry_after"))
        if spec.get("lose_answers"):
            self.lose_answers(int(spec["lose_answers"]))
        if spec.get("stick_next"):
            self.stick_next(int(spec["stick_next"]))
        if spec.get("kill_next"):
            k = spec["kill_next"]
            self.kill_next(int(k.get("count", 1)), float(k.get("after_s", 1.0)))
        for job_id in spec.get("expire", []):
            self.expire(job_id)
        for b in spec.get("bill_extra", []):
            self.bill_extra(float(b["usd"]), b.get("at"), b.get("endpoint"))
        if spec.get("skew_versions"):
            self.skew_versions(int(spec["skew_versions"]["worker"]), spec["skew_versions"]["versions"])

    def _injected(self, route: str) -> tuple[int, float | None] | None:
        with self.cond:
            q = self.faults.fail.get(route)
            return q.popleft() if q else None

    # ------------------------------------------------------------------------------------------- helpers
    def wait_for(self, job_id: str, states: set[str] | None = None,
                 timeout_s: float = 120.0) -> dict[str, Any]:
        """Block until the job is in one of ``states`` (default: a final one); its status view."""
        states = states or FINAL
        deadline = time.time() + timeout_s
        with self.cond:
            while True:
                job = self.jobs.get(job_id)
                if job is not None and job.status in states:
                    return job.view()
                if time.time() > deadline:
                    raise TimeoutError(f"{job_id}: {job.view() if job else 'gone'} after {timeout_s} s")
                self.cond.wait(timeout=0.1)

    # ------------------------------------------------------------------------------------------ job API
    def submit(self, body: dict[str, Any], endpoint: str = "") -> dict[str, Any]:
        policy = body.get("policy") or {}
        timeout, ttl = policy.get("executionTimeout"), policy.get("ttl")
        job = _Job(id=f"{uuid.uuid4()}-u1", input=body.get("input"), created=time.time(),
                   execution_timeout_s=timeout / 1000 if timeout else None, ttl_s=ttl / 1000 if ttl else None,
                   endpoint=endpoint or self.endpoint_id)
        with self.cond:
            if self.faults.stick:
                self.faults.stick -= 1
                job.stuck = True
            self.jobs[job.id] = job
            if self.instant and not job.stuck:     # a worker that answers at once, running nothing
                now = job.created
                job.cold_start_s = self.instant_delay_ms / 1000
                job.created = now - (self.instant_delay_ms + self.instant_execution_ms) / 1000
                job.started = now - self.instant_execution_ms / 1000
                job.status, job.finished, job.worker = "COMPLETED", now, 0
                job.output = _as_handler_would(self.instant_output, job.input)
            else:
                self.queue.append(job.id)
            self.cond.notify_all()
        return {"id": job.id, "status": "IN_QUEUE"}

    def cancel(self, job_id: str) -> dict[str, Any] | None:
        with self.cond:
            job = self.jobs.get(job_id)
            if job is None:
                return None
            if job.status in ("IN_QUEUE", "IN_PROGRESS"):
                job.status, job.finished = "CANCELLED", time.time()
                if job.started is None:
                    job.started = job.finished
            self.cond.notify_all()
            return {"id": job.id, "status": job.status}

    def retry(self, job_id: str) -> tuple[int, dict[str, Any]]:
        with self.cond:
            job = self.jobs.get(job_id)
            if job is None:
                return 404, {"error": f"job {job_id} not found"}
            if job.status not in ("FAILED", "TIMED_OUT"):
                return 400, {"error": f"job {job_id} is {job.status}: only FAILED or TIMED_OUT are retried"}
            job.status, job.output, job.error, job.started, job.finished, job.worker = \
                "IN_QUEUE", None, None, None, None, None
            self.queue.append(job.id)
            self.cond.notify_all()
            return 200, {"id": job.id, "status": "IN_QUEUE"}

    def health(self) -> dict[str, Any]:
        with self.cond:
            count = {s: 0 for s in ("COMPLETED", "FAILED", "IN_PROGRESS", "IN_QUEUE")}
            for job in self.jobs.values():
                if job.status in count:
                    count[job.status] += 1
            running = sum(1 for w in self.workers if w.job is not None)
            return {"jobs": {"completed": count["COMPLETED"], "failed": count["FAILED"],
                             "inProgress": count["IN_PROGRESS"], "inQueue": count["IN_QUEUE"],
                             "retried": self.retried},
                    "workers": {"idle": len(self.workers) - running, "running": running}}

    def purge(self) -> dict[str, Any]:
        with self.cond:
            removed = 0
            now = time.time()
            for job_id in list(self.queue):
                job = self.jobs.get(job_id)
                if job is not None and job.status == "IN_QUEUE":
                    job.status, job.finished, job.started = "CANCELLED", now, now
                    removed += 1
            self.queue.clear()
            return {"removed": removed, "status": "completed"}

    # --------------------------------------------------------------------------------- worker callbacks
    def worker_progress(self, index: int, job_id: str, output: Any) -> bool:
        """A progress message; returns whether the worker should go on (False: cancelled or timed out)."""
        with self.cond:
            job = self.jobs.get(job_id)
            if job is None or job.status != "IN_PROGRESS" or job.worker != index:
                return False
            if output is not None:
                job.output = output
            return True

    def worker_done(self, index: int, job_id: str, output: Any, error: Any) -> None:
        with self.cond:
            w = self.workers[index]
            if w.job == job_id:
                w.job, w.kill_at = None, None
            job = self.jobs.get(job_id)
            if job is not None and job.status == "IN_PROGRESS" and job.worker == index:
                job.finished = time.time()
                if error is not None:
                    job.status, job.error, job.output = "FAILED", error, None
                else:
                    job.status, job.output = "COMPLETED", self._skewed(w, output)
            self.cond.notify_all()

    @staticmethod
    def _skewed(w: _Worker, output: Any) -> Any:
        if w.versions and isinstance(output, dict) and isinstance(output.get("result"), dict):
            worker = output["result"].setdefault("worker", {})
            worker["versions"] = {**worker.get("versions", {}), **w.versions}
        return output

    # ------------------------------------------------------------------------------------- management
    def mgmt_create(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        problems = _validate_endpoint(body, create=True)
        if problems:
            return 400, _problem(400, "Bad Request", "; ".join(problems))
        ep_id = uuid.uuid4().hex[:14]
        record = {"id": ep_id, "createdAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  "dataCenterIds": [], "networkVolumes": [], "timeout": 300000, "flashboot": "OFF",
                  "requestUrls": {"run": f"{self.job_base_url}/{ep_id}/run"}, **body}
        record["gpu"] = {"allowedCudaVersions": [], "minCudaVersion": None, "count": 1, **body["gpu"]}
        with self.cond:
            self.endpoints[ep_id] = record
            self._allocate(record)
            record["_active_log"] = [(time.time(), self._active_rate(record))]
        return 201, _public(record)

    def mgmt_update(self, ep_id: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        problems = _validate_endpoint(body, create=False)
        if problems:
            return 400, _problem(400, "Bad Request", "; ".join(problems))
        with self.cond:
            record = self.endpoints.get(ep_id)
            if record is None:
                return 404, _problem(404, "Not Found", "endpoint not found")
            for k, v in body.items():
                record[k] = {**record.get(k, {}), **v} if k in ("workers", "gpu") else v
            self._allocate(record)
            record.setdefault("_active_log", []).append((time.time(), self._active_rate(record)))
            return 200, _public(record)

    def _allocate(self, record: dict[str, Any]) -> None:
        """Workers allocated: ``workers.min`` at once; down to it after ``scale_down_s``."""
        want = int(record["workers"].get("min", 0))
        have = int(record.get("_allocated", 0))
        if want >= have:
            record["_allocated"], record["_release_at"] = want, None
        else:
            record["_target"], record["_release_at"] = want, time.time() + self.scale_down_s

    # ---------------------------------------------------------------------------------------- billing
    @staticmethod
    def _rates(record: dict[str, Any]) -> tuple[float, float]:
        """($/s of one flex worker, $/s of one active worker) of an endpoint: its first pool x GPUs."""
        from fleet import prices

        gpu = record.get("gpu") or {}
        pool, count = (gpu.get("pools") or ["AMPERE_24"])[0], int(gpu.get("count") or 1)
        return prices.price_per_s(pool) * count, prices.price_per_s(pool, active=True) * count

    def _active_rate(self, record: dict[str, Any]) -> float:
        return int((record.get("workers") or {}).get("min", 0)) * self._rates(record)[1]

    def bill_extra(self, usd: float, at: float | None = None, endpoint: str | None = None) -> None:
        """A charge Runpod bills and the journal cannot know of (an injected discrepancy)."""
        with self.cond:
            self.extra_bills.append((time.time() if at is None else at, usd, endpoint or self.endpoint_id))

    def _charges(self, now: float) -> list[tuple[str, float, float, float]]:
        """Every charge so far as ``(endpoint, t0, t1, usd)`` (see the module docstring, Billing)."""
        out: list[tuple[str, float, float, float]] = []
        default = {**self.default_endpoint,
                   "_active_log": [(self.started_at, self._active_rate(self.default_endpoint))]}
        records = {self.endpoint_id: default, **self.endpoints}
        for job in [*self.jobs.values(), *self.gone]:
            if job.worker is None or job.started is None or job.finished is None:
                continue
            record = records.get(job.endpoint) or records[self.endpoint_id]
            flex, _ = self._rates(record)
            seconds = math.ceil(job.cold_start_s + job.finished - job.started - 1e-9)
            out.append((job.endpoint, job.finished - seconds, job.finished, seconds * flex))
            if job.status != "TIMED_OUT":       # the worker idles after a request (not after a timeout)
                idle = float((record.get("workers") or {}).get("idleTimeout", 5))
                out.append((job.endpoint, job.finished, job.finished + idle, idle * flex))
        for ep, record in records.items():
            log = list(record.get("_active_log") or [])
            for (t0, rate), (t1, _) in zip(log, [*log[1:], (now, 0.0)]):
                if rate and t1 > t0:
                    out.append((ep, t0, t1, (t1 - t0) * rate))
        out += [(ep, at, at, usd) for at, usd, ep in self.extra_bills]
        return out

    def billing(self, query: dict[str, list[str]]) -> tuple[int, dict[str, Any]]:
        """``GET /v2/billing/serverless`` (hour or day buckets)."""
        from datetime import datetime, timezone

        q = {k: v[0] for k, v in query.items()}
        size = q.get("bucketSize", "day")
        if size not in ("hour", "day"):
            return 400, _problem(400, "Bad Request", f"bucketSize {size!r}: this fake serves hour and day")
        step = 3600 if size == "hour" else 86400

        def ts(value: str) -> float:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()

        def iso(t: float) -> str:
            return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

        now = time.time()
        try:
            start = ts(q["startTime"]) if "startTime" in q else now - 30 * 86400
            end = ts(q["endTime"]) if "endTime" in q else now
        except ValueError as e:
            return 400, _problem(400, "Bad Request", f"startTime/endTime: RFC 3339 expected ({e})")
        start, end = math.floor(start / step) * step, math.ceil(end / step) * step   # snapped, as documented
        want = q.get("serverlessId")
        amounts: dict[tuple[str, float], float] = {}
        with self.cond:
            charges = self._charges(now)
        for ep, t0, t1, usd in charges:
            if want and ep != want:
                continue
            for b in range(int(math.floor(t0 / step) * step), int(max(t0, t1 - 1e-9)) + 1, step):
                share = 1.0 if t1 <= t0 else (min(t1, b + step) - max(t0, b)) / (t1 - t0)
                if start <= b < end and share > 0:
                    amounts[(ep, b)] = amounts.get((ep, b), 0.0) + usd * share
        records = [{"startTime": iso(b), "endTime": iso(b + step), "serverlessId": ep,
                    "totalAmount": round(usd, 6), "gpuAmount": round(usd, 6), "cpuAmount": 0.0,
                    "diskAmount": 0.0, "feeAmount": 0.0} for (ep, b), usd in sorted(amounts.items(),
                                                                                   key=lambda kv: kv[0][1])]
        total = round(sum(r["totalAmount"] for r in records), 6)
        return 200, {"records": records, "metadata": {
            "query": {"startTime": iso(start), "endTime": iso(end), "bucketSize": size, "serverlessId": want},
            "recordCount": len(records), "uniqueServerlessCount": len({r["serverlessId"] for r in records}),
            "totals": {"totalAmount": total, "gpuAmount": total, "cpuAmount": 0.0, "diskAmount": 0.0,
                       "feeAmount": 0.0}}}

    def mgmt_workers(self, ep_id: str) -> tuple[int, dict[str, Any]]:
        with self.cond:
            record = self.endpoints.get(ep_id)
            if record is None:
                return 404, _problem(404, "Not Found", "endpoint not found")
            if record.get("_release_at") is not None and time.time() >= record["_release_at"]:
                record["_allocated"], record["_release_at"] = record["_target"], None
            n = int(record.get("_allocated", 0))
            workers = [{"id": f"{ep_id}-w{i}", "status": "IDLE", "isStale": False, "gpuCount":
                        record["gpu"].get("count", 1)} for i in range(n)]
            return 200, {"workers": workers, "endpointVersion": 1,
                         "summary": {"running": 0, "idle": n, "initializing": 0, "throttled": 0,
                                     "unhealthy": 0, "total": n}}


def _public(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if not k.startswith("_")}


def _problem(status: int, title: str, detail: str) -> dict[str, Any]:
    return {"title": title, "status": status, "detail": detail}


_CREATE_KEYS = {"name", "type", "image", "templateId", "env", "disk", "args", "ports", "registry", "gpu",
                "cpu", "workers", "scaling", "timeout", "flashboot", "networkVolumes", "dataCenterIds"}


def _validate_endpoint(body: dict[str, Any], create: bool) -> list[str]:
    """The parts of the v2 schema (``CreateEndpointRequest``/``UpdateEndpointRequest``) our client uses."""
    problems = [f"$: additional properties '{k}' not allowed" for k in body if k not in _CREATE_KEYS]
    if create:
        problems += [f"$: missing property '{k}'" for k in ("name", "type", "scaling") if k not in body]
        if "image" not in body and "templateId" not in body:
            problems.append("$: 'image' is required unless 'templateId' is set")
        if not (body.get("gpu") or {}).get("pools"):
            problems.append("$.gpu.pools: at least one pool")
    if "type" in body and body["type"] not in ("QUEUE", "LOAD_BALANCER"):
        problems.append("$.type: QUEUE or LOAD_BALANCER")
    if "flashboot" in body and body["flashboot"] not in ("OFF", "FLASHBOOT", "PRIORITY_FLASHBOOT"):
        problems.append("$.flashboot: OFF, FLASHBOOT or PRIORITY_FLASHBOOT")
    workers = body.get("workers") or {}
    if set(workers) - {"min", "max", "idleTimeout"}:
        problems.append("$.workers: min, max, idleTimeout only")
    if "env" in body and not all(isinstance(v, str) for v in body["env"].values()):
        problems.append("$.env: string values")
    return problems


# ----------------------------------------------------------------------------------------------- HTTP
def _handler_class(fake: FakeRunpod) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"     # keep-alive: the client's pooled connections are reused
        disable_nagle_algorithm = True    # TCP_NODELAY, and one buffered write per answer (flushed by
        wbufsize = 1 << 16                # handle_one_request): no 40 ms Nagle/delayed-ACK stall

        def log_message(self, format: str, *args: Any) -> None:   # quiet
            pass

        def do_GET(self) -> None:
            self._dispatch("GET")

        def do_POST(self) -> None:
            self._dispatch("POST")

        def do_PATCH(self) -> None:
            self._dispatch("PATCH")

        def do_DELETE(self) -> None:
            self._dispatch("DELETE")

        def _send(self, status: int, body: Any = None, headers: dict[str, str] | None = None) -> None:
            data = b"" if body is None else json.dumps(body).encode()
            self.send_response(status)
            if body is not None:
                ctype = "application/problem+json" if isinstance(body, dict) and "title" in body \
                    else "application/json"
                self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> Any:
            n = int(self.headers.get("Content-Length") or 0)
            if not n:
                return {}
            return json.loads(self.rfile.read(n) or b"{}")

        def _dispatch(self, method: str) -> None:
            url = urlsplit(self.path)
            parts = [p for p in url.path.split("/") if p]
            try:
                body = self._body()
            except json.JSONDecodeError:
                return self._send(400, {"error": "the body is not JSON"})
            fake.requests += 1
            if parts[:1] == ["_fake"]:
                return self._fake_route(method, parts[1:], body, parse_qs(url.query))
            auth = self.headers.get("Authorization", "")
            if auth not in (f"Bearer {fake.api_key}", fake.api_key):
                return self._send(401, {"error": "Unauthorized"})
            if parts[:2] == ["v2", "serverless"]:
                return self._mgmt(method, parts[2:], body)
            if parts == ["v2", "billing", "serverless"] and method == "GET":
                if self._inject("billing"):
                    return None
                return self._send(*fake.billing(parse_qs(url.query)))
            if len(parts) >= 3 and parts[0] == "v2" and parts[2] in JOB_ROUTES:
                return self._job_route(method, parts[1], parts[2], parts[3:], body)
            return self._send(404, {"error": f"no route {method} {url.path}"})

        def _inject(self, route: str) -> bool:
            fault = fake._injected(route)
            if fault is None:
                return False
            status, retry_after = fault
            headers = {"Retry-After": f"{retry_after:g}"} if retry_after is not None else None
            self._send(status, {"error": f"injected HTTP {status}"}, headers)
            return True

        def _job_route(self, method: str, ep: str, route: str, rest: list[str], body: Any) -> None:
            if ep != fake.endpoint_id and ep not in fake.endpoints:   # managed endpoints share the queue
                return self._send(404, {"error": f"endpoint {ep} not found"})
            if self._inject(route):
                return None
            expected = "GET" if route in ("status", "stream", "health") else "POST"
            if method != expected:
                return self._send(405, {"error": f"{route} takes {expected}"})
            if route == "run":
                if not isinstance(body, dict) or "input" not in body:
                    return self._send(400, {"error": "the body needs 'input'"})
                queued = fake.submit(body, ep)
                with fake.cond:
                    lose = fake.faults.lose > 0
                    fake.faults.lose -= int(lose)
                if lose:   # queued, and the answer is lost on the way (a proxy's 502)
                    return self._send(502, {"error": "injected HTTP 502 after queueing"})
                return self._send(200, queued)
            if route == "health":
                return self._send(200, fake.health())
            if route == "purge-queue":
                return self._send(200, fake.purge())
            if route == "runsync" or not rest:
                return self._send(404, {"error": f"{route} is not served by this fake"})
            job_id = rest[0]
            if route == "retry":
                return self._send(*fake.retry(job_id))
            if route == "cancel":
                out = fake.cancel(job_id)
                return self._send(200, out) if out else self._send(404, {"error": f"job {job_id} not found"})
            with fake.cond:
                job = fake.jobs.get(job_id)
                view = job.view() if job else None
            if view is None:
                return self._send(404, {"error": f"job {job_id} not found"})
            if route == "stream":
                return self._send(200, {"status": view["status"], "stream": []})
            return self._send(200, view)

        def _mgmt(self, method: str, rest: list[str], body: Any) -> None:
            if self._inject("serverless"):
                return None
            if not rest:
                if method == "GET":
                    with fake.cond:
                        return self._send(200, {"endpoints": [_public(r) for r in fake.endpoints.values()]})
                if method == "POST":
                    return self._send(*fake.mgmt_create(body))
            elif len(rest) == 1:
                if method == "GET":
                    with fake.cond:
                        rec = fake.endpoints.get(rest[0])
                    return self._send(200, _public(rec)) if rec else self._send(
                        404, _problem(404, "Not Found", "endpoint not found"))
                if method == "PATCH":
                    return self._send(*fake.mgmt_update(rest[0], body))
                if method == "DELETE":
                    with fake.cond:
                        gone = fake.endpoints.pop(rest[0], None)
                    return self._send(204) if gone else self._send(
                        404, _problem(404, "Not Found", "endpoint not found"))
            elif rest[1:] == ["workers"] and method == "GET":
                return self._send(*fake.mgmt_workers(rest[0]))
            return self._send(405, _problem(405, "Method Not Allowed", f"{method} /v2/serverless/{rest}"))

        def _fake_route(self, method: str, parts: list[str], body: Any, query: dict[str, list[str]]) -> None:
            if parts == ["faults"] and method == "POST":
                fake.apply_faults(body)
                return self._send(200, {"ok": True})
            if len(parts) >= 3 and parts[0] == "worker":
                index, action = int(parts[1]), parts[2]
                if action == "take":
                    job = fake._take(index, float(query.get("wait", ["1"])[0]))
                    return self._send(200, {"id": job.id, "input": job.input} if job else {})
                job_id = parts[3]
                if action == "progress":
                    go_on = fake.worker_progress(index, job_id, body.get("output"))
                    return self._send(200, {"continue": go_on})
                if action == "done":
                    fake.worker_done(index, job_id, body.get("output"), body.get("error"))
                    return self._send(200, {})
            return self._send(404, {"error": "no such fake route"})

    return Handler


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass


@contextmanager
def start_fake_runpod(**kwargs: Any) -> Iterator[FakeRunpod]:
    """A started :class:`FakeRunpod`; on exit it is stopped and no worker process is left."""
    fake = FakeRunpod(**kwargs).start()
    try:
        yield fake
    finally:
        fake.stop()


@contextmanager
def fakes() -> Iterator[Callable[..., FakeRunpod]]:
    """A factory of started fakes (``make(**FakeRunpod arguments)``), all stopped on exit. A test module's
    fixture: ``@pytest.fixture def fake_runpod(): with fakes() as make: yield make``."""
    started: list[FakeRunpod] = []

    def make(**kwargs: Any) -> FakeRunpod:
        started.append(FakeRunpod(**kwargs).start())
        return started[-1]

    try:
        yield make
    finally:
        errors = []
        for fake in started:
            try:
                fake.stop()
            except RuntimeError as e:
                errors.append(str(e))
        if errors:
            raise RuntimeError("; ".join(errors))


# ------------------------------------------------------------------------------------ the worker process
def _post(url: str, body: Any, timeout: float = 30.0) -> Any:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read() or b"{}")


def worker_main(base: str, index: int) -> int:
    """One worker: take a job, run ``gpu.runpod_handler.handle_input`` on its input with a progress callback
    that posts to the fake (and learns of a cancel or timeout), post the output or the error."""
    from gpu import runpod_handler

    me = f"{base}/_fake/worker/{index}"
    while True:
        try:
            with urllib.request.urlopen(f"{me}/take?wait=1", timeout=30) as r:
                job = json.loads(r.read() or b"{}")
        except OSError:
            return 0          # the fake is gone
        if not job.get("id"):
            continue
        cancel = threading.Event()
        job_url = f"{me}/progress/{job['id']}"

        def progress(msg: Any, url: str = job_url, flag: threading.Event = cancel) -> None:
            if not _post(url, {"output": msg}).get("continue", True):
                flag.set()

        def watch(url: str = job_url, flag: threading.Event = cancel) -> None:
            while not flag.wait(0.25):
                try:
                    if not _post(url, {"output": None}).get("continue", True):
                        flag.set()
                except OSError:
                    flag.set()

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        output, error = None, None
        try:
            output = runpod_handler.handle_input(job["input"] or {}, progress=progress, cancel=cancel)
        except Exception as e:  # the SDK marks the request FAILED with the exception's text
            error = f"{type(e).__name__}: {e}"
        finally:
            cancel.set()
        try:
            _post(f"{me}/done/{job['id']}", {"output": output, "error": error})
        except OSError:
            return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", nargs=2, metavar=("URL", "INDEX"))
    ap.add_argument("--serve", action="store_true", help="run a fake until Ctrl-C")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--instant", action="store_true")
    args = ap.parse_args(argv)
    if args.worker:
        return worker_main(args.worker[0], int(args.worker[1]))
    with start_fake_runpod(workers=args.workers, instant=args.instant) as fake:
        print(f"fake Runpod at {fake.job_base_url}, endpoint {fake.endpoint_id}", flush=True)
        try:
            for _ in itertools.count():
                time.sleep(1)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
