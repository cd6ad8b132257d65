"""The GPU worker: a job bundle in, ``result.json`` out. ONE code path, used three ways:

    python -m gpu.worker runs/jobs/<job_id> [--backend gpu|local] [--settings f.json] [--baselines-dir D]
    python -m gpu.worker --baseline FAMILY MODEL [--backend gpu|local] [--settings f.json] [--out f.json]
    python -m gpu.worker --serve          # the Runpod Serverless handler (runpod.serverless.start)

(a) the CLI on any machine, (b) :func:`handler`, the Runpod Serverless handler (its input: the bundle as a
base64 tar.gz, :func:`ait_env.jobs.wire.pack_bundle`, plus the run settings; its output: the result; progress through the
SDK's ``progress_update``), (c) with the local tiny-model executor (``--backend local``) in tests. The
``gpu-local`` backend (:mod:`ait_env.backends.gpu_local`) runs the CLI in a subprocess.

Inside, :class:`Worker` does for every request (a job, or a **baseline**: an untrained model measured on a
family's hidden set through the executor's ``measure_base``):

1. the **self-check** (:mod:`gpu.selfcheck`, once per executor and process): a worker that is not what was
   pinned (versions, GPUs, model files, the image revision the caller requires) answers ``infra_failed``
   with the reason, and never runs the job;
2. the **runner in a child process** (``python -m gpu.worker --child``), with :func:`gpu.isolation.runner_env`
   (no credentials), a private temporary folder (mode 0700: the eval's records), a private copy of the
   secret seed file (0600) and the training jail's settings; in the child the runner's executor is
   wrapped by :class:`GuardedExecutor`, which kills every process the training left (new processes below
   the runner, the jail's uid) and checks none is left **before the post eval starts**;
3. after the child, everything it left below the worker is killed, and the result gets the worker's
   versions, image revision, GPUs and isolation (``JobResult.worker``); text that came from the job
   (``error``, ``log_tail``, progress lines) is scrubbed: host paths (:func:`ait_env.hidden.redact.for_agent`),
   credential values, the secret seeds and the family's hidden questions never leave the worker.

Runpod facts relied on (runpod-python 1.12.0, commit 07fc6e2b; runpod/docs a900806e): a handler gets
``job["input"]`` and ``job["id"]``; an ``async`` handler's return value is the output and a stop
(cancel, timeout) raises ``asyncio.CancelledError`` in it (``serverless/modules/rp_job.py::run_job``,
``rp_scale.py::stop_job``; docs ``serverless/workers/handler-functions.mdx``); a top-level ``"error"`` or
``"refresh_worker"`` key of a dict output is popped by the SDK (``run_job``), so the result always travels
under ``"result"``; ``progress_update(job, msg)`` posts from a thread of its own
(``modules/rp_progress.py``); the heartbeat runs in a separate process (``modules/rp_ping.py``), so a long
job does not starve it; payloads are limited to 10 MB for ``/run`` and 20 MB for ``/runsync``
(``handler-functions.mdx``, "Payload limits").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ait_env.jobs.settings import EVAL_ALLOWANCE_S, BackendSettings, RunnerSettings, worker_settings
from ait_env.jobs.result import JobResult, JobStatus
from ait_env.hidden.baselines import BaselineEntry, BaselineFile, BaselineStore
from ait_env.jobs.wire import unpack_bundle
from gpu import isolation
from ait_env import processes
from gpu.isolation import JailConfig
from gpu.selfcheck import SelfCheck

Progress = Callable[[str], None]
ROOT = Path(__file__).resolve().parents[1]


class WorkerRequest(BaseModel):
    """One request to the runner child (written as JSON next to it)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["job", "baseline"] = "job"
    executor: str
    settings: BackendSettings
    bundle_dir: Path | None = None
    family: str | None = None
    model: str | None = None
    baselines_dir: Path | None = None
    private_dir: Path | None = None


