"""The gpu-local backend: the worker CLI in a subprocess, one job per GPU set. On this machine (no GPU,
no prime-rl executor yet) a job ends infra_failed with the reason; with the local executor it trains."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ait_env.backends import BackendOptionsError, make_backend
from ait_env.jobs.settings import BackendSettings, ModelInfo
from ait_env.backends.gpu_local import GpuLocalBackend, worker_settings
from ait_env.config import load_group
from tests.gpu.helpers import ROOT, make_job, needs_tiny_model


def _settings(**options) -> BackendSettings:
    s = BackendSettings.model_validate(load_group("backend", "gpu-local"))
    s.options.update(options)
    return s


def _local(**options) -> BackendSettings:
    s = _settings(executor="local", eval_every=0, eval_limit=8, measure_pre=True, eval_max_tokens=32,
                  **options)
    return s.model_copy(update={"models": [ModelInfo(name="ait-tiny-s", role="small")],
                                "bounds": s.bounds.model_copy(update={"wall_clock_minutes": 5})})


def test_config_and_options():
    s = _settings()
    assert [m.name for m in s.models] == ["Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B"] and not s.surrogate
    with make_backend(s) as backend:
        assert isinstance(backend, GpuLocalBackend) and backend.options.gpu_sets == ["0,1"]
    with pytest.raises(BackendOptionsError, match="gpu_sets"):
        make_backend(_settings(gpu_set="0"))
    ws = worker_settings(_settings(executor_options={"lr_scale": 3.0}, eval_every=5))
    assert ws.name == "gpu-local" and ws.options["eval_every"] == 5 and ws.options["lr_scale"] == 3.0
    assert not {"gpu_sets", "executor", "isolation", "python"} & set(ws.options)


def _gpu_job_refused_here() -> bool:
    from gpu import selfcheck

    return not selfcheck.run("gpu").ok


@pytest.mark.skipif(not _gpu_job_refused_here(), reason="this machine runs prime-rl jobs")
def test_a_gpu_job_here_ends_infra_failed_with_the_reason(tmp_path):
    b = make_job(tmp_path)
    with make_backend(_settings(), runs_dir=tmp_path / "runs") as backend:
        res = backend.run(b)
        with pytest.raises(RuntimeError, match="could not measure Qwen/Qwen3-0.6B on arithmetic: this"):
            backend.measure_baseline("arithmetic", "Qwen/Qwen3-0.6B")
    assert res.status == "infra_failed" and res.error.startswith("this worker refuses 'gpu' jobs")
    assert res.worker["selfcheck"] == "refused" and (b.root / "result.json").exists()
    import ait_env.runner

    if not res.worker["gpus"]:
        assert "0 GPU(s) on this worker" in res.error
    if "gpu" not in ait_env.runner.EXECUTORS:
        assert "no trainer executor for 'gpu'" in res.error


@pytest.mark.skipif(not _gpu_job_refused_here(), reason="this machine runs prime-rl jobs")
def test_seed_baselines_on_gpu_local_says_why_it_cannot(tmp_path):
    cmd = [sys.executable, "scripts/seed_baselines.py", "backend=gpu-local", "families=arithmetic",
           f"env.runs_dir={tmp_path / 'runs'}"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "this worker refuses 'gpu' jobs" in out.stderr


@pytest.mark.slow  # the default suite keeps the worker's own run of a job with the local executor (test_gpu_worker.py)
@needs_tiny_model
def test_the_worker_path_trains_with_the_local_executor(tmp_path):
    pytest.importorskip("verifiers")
    b = make_job(tmp_path)
    with make_backend(_local(), runs_dir=tmp_path / "runs") as backend:
        backend.show_progress = False
        res = backend.run(b)
        entry = backend.measure_baseline("arithmetic", "ait-tiny-s")
    assert res.status == "succeeded", res.error + res.log_tail
    assert res.backend == "gpu-local" and res.worker["executor"] == "local"
    assert (b.root / "worker_settings.json").exists() and "post-eval" in res.log_tail
    assert entry.backend == "gpu-local" and entry.n == 8 and 0.0 <= entry.score <= 1.0 and entry.model_hash


def test_each_gpu_set_gets_its_own_training_uid(monkeypatch):
    """A worker kills every process of its training uid around a request: concurrent workers must not share
    one (gpu/isolation.py)."""
    from ait_env.backends.gpu_local import GpuLocalBackend
    from gpu import isolation

    backend = GpuLocalBackend(_settings(gpu_sets=["0,1", "2,3"]), show_progress=False)
    uids = [backend._env(g)["AIT_TRAINING_UID"] for g in ("0,1", "2,3")]
    assert uids == ["61000", "61001"]
    monkeypatch.setenv("AIT_TRAINING_UID", "61001")
    assert isolation.training_uid() == 61001
    monkeypatch.setenv("AIT_TRAINING_UID", "0")
    with pytest.raises(ValueError, match="uid >= 1000"):
        isolation.training_uid()
