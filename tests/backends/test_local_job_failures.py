"""A job that breaks during training ends ``job_failed`` through the real entry points: the local backend
starts ``python -m ait_env.runner`` in a child process, whose executor raises the job's faults. (A class
defined in a ``__main__`` module is a second class: every such failure used to end ``infra_failed``,
dropped and never charged to the agent.) The models are untrained catalog-shaped models installed like
a build (:mod:`tests.fakes.local_models`), so nothing here is monkeypatched."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from task_families import reference_files
from ait_env.backends.local import LocalBackend
from ait_env.config import compose
from tests.helpers import make_bundle
from tests.fakes.local_models import install_untrained_models

pytest.importorskip("verifiers")


@pytest.fixture(scope="module")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_untrained_models(tmp_path_factory.mktemp("models"))


def _small(job_toml: str) -> str:
    for key, value in (("max_steps", 2), ("batch_size", 8), ("group_size", 4), ("max_tokens", 12),
                       ("warmup_steps", 0), ("num_examples", 64)):
        job_toml = re.sub(rf"(?m)^{key} = \S+", f"{key} = {value}", job_toml)
    return job_toml


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache: Path, edit_env: object) -> object:
    monkeypatch.setenv("AIT_CACHE_DIR", str(cache))
    files = reference_files("arithmetic", "ait-tiny-s", backend="local")
    files["job.toml"] = _small(files["job.toml"])
    files["environment.py"] = edit_env(files["environment.py"])  # type: ignore[operator]
    bundle = make_bundle(files, tmp_path)
    settings = compose(backend="local", overrides={"backend": {"options": {
        "eval_every": 0, "eval_limit": 4, "eval_max_tokens": 8, "step_timeout_s": 120}}}).backend
    backend = LocalBackend(settings, tmp_path / "runs", show_progress=False)
    try:
        return backend.run(bundle)
    finally:
        backend.close()


def test_an_environment_that_raises_only_in_training_is_job_failed(tmp_path, monkeypatch, model_cache):
    # the probe loads it with the job "inspect"; the rollout worker with "rollout_worker": raise only there
    def edit(text: str) -> str:
        return text.replace("def load_environment(", "def _real_load_environment(") + (
            "\n\ndef load_environment(**kwargs):\n"
            "    import traceback\n"
            "    if 'rollout_worker' in ''.join(traceback.format_stack()):\n"
            "        raise RuntimeError('broken only at training time')\n"
            "    return _real_load_environment(**kwargs)\n")

    res = _run(tmp_path, monkeypatch, model_cache, edit)
    assert res.status == "job_failed", (res.status, res.error, res.log_tail[-800:])
    assert "broken only at training time" in res.error
    assert "infrastructure failure" not in res.log_tail


@pytest.mark.slow  # the default suite keeps its micro-model twin: tests/probe/test_nonfinite_rubric.py
def test_a_rubric_that_returns_nan_in_training_is_job_failed(tmp_path, monkeypatch, model_cache):
    def edit(text: str) -> str:
        return text.replace("funcs=[correct_answer, calculator_use]", "funcs=[nan_reward, calculator_use]") + (
            "\n\ndef nan_reward(completion, answer, **kwargs):\n    return float('nan')\n")

    res = _run(tmp_path, monkeypatch, model_cache, edit)
    assert res.status == "job_failed", (res.status, res.error, res.log_tail[-800:])
    assert "nan" in res.error.lower() and "rubric" in res.error


@pytest.mark.parametrize("body,expected", [
    ("        import os\n        os._exit(1)\n", r"rollout worker exited with code 1 in load_environment"),
    ("        import sys\n        sys.exit('dataset not found')\n", r"SystemExit: dataset not found"),
    # slow: the idle rule needs its window (131 s on 2 cores, 2026-12-05)
    pytest.param("        import time\n        time.sleep(3600)\n", r"without working", marks=pytest.mark.slow,
                 id="hangs"),
], ids=["os_exit", "sys_exit", "hangs"])
def test_an_environment_that_exits_or_hangs_in_the_rollout_worker_is_job_failed(
        tmp_path, monkeypatch, model_cache, body, expected):
    """Issue 48 on the local backend: load_environment exits the rollout worker (os._exit, sys.exit: no
    traceback) or hangs there; the job ends job_failed with what happened, not infra_failed."""
    def edit(text: str) -> str:
        return text.replace("def load_environment(", "def _real_load_environment(") + (
            "\n\ndef load_environment(**kwargs):\n"
            "    import traceback\n"
            "    if 'rollout_worker' in ''.join(traceback.format_stack()):\n" + body +
            "    return _real_load_environment(**kwargs)\n")

    res = _run(tmp_path, monkeypatch, model_cache, edit)
    assert res.status == "job_failed", (res.status, res.error, res.log_tail[-800:])
    assert re.search(expected, res.error), res.error