class BaselineOutcome(BaseModel):
    """What a baseline request returns: the measured entry, or why there is none."""

    status: JobStatus
    entry: BaselineEntry | None = None
    error: str = ""
    log_tail: str = ""
    worker: dict[str, Any] = Field(default_factory=dict)


# ---------------------------------------------------------------------------------------------- bundles
def carrier_bundle(family: str, model: str, parent: Path, executor: str) -> Any:
    """A bundle of ``family``'s reference job on ``model``: what the executor factory needs to exist (a
    baseline request trains nothing and imports none of its code)."""
    from task_families import reference_files
    from ait_env.jobs.bundle import build_bundle
    from ait_env.jobs.schema import parse_job
    from task_families import get_family

    ws = Path(parent) / "ws"
    ws.mkdir(parents=True)
    files = reference_files(family, model, backend=executor)
    for name, text in files.items():
        (ws / name).write_text(text)
    job, issues = parse_job(files["job.toml"])
    if job is None:
        raise RuntimeError(f"the reference job of {family} does not validate for {model}: {issues}")
    return build_bundle(ws, job, get_family(family), Path(parent) / "jobs", job_id=f"baseline-{family}")


# ---------------------------------------------------------------------------------------------- scrubbing
class Scrubber:
    """Removes from text that leaves the worker: host paths, credential values, secret seeds and hidden
    questions (each replaced by ``<redacted>``)."""

    def __init__(self, secrets: set[str] | None = None) -> None:
        self.secrets = sorted((s for s in (secrets or set()) if s), key=len, reverse=True)

    def add(self, values: set[str]) -> None:
        self.secrets = sorted(set(self.secrets) | {v for v in values if v}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        from ait_env.hidden.redact import for_agent

        if not text:
            return text
        for s in self.secrets:
            text = text.replace(s, "<redacted>")
        return for_agent(text)


def _private_secrets(private: Path) -> tuple[Path | None, set[str]]:
    """A private copy (0600) of the seeds the worker was given (``$AIT_SECRETS_JSON``: the orchestrator's
    private seeds, :func:`ait_env.hidden.secrets.worker_secrets_json`, or a Runpod secret; else an existing
    file named by ``$AIT_SECRETS_FILE``) and the seed values to scrub (6 digits or more); ``(None, set())``
    when it was given none: the job is scored with the published seeds, and its result says so
    (``hidden_seeds``), so an orchestrator with private seeds refuses it. A worker never makes seeds."""
    raw = os.environ.get("AIT_SECRETS_JSON")
    named = Path(os.environ.get("AIT_SECRETS_FILE") or "/nonexistent")
    if not raw and named.is_file():
        raw = named.read_text()
    if not raw:
        return None, set()  # the published seeds (public by design: ait_env/hidden/secrets.py)
    seeds = json.loads(raw)
    if not isinstance(seeds, dict):
        raise ValueError("the secret seeds must be a JSON object {\"<family>\": <int>, ...}")
    copy = private / "secrets.json"
    fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(raw)
    return copy, {str(v) for v in seeds.values() if len(str(v)) >= 6}


# ---------------------------------------------------------------------------------------------- the guard
class GuardedExecutor:
    """A trainer executor whose training tree cannot outlive ``train`` (see the module docstring). Wraps the
    runner's executor in the runner child; everything else is delegated."""

    def __init__(self, inner: Any, log: Callable[[str], None], jail: JailConfig, report: Path | None) -> None:
        self.inner = inner
        self.log = log
        self.jail = jail
        self.report = report
        self.before_job = processes.live_descendants(os.getpid())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _contain(self, keep: set[int], when: str) -> None:
        from ait_env.runner import InfraFailed

        uid = self.jail.uid if os.getuid() == 0 else None
        killed, survivors = processes.kill_all(uid=uid, below=os.getpid(), keep=keep)
        state = json.loads(self.report.read_text()) if self.report and self.report.exists() else {}
        state[when] = {"killed": len(killed), "survivors": sorted(survivors)}
        if self.report:
            self.report.write_text(json.dumps(state))
        if survivors:
            raise InfraFailed(f"{len(survivors)} process(es) of the training tree survived SIGKILL {when} "
                              f"(pids {sorted(survivors)[:10]}); the eval did not run on this worker")
        self.log(f"training tree: {len(killed)} leftover process(es) killed {when}; none left" if killed
                 else f"training tree: no process left {when}")

    def train(self, eval_point: Callable[[int], float | None]) -> Any:
        keep = processes.live_descendants(os.getpid())   # the executor's servers, started before training
        try:
            return self.inner.train(eval_point)
        finally:
            self._contain(keep, "after training, before the post eval")

    def close(self) -> None:
        try:
            self.inner.close()
        finally:
            self._contain(self.before_job, "after the job")


def guarded_factory(executor: str, jail: JailConfig, report: Path | None) -> Callable[..., Any]:
    """The runner's executor factory for ``executor``, each executor wrapped in :class:`GuardedExecutor`
    (passed to :func:`ait_env.runner.run`; the settings' backend name still names the baseline store and
    the result)."""
    from ait_env.runner import executor_factory

    inner = executor_factory(executor)
    return lambda bundle, settings, log, progress: GuardedExecutor(inner(bundle, settings, log, progress),
                                                                   log, jail, report)


def _measure_baseline(req: WorkerRequest, log: Callable[[str], None]) -> BaselineOutcome:
    """The baseline request, in the runner child: ``measure_base`` of the executor on the full hidden set
    (``eval_limit`` in tests), through the same harness the runner uses."""
    import ait_env.runner as runner
    from ait_env.hidden.secrets import hidden_set, hidden_set_hash
    from task_families import get_family

    assert req.family and req.model
    settings = RunnerSettings.of(req.settings.options)
    fam = get_family(req.family)
    n = min(settings.eval_limit or len(hidden_set(fam.name)), len(hidden_set(fam.name)))
    scored = runner.hidden_evaluator(fam.name, settings)

    def evaluate(served: runner.Served) -> Any:
        return scored(served, n)

    with tempfile.TemporaryDirectory(prefix="ait-baseline-") as tmp:
        try:
            bundle = carrier_bundle(fam.name, req.model, Path(tmp), req.executor)
            executor = runner.executor_factory(req.executor)(bundle, req.settings, log, False)
        except runner.InfraFailed as exc:
            return BaselineOutcome(status="infra_failed", error=str(exc))
        try:
            log(f"measuring the untrained {req.model} on {n} hidden {fam.name} instances")
            res = executor.measure_base(req.model, evaluate)
            entry = BaselineEntry(backend=req.settings.name, family=fam.name, model=req.model,
                                  score=res.score, ci95=res.ci95, n=res.n,
                                  hidden_set_hash=hidden_set_hash(fam.name),
                                  model_hash=executor.weights_hash(req.model),
                                  command=f"python scripts/seed_baselines.py backend={req.settings.name}")
            log(f"{req.model} on {fam.name}: {entry.score:.3f} ± {entry.ci95:.3f} (n={entry.n})")
            return BaselineOutcome(status="succeeded", entry=entry)
        except runner.InfraFailed as exc:
            return BaselineOutcome(status="infra_failed", error=str(exc))
        finally:
            executor.close()


def _child(request_path: Path) -> int:
    """The runner child (``--child``): one request, then exit."""
    import ait_env.runner as runner

    req = WorkerRequest.model_validate_json(Path(request_path).read_text())
    processes.become_subreaper()
    jail = isolation.TrainingJail.from_env().config
    report = req.private_dir / "guard.json" if req.private_dir else None
    if req.kind == "job":
        assert req.bundle_dir is not None
        runner.run(req.bundle_dir, req.settings, progress=False, baselines_dir=req.baselines_dir,
                   executor=guarded_factory(req.executor, jail, report))
        return 0

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    try:
        outcome = _measure_baseline(req, log)
    except Exception as exc:  # noqa: BLE001 - anything else is ours
        outcome = BaselineOutcome(status="infra_failed", error=f"{type(exc).__name__}: {exc}"[:2000])
    assert req.private_dir is not None
    (req.private_dir / "baseline.json").write_text(outcome.model_dump_json())
    return 0


# ---------------------------------------------------------------------------------------------- the worker
class Worker:
    """Runs requests one at a time (see the module docstring; a second caller waits: the sweep after a
    request kills every process that appeared below the worker meanwhile). ``require_revision``: the image
    revision every request must find (the self-check refuses otherwise); ``isolation_mode``: the jail mode
    to insist on (default ``$AIT_ISOLATION`` or the strongest available)."""

    def __init__(self, require_revision: str | None = None, isolation_mode: str | None = None) -> None:
        self.require_revision = require_revision
        self.isolation_mode = isolation_mode
        self._checks: dict[str, SelfCheck] = {}
        self._one_at_a_time = threading.Lock()
        processes.become_subreaper()

    def check(self, executor: str) -> SelfCheck:
        """The self-check for ``executor`` (run once per process)."""
        if executor not in self._checks:
            from gpu import selfcheck

            self._checks[executor] = selfcheck.run(executor, require_revision=self.require_revision,
                                                   isolation=self.isolation_mode)
        return self._checks[executor]

    # -------------------------------------------------------------- requests
    def run_job(self, bundle_dir: Path, settings: BackendSettings, executor: str = "gpu", *,
                baselines_dir: Path | None = None, progress: Progress | None = None,
                cancel: threading.Event | None = None, timeout_s: float | None = None) -> JobResult:
        """Run the bundle in ``bundle_dir``; its ``result.json`` is written there and returned."""
        bundle_dir = Path(bundle_dir).resolve()
        job_id = _job_id(bundle_dir)
        path = bundle_dir / "result.json"
        path.unlink(missing_ok=True)   # an earlier run's result is never taken for this one's
        chk = self.check(executor)
        if not chk.ok:
            result = JobResult(job_id=job_id, backend=settings.name, status="infra_failed",
                               error=chk.refusal(), worker=chk.summary())
            result.save(path)
            return result
        req = WorkerRequest(kind="job", executor=executor, settings=settings, bundle_dir=bundle_dir,
                            baselines_dir=Path(baselines_dir).resolve() if baselines_dir else None)
        scrub = Scrubber()
        t0 = time.time()
        limit = timeout_s or settings.bounds.wall_clock_minutes * 60 + EVAL_ALLOWANCE_S
        code, tail, extra = self._spawn(req, chk, scrub, _family_of(bundle_dir), progress, cancel, limit)
        if path.exists() and code not in ("timeout", "cancelled"):
            result = JobResult.model_validate_json(path.read_text())
        else:
            why = (f"the job ran past the worker's limit ({limit:.0f} s: its wall-clock bound plus "
                   f"{EVAL_ALLOWANCE_S:.0f} s for the evals) and was killed" if code == "timeout"
                   else "the job was cancelled" if code == "cancelled"
                   else f"the worker could not run the job ({code})" if isinstance(code, str)
                   else f"the job runner exited (code {code}) without a result")
            result = JobResult(job_id=job_id, backend=settings.name, status="infra_failed", error=why,
                               log_tail=tail, wall_seconds=time.time() - t0)
        result.error, result.log_tail = scrub(result.error), scrub(result.log_tail)
        result.worker = {**chk.summary(), **extra}
        result.save(path)
        return result

    def run_baseline(self, family: str, model: str, settings: BackendSettings, executor: str = "gpu", *,
                     progress: Progress | None = None, cancel: threading.Event | None = None,
                     timeout_s: float | None = None) -> BaselineOutcome:
        """Measure the untrained ``model`` on ``family``'s hidden set with ``executor``'s ``measure_base``."""
        chk = self.check(executor)
        if not chk.ok:
            return BaselineOutcome(status="infra_failed", error=chk.refusal(), worker=chk.summary())
        req = WorkerRequest(kind="baseline", executor=executor, settings=settings, family=family, model=model)
        scrub = Scrubber()
        limit = timeout_s or EVAL_ALLOWANCE_S
        code, tail, extra = self._spawn(req, chk, scrub, family, progress, cancel, limit)
        out = extra.pop("baseline", None)
        outcome = (BaselineOutcome.model_validate(out) if out and code not in ("timeout", "cancelled") else
                   BaselineOutcome(status="infra_failed", error=f"the baseline run ended ({code}) without a "
                                                                "result"))
        outcome.error, outcome.log_tail = scrub(outcome.error), scrub(tail)
        outcome.worker = {**chk.summary(), **extra}
        return outcome

    # -------------------------------------------------------------- the child
    def _spawn(self, req: WorkerRequest, chk: SelfCheck, scrub: Scrubber, family: str | None,
               progress: Progress | None, cancel: threading.Event | None,
               timeout_s: float) -> tuple[int | str, str, dict[str, Any]]:
        """Run ``req`` in the runner child; returns (its exit code, or "timeout", "cancelled" or "not started:
        <why>"; the log's tail; what the worker adds to the result)."""
        with self._one_at_a_time:
            try:
                return self._run_child(req, chk, scrub, family, progress, cancel, timeout_s)
            except (OSError, RuntimeError, ValueError) as exc:
                return f"not started: {type(exc).__name__}: {exc}", "", {}

    def _run_child(self, req: WorkerRequest, chk: SelfCheck, scrub: Scrubber, family: str | None,
                   progress: Progress | None, cancel: threading.Event | None,
                   timeout_s: float) -> tuple[int | str, str, dict[str, Any]]:
        private = Path(tempfile.mkdtemp(prefix="ait-worker-"))  # mode 0700
        jail = chk.isolation or JailConfig(mode="none", reason="not probed")
        keep = processes.live_descendants(os.getpid())   # e.g. the Runpod SDK's heartbeat process
        uid = jail.uid if os.getuid() == 0 else None
        try:
            secrets_file, seeds = _private_secrets(private)
            scrub.add(seeds | isolation.secret_values())
            if family:
                scrub.add(_hidden_questions(family, secrets_file))
            if uid is not None and processes.kill_all(uid=uid)[1]:
                raise RuntimeError(f"processes of the training uid {uid} are running and cannot be killed")
            (private / "tmp").mkdir()
            req = req.model_copy(update={"private_dir": private})
            (private / "request.json").write_text(req.model_dump_json())
            path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
            extra_env = {"TMPDIR": str(private / "tmp"), isolation.JAIL_ENV: jail.model_dump_json(),
                         "PYTHONUNBUFFERED": "1", "PYTHONPATH": path}
            if secrets_file:   # the runner child scores with these seeds, and labels its result so
                extra_env.update(AIT_SECRETS_FILE=str(secrets_file), AIT_HIDDEN_SEEDS="private")
            else:
                extra_env["AIT_HIDDEN_SEEDS"] = "published"
            proc = subprocess.Popen([sys.executable, "-m", "gpu.worker", "--child",
                                     str(private / "request.json")],
                                    env=isolation.runner_env(**extra_env), cwd=private,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, text=True, start_new_session=True)
            tail: deque[str] = deque(maxlen=60)
            reader = threading.Thread(target=_relay, args=(proc, tail, scrub, progress), daemon=True)
            reader.start()
            code = _wait(proc, timeout_s, cancel)
            reader.join(timeout=10)
            extra: dict[str, Any] = {"timeout_s": round(timeout_s)} if code == "timeout" else {}
            guard = private / "guard.json"
            if guard.exists():
                extra["training_tree"] = json.loads(guard.read_text())
            if (private / "baseline.json").exists():
                extra["baseline"] = json.loads((private / "baseline.json").read_text())
            return code, "\n".join(tail), extra
        finally:
            killed, survivors = processes.kill_all(uid=uid, below=os.getpid(), keep=keep)
            if killed or survivors:
                left = f"; {len(survivors)} survived: {sorted(survivors)}" if survivors else ""
                sys.stderr.write(f"ait worker: killed {len(killed)} process(es) left after the request"
                                 f"{left}\n")
            shutil.rmtree(private, ignore_errors=True)


def _relay(proc: subprocess.Popen[str], tail: deque[str], scrub: Scrubber, progress: Progress | None) -> None:
    """Forward the runner child's log lines (scrubbed) to the worker's stderr and to ``progress``."""
    assert proc.stderr is not None
    for raw in proc.stderr:
        line = scrub(raw.rstrip("\n"))
        tail.append(line)
        sys.stderr.write(line + "\n")
        if progress is not None and line.startswith("["):
            try:
                progress(line)
            except Exception:  # noqa: BLE001 - progress is best effort, never the job's end
                pass


def _wait(proc: subprocess.Popen[str], timeout_s: float, cancel: threading.Event | None) -> int | str:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass
        if cancel is not None and cancel.is_set():
            return "cancelled"
        if time.monotonic() > deadline:
            return "timeout"


def _job_id(bundle_dir: Path) -> str:
    try:
        return str(json.loads((bundle_dir / "manifest.json").read_text())["job_id"])
    except (OSError, ValueError, KeyError):
        return bundle_dir.name


def _family_of(bundle_dir: Path) -> str | None:
    try:
        return str(json.loads((bundle_dir / "manifest.json").read_text())["family"])
    except (OSError, ValueError, KeyError):
        return None


def _hidden_questions(family: str, secrets_file: Path | None) -> set[str]:
    """The hidden questions of ``family`` under the worker's seeds (scrubbed from text that leaves)."""
    from ait_env.hidden.secrets import PUBLISHED, SecretsError, hidden_questions, private_seeds

    try:
        seeds = private_seeds(secrets_file, create=False) if secrets_file else PUBLISHED
        return {q for q in hidden_questions(family, seeds) if len(q) >= 12}
    except (KeyError, OSError, SecretsError):
        return set()


# ---------------------------------------------------------------------------------------------- Runpod
class HandlerInput(BaseModel):
    """``job["input"]`` of the Runpod handler."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["job", "baseline"] = "job"
    executor: str = "gpu"
    settings: BackendSettings
    bundle: str | None = None                  # pack_bundle() of the job (kind "job")
    family: str | None = None                  # kind "baseline"
    model: str | None = None
    #: the caller's baseline store entries for this backend: the runner reads them and measures only what
    #: they lack; what it measures comes back in the output's ``baselines``
    baselines: list[BaselineEntry] = Field(default_factory=list)
    require_revision: str | None = None
    timeout_s: float | None = None
    #: the orchestrator's tag of this attempt (its journal recorded it before sending: ``/run`` has no
    #: idempotency key); the worker does not use it
    tag: str | None = None


_WORKERS: dict[str | None, Worker] = {}


def _worker(require_revision: str | None) -> Worker:
    """The process's worker for ``require_revision`` (its self-check runs once)."""
    if require_revision not in _WORKERS:
        _WORKERS[require_revision] = Worker(require_revision=require_revision)
    return _WORKERS[require_revision]


def handle_input(payload: dict[str, Any], progress: Progress | None = None,
                 cancel: threading.Event | None = None, work_root: Path | None = None) -> dict[str, Any]:
    """The handler's work, synchronously: ``{"kind", "result"}`` plus, for a job, the ``baselines`` it
    measured. Raises ``ValueError`` for an input that does not validate (the SDK then marks the request
    FAILED: a caller's bug, not a job result)."""
    inp = HandlerInput.model_validate(payload)
    worker = _worker(inp.require_revision)
    root = Path(tempfile.mkdtemp(prefix="ait-job-", dir=work_root))
    root.chmod(0o711)   # the training uid passes through to the job's folder (gpu/isolation.py, user mode)
    try:
        if inp.kind == "baseline":
            if not (inp.family and inp.model):
                raise ValueError("a baseline request needs 'family' and 'model'")
            out = worker.run_baseline(inp.family, inp.model, inp.settings, inp.executor, progress=progress,
                                      cancel=cancel, timeout_s=inp.timeout_s)
            return {"kind": "baseline", "result": out.model_dump(mode="json")}
        if not inp.bundle:
            raise ValueError("a job request needs 'bundle' (ait_env.jobs.wire.pack_bundle of the bundle folder)")
        bundle_dir = unpack_bundle(inp.bundle, root / "jobs")
        store = BaselineStore(inp.settings.name, user_dir=root / "baselines")
        if inp.baselines:
            store.put(inp.baselines)
        result = worker.run_job(bundle_dir, inp.settings, inp.executor, baselines_dir=root / "baselines",
                                progress=progress, cancel=cancel, timeout_s=inp.timeout_s)
        given = {(e.family, e.model, e.model_hash, e.seeded_at) for e in inp.baselines}
        pinned = (BaselineFile.model_validate_json(store.user_path.read_text()).entries
                  if store.user_path is not None and store.user_path.exists() else [])
        return {"kind": "job", "result": result.model_dump(mode="json"),
                "baselines": [e.model_dump(mode="json") for e in pinned
                              if (e.family, e.model, e.model_hash, e.seeded_at) not in given]}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _sdk_progress(job: dict[str, Any]) -> Progress | None:
    """``runpod.serverless.progress_update`` for ``job``; None outside a deployed worker (the SDK's local
    test mode has no URL to post to)."""
    if not os.environ.get("RUNPOD_WEBHOOK_POST_OUTPUT"):
        return None
    import runpod

    return lambda msg: runpod.serverless.progress_update(job, msg)


async def handler(job: dict[str, Any]) -> dict[str, Any]:
    """The Runpod Serverless handler (queue-based endpoint): ``job["input"]`` is a :class:`HandlerInput`;
    the return value is :func:`handle_input`'s. The work runs in a thread so the SDK's event loop stays
    free; a stop from Runpod (``asyncio.CancelledError``, re-raised at once) sets the cancel flag, on which
    the worker kills the running job and everything below it within a second."""
    cancel = threading.Event()
    try:
        return await asyncio.to_thread(handle_input, job.get("input") or {}, _sdk_progress(job), cancel)
    except asyncio.CancelledError:
        cancel.set()
        raise


def serve() -> None:
    """Start the Runpod Serverless worker loop with :func:`handler` (the SDK reads its own flags, e.g.
    ``--test_input``, from ``sys.argv``). The self-check runs first and is printed to the worker's log."""
    import runpod

    chk = _worker(None).check(os.environ.get("AIT_EXECUTOR", "gpu"))
    print(f"ait worker self-check: {json.dumps(chk.summary())}", flush=True)
    if not chk.ok:
        print(chk.refusal(), flush=True)
    runpod.serverless.start({"handler": handler})


# ---------------------------------------------------------------------------------------------- SkyPilot
RESULT_BEGIN, RESULT_END = "AIT-RESULT-BEGIN", "AIT-RESULT-END"


def run_request_env(name: str) -> int:
    """A managed job's ``run`` (fleet/skypilot_engine.py): the :class:`HandlerInput` from ``$<name>`` (JSON,
    gzip, base64) through :func:`handle_input`, its output printed to the job's log between the result
    markers (gzip + base64, lines of 4,000 characters, the last line carrying the blob's sha256). Exit 0 once
    the output is printed (a job's own failure is in it), 2 for an input that does not decode or validate."""
    import base64
    import gzip
    import hashlib

    try:
        payload = json.loads(gzip.decompress(base64.b64decode(os.environ[name])))
        out = handle_input(payload)
    except (KeyError, ValueError, OSError) as exc:
        print(f"ait worker: the request in ${name} is unusable: {type(exc).__name__}: {exc}", flush=True)
        return 2
    blob = base64.b64encode(gzip.compress(json.dumps(out, separators=(",", ":")).encode(), 6, mtime=0)).decode()
    lines = [RESULT_BEGIN, *(blob[i:i + 4000] for i in range(0, len(blob), 4000)),
             f"{RESULT_END} {hashlib.sha256(blob.encode()).hexdigest()}"]
    print("\n".join(lines), flush=True)
    return 0


# ---------------------------------------------------------------------------------------------- the CLI
def load_settings(path: Path | None, executor: str) -> BackendSettings:
    """``--settings`` (JSON or YAML of :class:`BackendSettings`), else the defaults for ``executor``:
    ``conf/backend/local.yaml`` for ``local``, the worker part of ``conf/backend/gpu-local.yaml`` for
    ``gpu``."""
    from ait_env.conf import load_group

    if path is not None:
        text = Path(path).read_text()
        if Path(path).suffix in (".yaml", ".yml"):
            from omegaconf import OmegaConf

            data = OmegaConf.to_container(OmegaConf.create(text), resolve=True)
            return BackendSettings.model_validate(data)
        return BackendSettings.model_validate_json(text)
    if executor == "local":
        return BackendSettings.model_validate(load_group("backend", "local"))
    return worker_settings(BackendSettings.model_validate(load_group("backend", "gpu-local")))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return _child(Path(argv[1]))
    if argv[:1] == ["--request-env"]:
        return run_request_env(argv[1] if len(argv) > 1 else "AIT_REQUEST")
    if "--serve" in argv:
        sys.argv = [sys.argv[0], *[a for a in argv if a != "--serve"]]  # the SDK parses its own flags
        serve()
        return 0
    ap = argparse.ArgumentParser(prog="python -m gpu.worker", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle", type=Path, nargs="?", help="the job bundle folder (result.json goes there)")
    ap.add_argument("--baseline", nargs=2, metavar=("FAMILY", "MODEL"), help="measure an untrained model")
    ap.add_argument("--backend", default="gpu",
                    help="the trainer executor: gpu (prime-rl) or local (the tiny CPU models)")
    ap.add_argument("--settings", type=Path, help="BackendSettings as JSON or YAML (default: load_settings)")
    ap.add_argument("--baselines-dir", type=Path, help="the baseline store jobs read and pin into")
    ap.add_argument("--out", type=Path, help="--baseline: write the outcome here as JSON")
    ap.add_argument("--timeout", type=float, help="seconds before the request is killed (infra_failed)")
    ap.add_argument("--require-revision", help="refuse unless the image revision is this one")
    ap.add_argument("--selfcheck", action="store_true", help="print the self-check and exit")
    args = ap.parse_args(argv)
    worker = Worker(require_revision=args.require_revision)
    if args.selfcheck:
        chk = worker.check(args.backend)
        print(chk.model_dump_json(indent=1))
        return 0 if chk.ok else 1
    settings = load_settings(args.settings, args.backend)
    if args.baseline:
        out = worker.run_baseline(*args.baseline, settings, args.backend, timeout_s=args.timeout)
        if args.out:
            args.out.write_text(out.model_dump_json(indent=1))
        print(json.dumps({k: v for k, v in out.model_dump(mode="json").items() if k != "log_tail"}))
        return 0 if out.status == "succeeded" else 1
    if args.bundle is None:
        ap.error("give a bundle folder, --baseline FAMILY MODEL, --serve or --selfcheck")
    res = worker.run_job(args.bundle, settings, args.backend, baselines_dir=args.baselines_dir,
                         timeout_s=args.timeout)
    print(json.dumps({k: v for k, v in res.model_dump(mode="json").items()
                      if k not in ("curves", "log_tail")}))
    return 0 if res.status == "succeeded" else 1


if __name__ == "__main__":
    # the canonical module's main, not this __main__ copy's: one class object per exception and type
    from gpu.worker import main as _main

    raise SystemExit(_main())
