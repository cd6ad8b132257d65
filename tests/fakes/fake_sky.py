"""A fake of SkyPilot's SDK boundary (skypilot 0.14.1, the version the ``skypilot`` extra pins): the calls
:class:`fleet.skypilot_engine.SkySDK` makes, with a pool of N workers that run each managed job's ``run``
command as a real process (``bash -c 'python -m gpu.worker --request-env AIT_REQUEST'``, the task's
``envs`` in its environment), or, with ``instant=True``, make up the handler's output after ``job_s``.

What it fakes, and where the real behaviour is written (files of skypilot 0.14.1):

- ``sky.Task.from_yaml_config(config)`` (``sky/task.py``): the REAL parser when skypilot is installed (so
  every task the engine launches here is checked by SkyPilot's own schema), else a check of the keys the
  engine uses;
- ``sky.get(request_id)`` (``sky/client/sdk.py`` ``get``): every SDK call returns a request id; ``get``
  returns the request's result or raises its error;
- ``sky.jobs.launch(task, name=, pool=)`` (``sky/jobs/client/sdk.py``): result ``(job_ids, handle)``; the
  job is PENDING until a worker is free (pools: "jobs are queued to the pool and assigned to workers as
  they free up");
- ``sky.jobs.queue_v2(refresh, skip_finished, job_ids, fields, name_match)`` (``sky/jobs/client/sdk.py``):
  result ``(records, total, status_counts, total_no_filter)``, records with the ``ManagedJobRecord`` fields
  the engine reads (``sky/schemas/api/responses.py``): ``job_id``, ``job_name``, ``status``
  (``ManagedJobStatus`` values, ``sky/jobs/state.py``), ``job_duration`` (running time summed over
  recoveries, ``sky/jobs/state.py`` "total_job_duration"), ``recovery_count``, ``failure_reason``,
  ``current_cluster_name``;
- ``sky.jobs.cancel(job_ids=)``: the job's process is killed, CANCELLED;
- ``sky.jobs.tail_logs(job_id=, follow=False, output_stream=)``: the job's log so far (the run's stdout);
- ``sky.jobs.pool_apply/pool_status/pool_down`` (``sky/jobs/client/sdk.py``): the pool's workers;
- ``sky.cost_report(days)`` (``sky/client/sdk.py``, computed in ``sky/core.py``): the pool's worker clusters
  ``<pool>-<replica id>`` up from the fake's start to its close or ``pool_down``, at ``worker_usd_per_h``.

Statuses a job goes through here: PENDING → STARTING → RUNNING → SUCCEEDED (exit 0) | FAILED (non-zero
exit, ``failure_reason``) | CANCELLED; a worker lost mid-job: RECOVERING (``recovery_count`` + 1) and PENDING
again at the head of the queue when ``recover`` (SkyPilot's ``job_recovery``), else FAILED_CONTROLLER with
"cluster lost" (an ASSUMPTION: which FAILED_* a lost worker with no recovery left ends in is not in the
source the fake was built from; the engine maps every FAILED_* the same way). Fault knobs: ``kill_next(count, after_s,
recover)``, ``set_capacity(n)`` (only n workers can be up: 0 = the pool cannot scale, jobs stay PENDING),
``lose_launch_answers(count)`` (the launch is accepted, then ``get`` raises: the answer is lost), and
``forget(job_id)`` (the queue no longer lists it).
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from fleet.skypilot_engine import REQUEST_ENV, decode_request, result_lines

TERMINAL = {"SUCCEEDED", "FAILED", "FAILED_SETUP", "FAILED_PRECHECKS", "FAILED_NO_RESOURCE",
            "FAILED_CONTROLLER", "CANCELLED"}


def real_task_parser() -> Any | None:
    try:
        import sky  # type: ignore[import-not-found]
    except ImportError:
        return None
    return sky.Task


class _Task:
    """``sky.Task.from_yaml_config`` stand-in: the real one when installed (module docstring)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config

    @classmethod
    def from_yaml_config(cls, config: dict[str, Any]) -> _Task:
        real = real_task_parser()
        if real is not None:
            real.from_yaml_config(dict(config))
        else:
            unknown = set(config) - {"name", "resources", "envs", "secrets", "run", "setup", "pool", "file_mounts"}
            if unknown or not isinstance(config.get("run", ""), str):
                raise ValueError(f"Invalid task YAML: unknown keys {sorted(unknown)}")
        return cls(config)


