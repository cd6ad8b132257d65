"""The ``local`` backend: real GRPO training of the project's tiny models on this machine.

:meth:`LocalBackend.submit` starts ``python -m ait_env.runner <bundle>`` (the one job runner, with the
local trainer executor :mod:`cpu.executor`) in a subprocess; :meth:`LocalBackend.wait` waits
for it and reads the bundle's ``result.json``. A runner that dies without a result is an
``infra_failed`` result (its exit code and log tail are reported). A job stopped because the machine was too
slow (``infra_failed``, fault ``slow_machine``: it kept within its work budget, :mod:`cpu.budget`)
is run again ``slow_machine_retries`` times (default 1) before it is reported. The models are built beforehand,
as a step of their own (``python -m cpu.tiny_models.build``; ``scripts/main.sh`` runs it): a job whose
model is not built ends at once as ``infra_failed`` naming that command, and never builds inside a job.

Options (:class:`LocalOptions`, ``conf/backend/local.yaml``): the runner's generic ones
and the executor's (:class:`cpu.executor.LocalExecutorOptions`), and ``max_parallel_jobs``. Baselines: the
shipped pins (``ait_env/data/baselines/local.json``) and the user store, where jobs pin the base scores
they had to measure (this machine's build) so later jobs and ``get_baseline_scores`` read them.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

from pydantic import Field

from ait_env.backends.base import JobHandle
from ait_env.backends.subprocess_job import SubprocessBackend
from ait_env.jobs.settings import BackendSettings, TokenCounter
from ait_env.jobs.result import JobResult
from ait_env.hidden.baselines import BaselineEntry
from ait_env.jobs.bundle import JobBundle
from cpu.budget import SLOW_MACHINE
from cpu.executor import LocalExecutorOptions


class LocalOptions(LocalExecutorOptions):
    """``options`` of the local backend: the executor's, and the backend's own (unknown keys are refused)."""

    #: jobs that train at the same time (more wait in submit); None = no limit
    max_parallel_jobs: int | None = Field(None, ge=1)
    #: times a job stopped because the machine was too slow (``infra_failed``, fault ``slow_machine``: past its
    #: backstop within its work budget, :mod:`cpu.budget`) is run again before it is reported
    slow_machine_retries: int = Field(1, ge=0)


class LocalBackend(SubprocessBackend):
    Options = LocalOptions
    child_name = "the job runner"
    speed_measure = "rollouts"   # 2 shared CPU cores: wall time measures the machine's load, not the job
    out_file = "runner.out"
    log_file = "job.log"

    def __init__(self, settings: BackendSettings, runs_dir: Path | str | None = None, show_progress: bool = True) -> None:
        super().__init__(settings, runs_dir, show_progress)
        self.options: LocalOptions
        self._slots = (threading.BoundedSemaphore(self.options.max_parallel_jobs)
                       if self.options.max_parallel_jobs else None)
        self._counter: TokenCounter | None = None

    def built_weights_hash(self, model: str) -> str:
        from cpu.tiny_models.catalog import weights_hash

        return weights_hash(model)

    @property
    def executor(self) -> str:
        # The tiny models carry their own chat template (served by our endpoint, or vLLM with the
        # tokenizer's template); prime-rl's renderer map does not know them (executor_renderers).
        return "local"

    def token_counter(self) -> TokenCounter | None:
        """Prompt tokens under the built models' own tokenizer and chat template (unbuilt models: None,
        the probe's conservative estimate)."""
        if self._counter is None:
            from cpu.tiny_models.catalog import model_dir
            from cpu.tiny_models.tokenizer import ChatTokenizer

            tokenizers: dict[str, Any] = {}

            def count(model: str, messages: list[Any], tools: list[Any]) -> int | None:
                if model not in tokenizers:
                    path = model_dir(model) / "tokenizer.json"
                    tokenizers[model] = ChatTokenizer.load(path.parent) if path.exists() else None
                tok = tokenizers[model]
                return None if tok is None else len(tok.encode_chat(messages, tools or None,
                                                                    add_generation_prompt=True))

            self._counter = count
        return self._counter

    def submit(self, bundle: JobBundle) -> JobHandle:
        from cpu.tiny_models.catalog import CATALOG, is_current
        from cpu.tiny_models.catalog import BUILD_COMMAND

        model = bundle.job.job.base_model
        if model in CATALOG and not is_current(model):
            return JobHandle(job_id=bundle.job_id, backend=self.name, meta={
                "root": str(bundle.root), "refused": f"the base model {model} is not built on this machine; "
                f"build it once with: {BUILD_COMMAND} (5 to 11 minutes on 2 cores), then run again"})
        slot = self._acquire()
        settings_path = bundle.root / "backend.json"
        settings_path.write_text(self.settings.model_dump_json(indent=1))
        cmd = [sys.executable, "-m", "ait_env.runner", str(bundle.root), "--backend-settings", str(settings_path),
               "--baselines-dir", str(self.baselines_dir.resolve())]
        if not self.show_progress:
            cmd.append("--no-progress")
        return self._start(bundle, cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"}, slot=slot)

    def _acquire(self) -> Any:
        if self._slots is not None:
            self._slots.acquire()
        return self._slots

    def _release(self, slot: Any) -> None:
        if slot is not None:
            slot.release()

    def wait(self, handle: JobHandle, timeout: float | None = None) -> JobResult:
        if handle.meta.get("refused"):
            return JobResult(job_id=handle.job_id, backend=self.name, status="infra_failed",
                             error=handle.meta["refused"])
        result = super().wait(handle, timeout)
        tries = int(handle.meta.get("slow_machine_retries", 0))
        if result.status == "infra_failed" and result.fault == SLOW_MACHINE and tries < self.options.slow_machine_retries:
            sys.stderr.write(f"ait local backend: job {handle.job_id}: {result.error[:300]}; running it again "
                             f"(retry {tries + 1} of {self.options.slow_machine_retries})\n")
            again = self.submit(JobBundle.load(Path(handle.meta["root"])))
            again.meta["slow_machine_retries"] = tries + 1
            return self.wait(again, timeout)
        if tries:
            result.timings["slow_machine_retries"] = float(tries)
        return result

    def measure_baseline(self, family: str, model: str) -> BaselineEntry:
        from cpu.executor import measure_untrained
        from ait_env.hidden.secrets import hidden_set

        job = self.job_context(family, [model])
        opts = self.options.model_copy(update={"seed": 0})
        res = measure_untrained(model, family, opts, len(hidden_set(family)))
        return BaselineEntry(backend=self.name, family=family, model=model, score=res.score, ci95=res.ci95, n=res.n,
                             hidden_set_hash=job.hidden_set_hash, model_hash=job.weights_hash(model),
                             command=f"python scripts/seed_baselines.py backend={self.name}")

