"""The ``gpu-local`` backend: the GPU worker (``gpu/worker.py``) on your own GPU machine.

:meth:`GpuLocalBackend.submit` runs ``python -m gpu.worker <bundle> --backend <executor>`` in a subprocess
with ``CUDA_VISIBLE_DEVICES`` set to a free GPU set of ``options.gpu_sets`` (one job per set; a job
waits in ``submit`` until one is free); :meth:`GpuLocalBackend.wait` reads the bundle's ``result.json``.
The worker is the same code path as on Runpod: self-check (a machine without GPUs or without the
prime-rl executor refuses with ``infra_failed`` and the reason), the runner in a scrubbed child, the
training jail, and the worker's versions in ``JobResult.worker``. :meth:`GpuLocalBackend.measure_baseline`
runs ``python -m gpu.worker --baseline`` (``python scripts/seed_baselines.py backend=gpu-local``).

Options (:class:`GpuLocalOptions`, ``conf/backend/gpu-local.yaml``): the runner's generic ones
(:class:`ait_env.runner.RunnerSettings`), ``executor`` and ``executor_options`` (the trainer executor the
worker runs, ``gpu`` = prime-rl, and its own options, passed through), ``gpu_sets``, ``python`` (the
worker's interpreter), ``isolation``, ``job_timeout_s`` and ``require_revision``.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from ait_env.backends.base import Backend, BackendSettings, JobHandle, JobResult
from ait_env.baselines import BaselineEntry
from ait_env.jobs.bundle import JobBundle
from ait_env.runner import RunnerSettings

ROOT = Path(__file__).resolve().parents[2]


class GpuLocalOptions(RunnerSettings):
    """``options`` of the gpu-local backend (unknown keys are refused)."""

    #: the worker's trainer executor: "gpu" (prime-rl on GPUs), "local" (the tiny CPU models: tests)
    executor: str = "gpu"
    #: the executor's own options, passed to it unchanged
    executor_options: dict[str, Any] = Field(default_factory=dict)
    #: CUDA_VISIBLE_DEVICES of each concurrent job (one job per set); a prime-rl job uses 2 GPUs by default
    gpu_sets: list[str] = Field(default_factory=lambda: ["0,1"], min_length=1)
    #: the worker's Python (default: this interpreter); e.g. /opt/ait/.venv/bin/python on the image
    python: str | None = None
    #: the training jail: auto (the strongest this machine allows), bwrap, user or none (gpu/isolation.py)
    isolation: Literal["auto", "bwrap", "user", "none"] = "auto"
    #: seconds before a job is killed (default: its wall-clock bound plus 30 min for the evals)
    job_timeout_s: float | None = Field(None, gt=0)
    #: refuse unless the worker's image revision ($AIT_IMAGE_REVISION) is this one
    require_revision: str | None = None


def worker_settings(settings: BackendSettings) -> BackendSettings:
    """The settings the worker's runner gets: this backend's name, models and bounds, and as ``options``
    the runner's own plus ``executor_options`` (the worker-side keys stay here)."""
    opts = GpuLocalOptions.model_validate(settings.options)
    runner = opts.model_dump(include=set(RunnerSettings.model_fields))
    return settings.model_copy(update={"options": {**runner, **opts.executor_options}})


