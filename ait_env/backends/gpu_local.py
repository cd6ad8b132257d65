"""The ``gpu-local`` backend: the GPU worker (``gpu/worker.py``) on your own GPU machine.

:meth:`GpuLocalBackend.submit` runs ``python -m gpu.worker <bundle> --backend <executor>`` in a subprocess
with ``CUDA_VISIBLE_DEVICES`` set to a free GPU set of ``options.gpu_sets`` (one job per set; a job
waits in ``submit`` until one is free); :meth:`GpuLocalBackend.wait` reads the bundle's ``result.json``.
The worker is the same code path as on Runpod: self-check (a machine without GPUs or without the
prime-rl executor refuses with ``infra_failed`` and the reason), the runner in a scrubbed child, the
training jail, and the worker's versions in ``JobResult.worker``. :meth:`GpuLocalBackend.measure_baseline`
runs ``python -m gpu.worker --baseline`` (``python scripts/seed_baselines.py backend=gpu-local``).

Options (:class:`GpuLocalOptions`, ``conf/backend/gpu-local.yaml``): the runner's generic ones
(:class:`ait_env.jobs.settings.WorkerOptions`: ``executor`` and ``executor_options`` (the trainer executor the
worker runs, ``gpu`` = prime-rl, and its own options, passed through), ``gpu_sets``, ``python`` (the
worker's interpreter), ``isolation``, ``job_timeout_s`` and ``require_revision``.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from ait_env.backends.base import JobHandle
from ait_env.backends.subprocess_job import SubprocessBackend
from ait_env.hidden.baselines import BaselineEntry
from ait_env.jobs.bundle import JobBundle
from ait_env.jobs.settings import DEFAULT_TRAINING_UID, TRAINING_UID_ENV, BackendSettings, WorkerOptions, worker_settings

ROOT = Path(__file__).resolve().parents[2]


class GpuLocalOptions(WorkerOptions):
    """``options`` of the gpu-local backend (unknown keys are refused)."""

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


class GpuLocalBackend(SubprocessBackend):
    Options = GpuLocalOptions
    child_name = "the GPU worker"
    out_file = log_file = "worker.out"

    def __init__(self, settings: BackendSettings, runs_dir: Path | str | None = None,
                 show_progress: bool = True) -> None:
        super().__init__(settings, runs_dir, show_progress)
        self.options: GpuLocalOptions
        self._free: queue.Queue[str] = queue.Queue()
        for gpus in self.options.gpu_sets:
            self._free.put(gpus)

    def _acquire(self) -> str:
        return self._free.get()   # one job per GPU set: wait for a free one

    def _release(self, slot: Any) -> None:
        self._free.put(slot)

    def _command(self, *args: str) -> list[str]:
        o = self.options
        cmd = [o.python or sys.executable, "-m", "gpu.worker", *args, "--backend", o.executor]
        if o.require_revision:
            cmd += ["--require-revision", o.require_revision]
        return cmd

    def _env(self, gpus: str) -> dict[str, str]:
        # each GPU set's worker gets a training uid of its own (gpu/isolation.py: a worker kills every
        # process of its uid around a request, so concurrent workers must not share one)
        from ait_env.hidden.secrets import FILE_ENV, WORKER_ENV, worker_secrets_json

        uid = DEFAULT_TRAINING_UID + self.options.gpu_sets.index(gpus)
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpus, "AIT_ISOLATION": self.options.isolation,
               TRAINING_UID_ENV: str(uid),
               "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
        seeds = worker_secrets_json()   # the worker scores with this run's seeds (none given: the published ones)
        env.pop(WORKER_ENV, None)
        env.pop(FILE_ENV, None)
        if seeds:
            env[WORKER_ENV] = seeds
        return env

    def submit(self, bundle: JobBundle) -> JobHandle:
        gpus = self._acquire()
        try:
            path = bundle.root / "worker_settings.json"
            path.write_text(worker_settings(self.settings).model_dump_json(indent=1))
            cmd = self._command(str(bundle.root), "--settings", str(path), "--baselines-dir",
                                str(self.baselines_dir.resolve()))
            if self.options.job_timeout_s:
                cmd += ["--timeout", str(self.options.job_timeout_s)]
        except BaseException:
            self._release(gpus)
            raise
        return self._start(bundle, cmd, env=self._env(gpus), cwd=ROOT, slot=gpus, meta={"gpus": gpus})

    def measure_baseline(self, family: str, model: str) -> BaselineEntry:
        """The untrained ``model`` on ``family``'s hidden set, measured by the worker on a free GPU set."""
        gpus = self._acquire()
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
            self._release(gpus)
        if data.get("status") != "succeeded" or not data.get("entry"):
            why = data.get("error") or f"the worker exited {proc.returncode}: {proc.stderr.strip()[-1500:]}"
            raise RuntimeError(f"gpu-local could not measure {model} on {family}: {why}")
        return BaselineEntry.model_validate(data["entry"])