@dataclass
class _Job:
    job_id: int
    name: str
    config: dict[str, Any]
    status: str = "PENDING"
    log: list[str] = field(default_factory=list)
    duration: float = 0.0
    started: float | None = None
    recovery_count: int = 0
    failure_reason: str | None = None
    worker: int | None = None
    runs: int = 0


class FakeSky:
    """The fake ``sky`` module: ``Task``, ``get``, ``jobs`` (see the module docstring)."""

    def __init__(self, workers: int = 2, *, instant: bool = False, job_s: float = 0.05,
                 worker_env: dict[str, str] | None = None, instant_output: Callable[[dict[str, Any]], dict[str, Any]]
                 | None = None, pool: str = "ait-workers", worker_usd_per_h: float = 0.27) -> None:
        self.Task = _Task
        self.jobs = _Jobs(self)
        #: ``sky.serve.UpdateMode`` (sky/serve/serve_utils.py: ROLLING = 'rolling', BLUE_GREEN = 'blue_green')
        self.serve = SimpleNamespace(UpdateMode=SimpleNamespace(ROLLING="rolling", BLUE_GREEN="blue_green"))
        self.instant, self.job_s, self.worker_env = instant, job_s, worker_env
        self.instant_output = instant_output
        self.pool_name = pool
        #: ``sky.cost_report`` prices each worker cluster at this $/h over its time up (from now to close/down)
        self.worker_usd_per_h, self.up_at, self.down_at = worker_usd_per_h, time.time(), None
        self.other_clusters: list[dict[str, Any]] = []   # cost records of clusters that are not the pool's
        self.pools: dict[str, dict[str, Any]] = {}
        self._lock = threading.RLock()
        self._requests: dict[str, tuple[Any, BaseException | None]] = {}
        self._req_ids = itertools.count(1)
        self._job_ids = itertools.count(1)
        self.jobs_by_id: dict[int, _Job] = {}
        self.queue: deque[int] = deque()
        self.capacity = workers
        self._kill: list[tuple[float, bool]] = []
        self._lose_launch = 0
        self._refuse = 0
        self._procs: dict[int, subprocess.Popen[str]] = {}
        self._cancel: dict[int, threading.Event] = {}
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._work, args=(i,), daemon=True) for i in range(workers)]
        for t in self._threads:
            t.start()

    # ------------------------------------------------------------------ requests (sky/client/sdk.py get)
    def _request(self, fn: Callable[[], Any]) -> str:
        rid = f"req-{next(self._req_ids)}"
        try:
            self._requests[rid] = (fn(), None)
        except BaseException as exc:  # noqa: BLE001 - get() raises it, as the real one does
            self._requests[rid] = (None, exc)
        return rid

    def get(self, request_id: str) -> Any:
        value, exc = self._requests.pop(request_id)
        if exc is not None:
            raise exc
        return value

    # ------------------------------------------------------------------ faults
    def kill_next(self, count: int = 1, after_s: float = 0.5, recover: bool = True) -> None:
        """The worker that takes each of the next ``count`` jobs is lost ``after_s`` into it."""
        with self._lock:
            self._kill += [(after_s, recover)] * count

    def set_capacity(self, n: int) -> None:
        """At most ``n`` workers can be up (0: the pool cannot scale; jobs stay PENDING)."""
        with self._lock:
            self.capacity = n

    def refuse_connection(self, count: int = 1) -> None:
        """The next ``count`` launches fail the SDK's health check (``ApiServerConnectionError``, a
        RuntimeError: sky/exceptions.py), before any request is sent."""
        with self._lock:
            self._refuse += count

    def lose_launch_answers(self, count: int = 1) -> None:
        with self._lock:
            self._lose_launch += count

    def forget(self, job_id: int) -> None:
        with self._lock:
            self.jobs_by_id.pop(job_id, None)

    def launches(self) -> int:
        return len(self.jobs_by_id)

    def runs_of(self, job_id: int) -> int:
        return self.jobs_by_id[job_id].runs

    # ------------------------------------------------------------------ workers
    def _take(self, index: int) -> tuple[_Job, tuple[float, bool] | None] | None:
        with self._lock:
            if index >= self.capacity or not self.queue:
                return None
            job = self.jobs_by_id.get(self.queue.popleft())
            if job is None or job.status != "PENDING":
                return None
            job.status, job.worker, job.started = "RUNNING", index, time.time()
            job.runs += 1
            kill = self._kill.pop(0) if self._kill else None
            self._cancel[job.job_id] = threading.Event()
            return job, kill

    def _work(self, index: int) -> None:
        while not self._stop.is_set():
            taken = self._take(index)
            if taken is None:
                time.sleep(0.02)
                continue
            job, kill = taken
            if kill is not None:
                threading.Timer(kill[0], self._lose_worker, args=(job, kill[1])).start()
            code, out = self._run(job)
            with self._lock:
                if job.status != "RUNNING" or job.worker != index:   # lost, cancelled meanwhile
                    continue
                job.duration += time.time() - (job.started or time.time())
                job.log += out
                if code == 0:
                    job.status = "SUCCEEDED"
                else:
                    job.status, job.failure_reason = "FAILED", f"the run command exited {code}"

    def _run(self, job: _Job) -> tuple[int, list[str]]:
        envs = job.config.get("envs") or {}
        if self.instant:
            if self._cancel[job.job_id].wait(self.job_s):
                return -9, []
            body = decode_request(envs[REQUEST_ENV])
            assert self.instant_output is not None
            return 0, ["ait worker: instant", *result_lines(self.instant_output(body))]
        secrets = job.config.get("secrets") or {}   # task secrets reach the run as env vars too (sky/task.py)
        env = {**(self.worker_env or os.environ), **{k: str(v) for k, v in {**envs, **secrets}.items()}}
        env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
        proc = subprocess.Popen(["bash", "-c", job.config["run"]], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                cwd=str(Path(__file__).resolve().parents[2]))
        with self._lock:
            self._procs[job.job_id] = proc
        out, _ = proc.communicate()
        with self._lock:
            self._procs.pop(job.job_id, None)
        return proc.returncode, out.splitlines()

    def _kill_run(self, job: _Job) -> None:
        self._cancel.get(job.job_id, threading.Event()).set()
        proc = self._procs.get(job.job_id)
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _lose_worker(self, job: _Job, recover: bool) -> None:
        """The job's worker is lost: SkyPilot recovers the job (RECOVERING, then queued again) or fails it."""
        with self._lock:
            if job.status != "RUNNING":
                return
            job.duration += time.time() - (job.started or time.time())
            job.worker = None
            if recover:
                job.status, job.recovery_count = "RECOVERING", job.recovery_count + 1
            else:
                job.status, job.failure_reason = "FAILED_CONTROLLER", "the job's cluster was lost (no recovery left)"
        self._kill_run(job)
        if recover:
            time.sleep(0.05)
            with self._lock:
                if job.status == "RECOVERING":
                    job.status = "PENDING"
                    self.queue.appendleft(job.job_id)

    def cost_report(self, days: int | None = None) -> str:
        """``sky.cost_report(days)`` (sky/client/sdk.py -> sky/core.py ``cost_report``): a record per cluster,
        the pool's workers named ``<pool>-<replica id>`` (sky/serve/serve_utils.py), usage intervals in whole
        epoch seconds (an open one: ``None``), ``total_cost`` = price x duration x nodes; plus
        :attr:`other_clusters` as given."""
        def run() -> list[dict[str, Any]]:
            start, end = int(self.up_at), int(self.down_at) if self.down_at is not None else None
            duration = (end if end is not None else int(time.time())) - start
            return [{"name": f"{self.pool_name}-{i + 1}", "launched_at": start, "duration": duration,
                     "num_nodes": 1, "usage_intervals": [(start, end)], "status": None,
                     "total_cost": self.worker_usd_per_h * duration / 3600} for i in range(self.capacity)] \
                + [dict(r) for r in self.other_clusters]
        return self._request(run)

    def close(self) -> None:
        if self.down_at is None:
            self.down_at = time.time()
        self._stop.set()
        with self._lock:
            jobs = list(self.jobs_by_id.values())
        for j in jobs:
            self._kill_run(j)
        for t in self._threads:
            t.join(10)


