"""A fake Runpod Serverless endpoint behind the interface of :class:`fleet.runpod_api.ServerlessClient`
(``run``, ``status``, ``status_many``, ``cancel``), for the runpod backend's tests and benchmark.

Jobs go IN_QUEUE -> IN_PROGRESS -> a final state as they are polled (``polls_to_finish`` status calls; 1:
the first poll sees the end). What happens to a job is its **outcome**, chosen at ``run`` by ``plan(input,
n)`` (``n``: how many times a bundle with that job id was sent so far, from 1):

- ``ok``: COMPLETED with the handler's output. ``instant`` mode makes it up (a succeeded JobResult whose
  score is a hash of the job id, on ``gpus`` of the fake's image ``revision``); ``real`` mode runs the
  real handler (:func:`gpu.runpod_handler.handle_input`) in a pool of ``workers`` local processes;
- ``job_failed``: COMPLETED, the worker says the job failed; ``lost``: FAILED without output (a worker
  lost); ``timed_out``: TIMED_OUT; ``expired``: COMPLETED, but every status call answers 404
  (:class:`ResultExpired`); ``non_replica``: COMPLETED by a worker of another image revision; ``stuck``:
  IN_QUEUE until cancelled (no worker ever takes it).

``errors["run"]`` (or ``"status"``, ``"cancel"``): the HTTP statuses the next such calls answer, past the
client's retries (e.g. ``[429, 503]``; 0: no connection); a 5xx on ``run`` is :class:`SubmitUncertain`, as
the real client raises it.
State is in memory, or in a SQLite file (``path``) that several processes share (an orchestrator killed
and restarted against one "Runpod").

**Time mode** (``clock=``, a function of the current time; the property tests pass a simulated one): a job
is no longer advanced by polls but by time, as Runpod's are. It waits ``delay`` (queue and cold start;
``timing(input, n) -> (delay_s, execution_s)``, default ``delay_ms``/``execution_ms``), runs
``execution`` and ends by its outcome (``lost``: the worker dies ``lost_at`` of the way through, FAILED;
``expired``: its result is gone at once). A request's ``policy`` is honoured: past ``executionTimeout``
it is TIMED_OUT, past ``ttl`` it is gone (404, and it stops: send-requests.mdx "TTL vs. execution
timeout"). A finished result is kept ``result_ttl_s`` (Runpod: 30 min for ``/run``), then 404. Faults:
``outage(route, start, end)`` (every ``status``/``cancel``/``run`` call in ``[start, end)`` answers 503;
a ``run`` then queues nothing; ``outage_until_resend(route)``: from now until a job is sent again after a cancel), ``lose_answers(n)`` (the next ``n`` run calls **queue the job** and then
raise :class:`SubmitUncertain`, a 5xx whose job is queued unseen), ``reused_ids`` (the next ``n`` run calls
queue the job and answer with an id given before), ``lost`` (worker death). **Billing**
(:meth:`bill`, :meth:`bills`) is Runpod's rule: a job a worker took is billed from its creation (the delay
is billed whole, as if it were all cold start: the journal's own figure) to its end, cancel or ttl, rounded
up to a whole second, plus the idle timeout unless it TIMED_OUT, x ``rate_usd_per_s``; a job cancelled or
deleted before a worker took it costs nothing.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import multiprocessing
import sqlite3
import tarfile
import threading
import uuid
import math
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any, Literal

from fleet.runpod_api import ResultExpired, RunpodAPIError, RunpodJob, SubmitUncertain

Outcome = Literal["ok", "job_failed", "lost", "timed_out", "expired", "non_replica", "stuck"]
GPUS = ["NVIDIA RTX A5000 (24564 MiB)", "NVIDIA RTX A5000 (24564 MiB)"]
DELAY_MS, EXECUTION_MS = 2_000, 60_000


FINAL = ("COMPLETED", "FAILED", "TIMED_OUT", "CANCELLED")
#: how a status's billing fields can be wrong (the answer is the provider's, untrusted)
BILLING_FAULTS = ("missing", "null", "string", "negative", "nan", "huge", "bool", "delay_negative")


def garble(view: dict[str, Any], fault: str) -> None:
    """Garble ``view``'s billing fields as ``fault`` says (:data:`BILLING_FAULTS`)."""
    if fault == "missing":
        view.pop("executionTime", None)
    elif fault == "null":
        view["executionTime"] = None
    elif fault == "string":
        view["executionTime"] = "about a minute"
    elif fault == "negative":
        view["executionTime"] = -abs(int(view.get("executionTime") or 0)) - 600_000
    elif fault == "nan":
        view["executionTime"] = float("nan")
    elif fault == "huge":
        view["executionTime"] = 10 ** 15
    elif fault == "bool":
        view["executionTime"] = True
    elif fault == "delay_negative":
        view["delayTime"] = -(10 ** 9)
    else:
        raise ValueError(f"unknown billing fault {fault!r}; choose from {BILLING_FAULTS}")


