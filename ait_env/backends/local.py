"""The ``local`` backend: real GRPO training of the project's tiny models on this machine.

:meth:`LocalBackend.submit` starts ``python -m ait_env.runner <bundle>`` (the one job runner) in a
subprocess; :meth:`LocalBackend.wait` waits for it and reads the bundle's ``result.json``. A runner
that dies without a result is an ``infra_failed`` result (its exit code and log tail are reported).
Baselines come from the pinned store (``ait_env/data/baselines/local.json``); :meth:`measure_baseline`
scores an untrained model with the same hidden-eval harness (``scripts/seed_baselines.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from ait_env.backends.base import Backend, JobHandle, JobResult
from ait_env.baselines import BaselineEntry
from ait_env.jobs.bundle import JobBundle


class LocalBackend(Backend):
    def __init__(self, settings, show_progress: bool = True) -> None:  # noqa: ANN001
        super().__init__(settings)
        self.show_progress = show_progress
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._register_token_counters()

    def _register_token_counters(self) -> None:
        """Let the probe count prompt tokens with the models' own tokenizer and chat template (built
        models only; unbuilt ones keep the conservative estimate)."""
        from ait_env.local.catalog import model_dir
        from ait_env.local.tokenizer import ChatTokenizer
        from ait_env.probe.dynamic import register_token_counter

        missing = []
        for m in self.catalog():
            path = model_dir(m.name)
            if not (path / "tokenizer.json").exists():
                missing.append(m.name)
                continue
            tok = ChatTokenizer.load(path)
            register_token_counter(m.name, lambda msgs, tools, tok=tok: len(
                tok.encode_chat(msgs, tools or None, add_generation_prompt=True)))
        if missing and not getattr(self, "_warned_missing", False):
            self._warned_missing = True
            print(f"note: local models {', '.join(missing)} are not built yet; a job's first submission builds "
                  "its model (minutes). Until then the probe estimates prompt lengths conservatively. Build "
                  "them now with: python -m ait_env.local.build", file=sys.stderr)

    def built_weights_hash(self, model: str) -> str:
        from ait_env.local.catalog import weights_hash

        return weights_hash(model)

    def model_renderers(self) -> dict[str, str]:
        # The tiny models carry their own chat template (served by our endpoint, or vLLM with
        # the tokenizer's template); prime-rl's renderer map does not know them.
        return {m.name: "default" for m in self.catalog()}

    def submit(self, bundle: JobBundle) -> JobHandle:
        # Build the job's base model first (once per machine, cached; minutes, with a progress bar), so
        # that the job's wall-clock limit counts training only.
        from ait_env.local.catalog import CATALOG, ensure_built

        if bundle.job.job.base_model in CATALOG:
            ensure_built(bundle.job.job.base_model, progress=self.show_progress)
            self._register_token_counters()
        settings_path = bundle.root / "backend.json"
        settings_path.write_text(self.settings.model_dump_json(indent=1))
        cmd = [sys.executable, "-m", "ait_env.runner", str(bundle.root), "--backend-settings", str(settings_path)]
        if not self.show_progress:
            cmd.append("--no-progress")
        stdout = open(bundle.root / "runner.out", "wb")  # noqa: SIM115 - owned by the child
        proc = subprocess.Popen(cmd, stdout=stdout, stderr=None if self.show_progress else subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        stdout.close()
        self._procs[bundle.job_id] = proc
        return JobHandle(job_id=bundle.job_id, backend=self.name, meta={"root": str(bundle.root), "pid": proc.pid})

    def wait(self, handle: JobHandle, timeout: float | None = None) -> JobResult:
        root = Path(handle.meta["root"])
        proc = self._procs.pop(handle.job_id, None)
        t0 = time.time()
        if proc is not None:
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise TimeoutError(f"local job {handle.job_id} did not finish within {timeout} s") from None
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
        from ait_env.runner import RunnerSettings, measure_base
        from ait_env.secrets import hidden_set, hidden_set_hash

        opts = RunnerSettings.model_validate({**self.settings.options, "seed": 0})
        res = measure_base(model, family, opts, len(hidden_set(family)))
        return BaselineEntry(backend=self.name, family=family, model=model, score=res.score, ci95=res.ci95, n=res.n,
                             hidden_set_hash=hidden_set_hash(family), model_hash=weights_hash(model),
                             command=f"python scripts/seed_baselines.py backend={self.name}")


def result_summary(result: JobResult) -> str:
    return json.dumps({k: v for k, v in result.model_dump().items() if k not in ("curves", "log_tail")})