class GpuLocalBackend(Backend):
    Options = GpuLocalOptions

    def __init__(self, settings: BackendSettings, runs_dir: Path | str = "runs",
                 show_progress: bool = True) -> None:
        super().__init__(settings, runs_dir)
        self.options: GpuLocalOptions
        self.show_progress = show_progress
        self._free: queue.Queue[str] = queue.Queue()
        for gpus in self.options.gpu_sets:
            self._free.put(gpus)
        self._procs: dict[str, tuple[subprocess.Popen[bytes], str]] = {}

    def _command(self, *args: str) -> list[str]:
        o = self.options
        cmd = [o.python or sys.executable, "-m", "gpu.worker", *args, "--backend", o.executor]
        if o.require_revision:
            cmd += ["--require-revision", o.require_revision]
        return cmd

    def _env(self, gpus: str) -> dict[str, str]:
        # each GPU set's worker gets a training uid of its own (gpu/isolation.py: a worker kills every
        # process of its uid around a request, so concurrent workers must not share one)
        from gpu.isolation import DEFAULT_TRAINING_UID

        uid = DEFAULT_TRAINING_UID + self.options.gpu_sets.index(gpus)
        return {**os.environ, "CUDA_VISIBLE_DEVICES": gpus, "AIT_ISOLATION": self.options.isolation,
                "AIT_TRAINING_UID": str(uid),
                "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}

    def submit(self, bundle: JobBundle) -> JobHandle:
        gpus = self._free.get()   # one job per GPU set: wait for a free one
        try:
            path = bundle.root / "worker_settings.json"
            path.write_text(worker_settings(self.settings).model_dump_json(indent=1))
            cmd = self._command(str(bundle.root), "--settings", str(path), "--baselines-dir",
                                str((self.runs_dir / "baselines").resolve()))
            if self.options.job_timeout_s:
                cmd += ["--timeout", str(self.options.job_timeout_s)]
            out = open(bundle.root / "worker.out", "wb")  # noqa: SIM115 - owned by the child
            proc = subprocess.Popen(cmd, stdout=out, stderr=None if self.show_progress else subprocess.STDOUT,
                                    env=self._env(gpus), cwd=ROOT, start_new_session=True)
            out.close()
        except BaseException:
            self._free.put(gpus)
            raise
        self._procs[bundle.job_id] = (proc, gpus)
        return JobHandle(job_id=bundle.job_id, backend=self.name,
                         meta={"root": str(bundle.root), "pid": proc.pid, "gpus": gpus})

    def wait(self, handle: JobHandle, timeout: float | None = None) -> JobResult:
        root = Path(handle.meta["root"])
        proc, gpus = self._procs.pop(handle.job_id, (None, ""))
        t0 = time.time()
        try:
            if proc is not None:
                try:
                    proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    _kill(proc)
                    raise TimeoutError(f"gpu-local job {handle.job_id} did not finish within {timeout} s"
                                       ) from None
        finally:
            if proc is not None:
                self._free.put(gpus)
        path = root / "result.json"
        if not path.exists():
            log = root / "worker.out"
            out = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            code = proc.returncode if proc else None
            return JobResult(job_id=handle.job_id, backend=self.name, status="infra_failed",
                             error=f"the GPU worker exited (code {code}) without a result", log_tail=out,
                             wall_seconds=time.time() - t0)
        return JobResult.model_validate_json(path.read_text())

    def measure_baseline(self, family: str, model: str) -> BaselineEntry:
        """The untrained ``model`` on ``family``'s hidden set, measured by the worker on a free GPU set."""
        gpus = self._free.get()
        try:
            with tempfile.TemporaryDirectory(prefix="ait-gpu-baseline-") as tmp:
                settings, out = Path(tmp) / "settings.json", Path(tmp) / "baseline.json"
                settings.write_text(worker_settings(self.settings).model_dump_json())
                proc = subprocess.run(self._command("--baseline", family, model, "--settings", str(settings),
                                                    "--out", str(out)),
                                      env=self._env(gpus), cwd=ROOT, capture_output=True, text=True,
                                      check=False)
                data = json.loads(out.read_text()) if out.exists() else {}
        finally:
            self._free.put(gpus)
        if data.get("status") != "succeeded" or not data.get("entry"):
            why = data.get("error") or f"the worker exited {proc.returncode}: {proc.stderr.strip()[-1500:]}"
            raise RuntimeError(f"gpu-local could not measure {model} on {family}: {why}")
        return BaselineEntry.model_validate(data["entry"])

    def close(self) -> None:
        """Stop the jobs still running (their workers, runners and training trees)."""
        for proc, gpus in list(self._procs.values()):
            _kill(proc)
            self._free.put(gpus)
        self._procs.clear()
        super().close()


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """Kill the worker and every process below it (its runner child has a session of its own)."""
    from gpu.isolation import kill_all, live_descendants

    if proc.poll() is None:
        tree = live_descendants(proc.pid)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            proc.kill()
        kill_all(tree)
        proc.wait()