def bundle_job_id(payload: dict[str, Any]) -> str:
    """The job id in a job request's packed bundle (a baseline request: ``baseline-<family>-<model>``)."""
    if payload.get("kind") == "baseline":
        return f"baseline-{payload.get('family')}-{payload.get('model')}"
    raw = base64.b64decode(payload["bundle"])
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:gz") as tar:
        f = tar.extractfile("manifest.json")
        assert f is not None
        return str(json.loads(f.read())["job_id"])


def instant_output(payload: dict[str, Any], outcome: Outcome, revision: str,
                   job_id: str | None = None) -> dict[str, Any]:
    """What the handler would answer, made up at once (see the module docstring)."""
    job_id = job_id or bundle_job_id(payload)
    worker = {"image_revision": "other-image" if outcome == "non_replica" else revision, "executor": "gpu",
              "versions": {"train:verifiers": "0.2.0"}, "gpus": GPUS, "selfcheck": "ok"}
    if payload.get("kind") == "baseline":
        entry = {"backend": payload["settings"]["name"], "family": payload["family"],
                 "model": payload["model"], "score": 0.25, "ci95": 0.05, "n": 100}
        return {"kind": "baseline", "result": {"status": "succeeded", "entry": entry, "worker": worker},
                "tag": payload.get("tag")}
    score = int(hashlib.sha256(job_id.encode()).hexdigest()[:6], 16) / 0xFFFFFF
    result = {"job_id": job_id, "backend": payload["settings"]["name"],
              "status": "job_failed" if outcome == "job_failed" else "succeeded",
              "post_score": None if outcome == "job_failed" else round(score, 6),
              "baselines": {"Qwen/Qwen3-0.6B": 0.1, "Qwen/Qwen3-1.7B": 0.2},
              "wall_seconds": 60.0, "train_seconds": 50.0, "error": "the job's rubric raised" if
              outcome == "job_failed" else "", "worker": worker}
    return {"kind": "job", "result": result, "tag": payload.get("tag"), "baselines": []}


