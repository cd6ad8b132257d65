"""The ``local`` backend: real GRPO training of the project's tiny models on this machine.

:meth:`LocalBackend.submit` starts ``python -m ait_env.runner <bundle>`` (the one job runner, with the
local trainer executor :mod:`ait_env.local.executor`) in a subprocess; :meth:`LocalBackend.wait` waits
for it and reads the bundle's ``result.json``. A runner that dies without a result is an
``infra_failed`` result (its exit code and log tail are reported). The models are built beforehand,
as a step of their own (``python -m ait_env.local.build``; ``scripts/main.sh`` runs it): a job whose
model is not built ends at once as ``infra_failed`` naming that command, and never builds inside a job.

Options (:class:`LocalOptions`, ``conf/backend/local.yaml``): the runner's generic ones
(:class:`ait_env.runner.RunnerSettings`), the executor's, and ``max_parallel_jobs``. Baselines: the
shipped pins (``ait_env/data/baselines/local.json``) and the user store, where jobs pin the base scores
they had to measure (this machine's build) so later jobs and ``get_baseline_scores`` read them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from pydantic import Field

from ait_env.backends.base import Backend, BackendSettings, JobHandle, JobResult, TokenCounter
from ait_env.baselines import BaselineEntry
from ait_env.jobs.bundle import JobBundle
from ait_env.runner import RunnerSettings


class LocalOptions(RunnerSettings):
    """``options`` of the local backend (unknown keys are refused)."""

    lr_scale: float = 100.0         # job lr (Qwen scale) -> tiny-model lr; logged in the result
    torch_threads: int = 1          # intra-op threads of the runner (1: measured 11 s vs 18 s per hidden eval
                                    # with 2 on 2 cores, where the sandboxed rollout worker needs the other core)
    #: where the model samples and trains: "cpu" (the default, the measured numbers), "cuda" / "cuda:N",
    #: or "auto" (a GPU when torch sees one). Sampling draws stay on the CPU either way (engine docstring).
    device: str = "cpu"
    seed: int = 0
    step_timeout_s: float = 600.0
    max_model_len: int | None = None
    sandbox_memory_mb: int = 3072
    #: jobs that train at the same time (more wait in submit); None = no limit
    max_parallel_jobs: int | None = Field(None, ge=1)


class LocalBackend(Backend):
    Options = LocalOptions

    def __init__(self, settings: BackendSettings, runs_dir: Path | str = "runs", show_progress: bool = True) -> None:
        super().__init__(settings, runs_dir)
        self.options: LocalOptions
        self.show_progress = show_progress
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._slots = (threading.BoundedSemaphore(self.options.max_parallel_jobs)
                       if self.options.max_parallel_jobs else None)
        self._counter: TokenCounter | None = None

    def built_weights_hash(self, model: str) -> str:
        from ait_env.local.catalog import weights_hash

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
            from ait_env.local.catalog import model_dir
            from ait_env.local.tokenizer import ChatTokenizer

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
        from ait_env.local.catalog import CATALOG, is_current
        from ait_env.local.executor import build_command

        model = bundle.job.job.base_model
        if model in CATALOG and not is_current(model):
            return JobHandle(job_id=bundle.job_id, backend=self.name, meta={
                "root": str(bundle.root), "refused": f"the base model {model} is not built on this machine; "
                f"build it once with: {build_command()} (5 to 11 minutes on 2 cores), then run again"})
        if self._slots is not None:
            self._slots.acquire()
        settings_path = bundle.root / "backend.json"
        settings_path.write_text(self.settings.model_dump_json(indent=1))
        cmd = [sys.executable, "-m", "ait_env.runner", str(bundle.root), "--backend-settings", str(settings_path),
               "--baselines-dir", str((self.runs_dir / "baselines").resolve())]
        if not self.show_progress:
            cmd.append("--no-progress")
        stdout = open(bundle.root / "runner.out", "wb")  # noqa: SIM115 - owned by the child
        proc = subprocess.Popen(cmd, stdout=stdout, stderr=None if self.show_progress else subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
        stdout.close()
        self._procs[bundle.job_id] = proc
        return JobHandle(job_id=bundle.job_id, backend=self.name, meta={"root": str(bundle.root), "pid": proc.pid})

    def wait(self, handle: JobHandle, timeout: float | None = None) -> JobResult:
        root = Path(handle.meta["root"])
        if handle.meta.get("refused"):
            return JobResult(job_id=handle.job_id, backend=self.name, status="infra_failed",
                             error=handle.meta["refused"])
        proc = self._procs.pop(handle.job_id, None)
        t0 = time.time()
        try:
            if proc is not None:
                try:
                    proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                    raise TimeoutError(f"local job {handle.job_id} did not finish within {timeout} s") from None
        finally:
            if proc is not None and self._slots is not None:
                self._slots.release()
        path = root / "result.json"
        if not path.exists():
            log = (root / "job.log").read_text()[-2000:] if (root / "job.log").exists() else ""
            code = proc.returncode if proc is not None else None
            return JobResult(job_id=handle.job_id, backend=self.name, status="infra_failed",
                             error=f"the job runner exited (code {code}) without a result", log_tail=log,
                             wall_seconds=time.time() - t0)
        return JobResult.model_validate_json(path.read_text())

    def measure_baseline(self, family: str, model: str) -> BaselineEntry:
        from ait_env.local.catalog import weights_hash
        from ait_env.local.executor import measure_untrained
        from ait_env.secrets import hidden_set, hidden_set_hash

        opts = self.options.model_copy(update={"seed": 0})
        res = measure_untrained(model, family, opts, len(hidden_set(family)))
        return BaselineEntry(backend=self.name, family=family, model=model, score=res.score, ci95=res.ci95, n=res.n,
                             hidden_set_hash=hidden_set_hash(family), model_hash=weights_hash(model),
                             command=f"python scripts/seed_baselines.py backend={self.name}")

    def close(self) -> None:
        """Stop the jobs still running (their runners and everything they started)."""
        for proc in list(self._procs.values()):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)  # the runner's session: its sandbox and servers too
                except OSError:
                    proc.kill()
                proc.wait()
        self._procs.clear()
        super().close()

