"""The GPU worker: a job bundle in, ``result.json`` out. ONE code path, used three ways:

    python -m gpu.worker runs/jobs/<job_id> [--backend gpu|local] [--settings f.json] [--baselines-dir D]
    python -m gpu.worker --baseline FAMILY MODEL [--backend gpu|local] [--settings f.json] [--out f.json]
    python -m gpu.worker --serve          # the Runpod Serverless handler (runpod.serverless.start)

(a) the CLI on any machine (:mod:`gpu.cli`), (b) :func:`gpu.runpod_handler.handler`, the Runpod Serverless handler (its input: the bundle as a
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
   wrapped by :class:`gpu.child.GuardedExecutor`, which kills every process the training left (new processes below
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
from typing import Any


from ait_env.jobs.settings import EVAL_ALLOWANCE_S, BackendSettings
from ait_env.jobs.result import JobResult
from gpu import isolation
from ait_env import processes
from gpu.isolation import JailConfig
from gpu.selfcheck import SelfCheck

from gpu.request import BaselineOutcome, WorkerRequest
from gpu.scrub import Scrubber, hidden_questions, private_secrets

Progress = Callable[[str], None]
ROOT = Path(__file__).resolve().parents[1]


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
            secrets_file, seeds = private_secrets(private)
            scrub.add(seeds | isolation.secret_values())
            if family:
                scrub.add(hidden_questions(family, secrets_file))
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


if __name__ == "__main__":
    # the command line (gpu/cli.py) over the canonical modules, not this __main__ copy: one class per type
    from gpu.cli import main

    raise SystemExit(main())