class _Store:
    """Jobs by id: in memory, or in a SQLite file shared by processes."""

    def __init__(self, path: Path | None) -> None:
        self.path, self._mem, self._lock = path, {}, threading.Lock()
        self._local = threading.local()
        if path is not None:
            self._db().execute("CREATE TABLE IF NOT EXISTS jobs (id TEXT PRIMARY KEY, bundle TEXT, "
                               "data TEXT)")

    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.path, timeout=60, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            self._local.db = db
        return db

    def put(self, job: dict[str, Any]) -> None:
        if self.path is None:
            with self._lock:
                self._mem[job["id"]] = job
        else:
            self._db().execute("INSERT OR REPLACE INTO jobs VALUES (?, ?, ?)",
                               (job["id"], job["bundle"], json.dumps(job)))

    def get(self, job_id: str) -> dict[str, Any] | None:
        if self.path is None:
            with self._lock:
                return self._mem.get(job_id)
        row = self._db().execute("SELECT data FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return json.loads(row[0]) if row else None

    def all(self) -> list[dict[str, Any]]:
        if self.path is None:
            with self._lock:
                return list(self._mem.values())
        return [json.loads(r[0]) for r in self._db().execute("SELECT data FROM jobs")]


def _real_handler(payload: dict[str, Any]) -> dict[str, Any]:
    from gpu.runpod_handler import handle_input

    return handle_input(payload)


class FakeServerlessClient:
    """The fake endpoint and its client in one (see the module docstring)."""

    def __init__(self, path: Path | None = None, *, mode: Literal["instant", "real"] = "instant",
                 plan: Callable[[dict[str, Any], int], Outcome] | None = None, polls_to_finish: int = 1,
                 revision: str = "rev-1", workers: int = 2, delay_ms: int = DELAY_MS,
                 execution_ms: int = EXECUTION_MS, store_input: bool = True,
                 clock: Callable[[], float] | None = None,
                 timing: Callable[[dict[str, Any], int], tuple[float, float]] | None = None,
                 result_ttl_s: float = 1800.0, idle_timeout_s: float = 5.0, lost_at: float = 0.5,
                 rate_usd_per_s: float = 0.00019 * 2) -> None:
        self.store = _Store(path)
        self.mode, self.plan, self.polls_to_finish = mode, plan, polls_to_finish
        self.revision, self.delay_ms, self.execution_ms = revision, delay_ms, execution_ms
        self.store_input = store_input
        self.clock, self.timing, self.result_ttl_s = clock, timing, result_ttl_s
        self.idle_timeout_s, self.lost_at, self.rate_usd_per_s = idle_timeout_s, lost_at, rate_usd_per_s
        #: time mode: (route, start, end) windows in which that route answers 503
        self.outages: list[tuple[str, float, float]] = []
        self._until_resend: list[int] = []   # indexes of outages the first run after a cancel ends
        #: run calls left that queue the job and then lose the answer (SubmitUncertain)
        self.lost_answers = 0
        #: run calls left that queue the job under a new id but answer with the first id this fake ever gave
        #: (a provider that reuses an id: issue 47)
        self.reused_ids = 0
        self._given: list[str] = []
        #: per call, seconds the next calls take before answering (a Retry-After the client sleeps out; cut
        #: short by release())
        self.delays: dict[str, list[float]] = {"run": [], "status": [], "cancel": []}
        self._released = threading.Event()
        #: per call ("run", "status", "cancel"): the HTTP statuses the next calls raise (past the client's
        #: retries)
        self.errors: dict[str, list[int]] = {"run": [], "status": [], "cancel": []}
        #: time mode: a job's input -> how its final status's billing fields are garbled (BILLING_FAULTS) or
        #: None; the fake's own bill stays Runpod's rule (what the provider really charges)
        self.billing_fault: Callable[[dict[str, Any]], str | None] | None = None
        self.calls = {"run": 0, "status": 0, "cancel": 0}
        self._lock = threading.Lock()
        self._pool = (ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
                      if mode == "real" else None)
        self._futures: dict[str, Future[dict[str, Any]]] = {}
        self._payloads: dict[str, dict[str, Any]] = {}

    # ------------------------------------------------------------------ fault knobs (time mode)
    def outage(self, route: str, start: float, end: float) -> None:
        """``route`` ("status", "cancel", "run") answers 503 from ``start`` to ``end`` (the fake's clock)."""
        self.outages.append((route, start, end))

    def outage_until_resend(self, route: str) -> None:
        """``route`` answers 503 from now until a job is sent again after a cancel (the ``run`` call that
        follows the first ``cancel`` ends it): an outage that outlasts an attempt's deadline and its cancel
        however slowly this machine runs, where a window of seconds against a deadline of seconds is a race
        on a busy machine (issue 46)."""
        assert self.clock is not None, "outages need the fake's time mode (clock=)"
        self.outages.append((route, self.clock(), math.inf))
        self._until_resend.append(len(self.outages) - 1)

    def release(self) -> None:
        """End every pause of ``delays`` now (a test's clean-up)."""
        self._released.set()

    def lose_answers(self, count: int = 1) -> None:
        """The next ``count`` run calls queue their job, then raise SubmitUncertain (the answer is lost)."""
        self.lost_answers += count

    def _maybe_error(self, what: str) -> None:
        with self._lock:
            self.calls[what] += 1
            status = self.errors[what].pop(0) if self.errors[what] else None
            pause = self.delays[what].pop(0) if self.delays[what] else 0.0
        if pause:
            self._released.wait(pause)
        if status is None and self.clock is not None:
            now = self.clock()
            if any(r == what and a <= now < b for r, a, b in self.outages):
                status = 503
        if status is not None:
            # as fleet.runpod_api does: a 5xx on /run may have queued a job (SubmitUncertain)
            cls = SubmitUncertain if what == "run" and status >= 500 else RunpodAPIError
            raise cls(f"{what}: HTTP {status} (fake, past the client's retries)", status, "fake")

    # ------------------------------------------------------------------ the client interface
    def run(self, input: dict[str, Any], *, execution_timeout_s: float | None = None,  # noqa: A002
            ttl_s: float | None = None) -> str:
        self._maybe_error("run")
        if self._until_resend and self.calls["cancel"] and self.clock is not None:
            now = self.clock()
            for i in self._until_resend:
                route, start, _ = self.outages[i]
                self.outages[i] = (route, start, now)
            self._until_resend.clear()
        bundle = bundle_job_id(input)
        sent = sum(1 for j in self.store.all() if j["bundle"] == bundle) + 1 if self.plan or self.timing else 1
        outcome: Outcome = self.plan(input, sent) if self.plan else "ok"
        job_id = f"fake-{uuid.uuid4().hex[:16]}"
        job: dict[str, Any] = {"id": job_id, "bundle": bundle, "outcome": outcome, "polls": 0,
                               "cancelled": False, "tag": input.get("tag"),
                               "input": input if self.store_input and self.mode == "instant" else None}
        if self.clock is not None:
            delay, execution = (self.timing(input, sent) if self.timing else
                                (self.delay_ms / 1000, self.execution_ms / 1000))
            now = self.clock()
            job.update(created=now, delay=delay, execution=execution, cancel_at=None,
                       exec_timeout=execution_timeout_s, ttl=ttl_s)
        self.store.put(job)
        if self._pool is not None and outcome == "ok":
            self._futures[job_id] = self._pool.submit(_real_handler, input)
        with self._lock:
            lose = self.lost_answers > 0
            self.lost_answers -= int(lose)
            reuse = self.reused_ids > 0 and bool(self._given)
            self.reused_ids -= int(reuse)
            answer = self._given[0] if reuse else job_id
            self._given.append(job_id)
        if lose:
            raise SubmitUncertain("run: HTTP 502 after the job was queued (fake: the answer was lost)", 502,
                                  "fake")
        return answer

    # ------------------------------------------------------------------ time mode
    def _life(self, job: dict[str, Any]) -> tuple[str, float | None, float, float]:
        """(state, started, ended, gone) of a time-mode job: its state now (one of Runpod's, or "GONE"),
        when a worker took it (None: none did), when it stopped running (or now) and when its record goes.
        ``job["terminal"]`` is set to the state it ended in (before its record went)."""
        assert self.clock is not None
        now, t0 = self.clock(), job["created"]
        start = t0 + job["delay"]
        ttl_end = t0 + job["ttl"] if job.get("ttl") else math.inf
        run = job["execution"]
        final = {"ok": "COMPLETED", "job_failed": "COMPLETED", "non_replica": "COMPLETED", "expired": "COMPLETED",
                 "lost": "FAILED", "timed_out": "TIMED_OUT"}.get(job["outcome"], "COMPLETED")
        if job["outcome"] == "lost":
            run *= self.lost_at
        if job.get("exec_timeout") and run > job["exec_timeout"]:
            run, final = job["exec_timeout"], "TIMED_OUT"
        end = start + run if job["outcome"] != "stuck" else math.inf
        stop = min(end, ttl_end, job["cancel_at"] if job["cancel_at"] is not None else math.inf)
        started = start if start < stop else None
        if job["cancel_at"] is not None and job["cancel_at"] <= min(end, ttl_end):
            state = "CANCELLED"
        elif ttl_end <= end:
            state = "GONE" if now >= ttl_end else ("IN_QUEUE" if now < start else "IN_PROGRESS")
        else:
            state = final if now >= end else ("IN_QUEUE" if now < start else "IN_PROGRESS")
        job["terminal"] = state
        keep = 0.0 if job["outcome"] == "expired" else self.result_ttl_s
        gone = min(ttl_end, stop + keep) if state not in ("IN_QUEUE", "IN_PROGRESS") else ttl_end
        if now >= gone:
            state = "GONE"
        return state, started, min(stop, now), gone

    def _timed_status(self, job: dict[str, Any]) -> RunpodJob:
        state, started, stopped, _ = self._life(job)
        job_id = job["id"]
        if state == "GONE":
            raise ResultExpired(f"job {job_id}: 404 (fake: expired or ttl)", 404, "", "GET", f"/status/{job_id}")
        view: dict[str, Any] = {"id": job_id, "status": state}
        if started is not None:   # whole ms, rounded up (Runpod's rounding of these figures is not documented)
            view.update(delayTime=math.ceil(job["delay"] * 1000 - 1e-6), workerId="fake-worker-1")
            if state not in ("IN_QUEUE", "IN_PROGRESS"):
                view["executionTime"] = math.ceil((stopped - started) * 1000 - 1e-6)
        if state == "FAILED":
            view["error"] = "worker exited unexpectedly"
        if state == "COMPLETED":
            view["output"] = instant_output(job["input"], job["outcome"], self.revision, job["bundle"])
        fault = self.billing_fault(job["input"]) if self.billing_fault and state in FINAL else None
        if fault:
            garble(view, fault)
        return RunpodJob.model_validate(view)

    def bills(self) -> dict[str, float]:
        """USD per job id as Runpod would bill it so far (time mode; see the module docstring)."""
        out = {}
        for job in self.store.all():
            _, started, stopped, _ = self._life(job)
            if started is None:
                out[job["id"]] = 0.0
                continue
            seconds = math.ceil(stopped - job["created"] - 1e-9)
            idle = 0.0 if job["terminal"] in ("TIMED_OUT", "IN_QUEUE", "IN_PROGRESS") else self.idle_timeout_s
            out[job["id"]] = round((seconds + idle) * self.rate_usd_per_s, 6)
        return out

    def bill(self) -> float:
        return round(sum(self.bills().values()), 6)

    def running(self) -> list[str]:
        """Ids of time-mode jobs still queued or running."""
        return [j["id"] for j in self.store.all() if self._life(j)[0] in ("IN_QUEUE", "IN_PROGRESS")]

    def status(self, job_id: str) -> RunpodJob:
        self._maybe_error("status")
        job = self.store.get(job_id)
        if job is None:
            raise ResultExpired(f"job {job_id}: 404 (fake)", 404, "", "GET", f"/status/{job_id}")
        if self.clock is not None:
            return self._timed_status(job)
        job["polls"] += 1
        self.store.put(job)
        base = {"id": job_id, "delayTime": self.delay_ms, "workerId": "fake-worker-1"}
        if job["cancelled"]:
            if job["outcome"] == "stuck":     # no worker ever took it: nothing ran, nothing is billed
                return RunpodJob.model_validate({"id": job_id, "status": "CANCELLED"})
            return RunpodJob.model_validate({**base, "status": "CANCELLED"})
        future = self._futures.get(job_id)
        running = future is not None and not future.done()
        if job["outcome"] == "stuck":
            return RunpodJob.model_validate({"id": job_id, "status": "IN_QUEUE"})
        if job["polls"] < self.polls_to_finish or running:
            status = "IN_QUEUE" if job["polls"] == 1 and not running else "IN_PROGRESS"
            return RunpodJob.model_validate({**base, "status": status})
        outcome = job["outcome"]
        done = {**base, "executionTime": self.execution_ms}
        if outcome == "lost":
            return RunpodJob.model_validate({**done, "status": "FAILED",
                                             "error": "worker exited unexpectedly"})
        if outcome == "timed_out":
            return RunpodJob.model_validate({**done, "status": "TIMED_OUT"})
        if outcome == "expired":
            raise ResultExpired(f"job {job_id}: 404 (fake: expired)", 404, "", "GET", f"/status/{job_id}")
        if future is not None:
            try:
                output = future.result()
            except Exception as exc:  # noqa: BLE001 - the worker process died
                return RunpodJob.model_validate({**done, "status": "FAILED",
                                                 "error": f"{type(exc).__name__}"})
        else:
            output = instant_output(job["input"], outcome, self.revision, job["bundle"])
        return RunpodJob.model_validate({**done, "status": "COMPLETED", "output": output})

    def status_many(self, job_ids: list[str]) -> dict[str, RunpodJob | RunpodAPIError]:
        out: dict[str, RunpodJob | RunpodAPIError] = {}
        for i in job_ids:
            try:
                out[i] = self.status(i)
            except RunpodAPIError as exc:
                out[i] = exc
        return out

    def cancel(self, job_id: str) -> RunpodJob:
        self._maybe_error("cancel")
        job = self.store.get(job_id)
        if job is not None and self.clock is not None:
            state = self._life(job)[0]
            if state == "GONE":
                raise ResultExpired(f"job {job_id}: 404 (fake)", 404, "", "POST", f"/cancel/{job_id}")
            if state in ("IN_QUEUE", "IN_PROGRESS"):
                job["cancel_at"] = self.clock()
                self.store.put(job)
            return RunpodJob.model_validate({"id": job_id, "status": self._life(job)[0]})
        if job is not None:
            job["cancelled"] = True
            self.store.put(job)
        return RunpodJob.model_validate({"id": job_id, "status": "CANCELLED"})

    # ------------------------------------------------------------------ for the tests
    def runs_of(self, bundle: str) -> int:
        return sum(1 for j in self.store.all() if j["bundle"] == bundle)

    def total_runs(self) -> int:
        return len(self.store.all())

    def kill_workers(self) -> None:
        """Kill the real-mode worker processes (their jobs end FAILED: a worker lost mid-job)."""
        assert self._pool is not None
        for proc in list(self._pool._processes.values()):  # noqa: SLF001 - a test's crash
            proc.kill()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