class ApiServerConnectionError(RuntimeError):
    """sky/exceptions.py ``ApiServerConnectionError`` (a RuntimeError), matched by name as the engine does."""


class _Jobs:
    """``sky.jobs`` (sky/jobs/client/sdk.py)."""

    def __init__(self, fake: FakeSky) -> None:
        self.f = fake

    def launch(self, task: _Task, name: str | None = None, pool: str | None = None, num_jobs: int | None = None) -> str:
        f = self.f
        with f._lock:
            if f._refuse > 0:
                f._refuse -= 1
                raise ApiServerConnectionError("Could not connect to SkyPilot API server at http://127.0.0.1:46580")

        def run() -> Any:
            if pool is not None and f.pools and pool not in f.pools:
                raise ValueError(f"Pool {pool!r} not found.")
            with f._lock:
                jid = next(f._job_ids)
                f.jobs_by_id[jid] = _Job(jid, name or "", task.config)
                f.queue.append(jid)
                lose = f._lose_launch > 0
                f._lose_launch -= lose
            if lose:
                raise ConnectionResetError("the API server closed the connection")
            return [jid], None

        return f._request(run)

    def queue_v2(self, refresh: bool, skip_finished: bool = False, all_users: bool = False,
                 job_ids: list[int] | None = None, limit: int | None = None, fields: Any = None,
                 name_match: str | None = None, **_: Any) -> str:
        f = self.f

        def run() -> Any:
            with f._lock:
                now = time.time()
                recs = []
                for j in f.jobs_by_id.values():
                    if job_ids is not None and j.job_id not in job_ids:
                        continue
                    if name_match is not None and name_match not in j.name:
                        continue
                    live = now - j.started if j.status == "RUNNING" and j.started else 0.0
                    recs.append({"job_id": j.job_id, "job_name": j.name, "status": j.status,
                                 "job_duration": j.duration + live, "recovery_count": j.recovery_count,
                                 "failure_reason": j.failure_reason, "pool": f.pool_name,
                                 "current_cluster_name": f"{f.pool_name}-{j.worker}" if j.worker is not None
                                 else None})
            return recs, len(recs), {}, len(f.jobs_by_id)

        return f._request(run)

    def cancel(self, name: str | None = None, job_ids: list[int] | None = None, **_: Any) -> str:
        f = self.f

        def run() -> None:
            for jid in job_ids or []:
                with f._lock:
                    j = f.jobs_by_id.get(jid)
                    if j is None or j.status in TERMINAL:
                        continue
                    if j.status == "RUNNING" and j.started:
                        j.duration += time.time() - j.started
                    j.status, j.worker = "CANCELLED", None
                f._kill_run(j)

        return f._request(run)

    def tail_logs(self, name: str | None = None, job_id: int | None = None, follow: bool = True,
                  output_stream: Any = None, **_: Any) -> int | None:
        with self.f._lock:
            j = self.f.jobs_by_id[int(job_id)]  # type: ignore[arg-type]
            text = "\n".join(j.log) + "\n"
        output_stream.write(text)
        return None

    def pool_apply(self, task: _Task, pool_name: str, mode: Any = None, workers: int | None = None) -> str:
        def run() -> None:
            self.f.pools[pool_name] = task.config
        return self.f._request(run)

    def pool_status(self, pool_names: Any) -> str:
        f = self.f

        def run() -> Any:
            if pool_names not in f.pools:
                return []
            with f._lock:
                busy = {j.worker for j in f.jobs_by_id.values() if j.status == "RUNNING"}
            return [{"name": pool_names, "status": "READY", "replica_info": [
                {"replica_id": i + 1, "status": "READY", "used_by": i in busy} for i in range(f.capacity)]}]
        return f._request(run)

    def pool_down(self, pool_names: Any, all: bool = False, purge: bool = False) -> str:
        def run() -> None:
            self.f.pools.pop(pool_names, None)
            self.f.down_at = time.time()
        return self.f._request(run)
