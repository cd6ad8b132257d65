"""Backends have a lifecycle and typed options: one per run, closed by whoever built it; unknown
options are errors that name the allowed ones; a local job whose model is not built fails fast."""

from __future__ import annotations

import time

import gymnasium as gym
import pytest

from ait_env.backends import BackendOptionsError, make_backend
from ait_env.jobs.settings import BackendSettings
from ait_env.config import compose, load_group
from task_families import reference_files
from tests.helpers import make_bundle


def test_an_unknown_option_names_the_allowed_ones():
    with pytest.raises(BackendOptionsError, match=r"pool_size: unknown option\. Allowed options: .*lr_scale.*"
                                                  r"max_parallel_jobs"):
        make_backend(compose(backend="local", overrides={"backend": {"options": {"pool_size": 16}}}).backend)
    with pytest.raises(BackendOptionsError, match="Allowed options: none"):
        make_backend(BackendSettings.model_validate({**load_group("backend", "stub"), "options": {"x": 1}}))


def test_a_mistyped_option_says_what_is_wrong():
    with pytest.raises(BackendOptionsError, match="eval_every"):
        make_backend(compose(backend="local", overrides={"backend": {"options": {"eval_every": "often"}}}).backend)


def test_env_closes_the_backend_it_built_and_never_one_it_was_given(tmp_path):
    runs = {"env": {"runs_dir": str(tmp_path)}}
    own = gym.make("AIT/JobWriting-v0", family="arithmetic", backend="stub", overrides=runs)
    own_backend = own.unwrapped.backend
    own.close()
    assert own_backend.closed
    with make_backend(compose(backend="stub").backend, tmp_path) as shared:
        envs = [gym.make("AIT/JobWriting-v0", family="arithmetic", backend=shared, overrides=runs) for _ in range(3)]
        assert all(e.unwrapped.backend is shared for e in envs)
        assert envs[0].unwrapped.settings.backend == shared.settings
        for e in envs:
            e.close()
        assert not shared.closed
    assert shared.closed


def test_a_local_job_whose_model_is_not_built_fails_fast_naming_the_build(tmp_path, monkeypatch):
    monkeypatch.setenv("AIT_CACHE_DIR", str(tmp_path / "empty-cache"))
    backend = make_backend(compose(backend="local").backend, tmp_path / "runs")
    bundle = make_bundle(reference_files("arithmetic", "ait-tiny-m"), tmp_path)
    t0 = time.time()
    result = backend.run(bundle)
    assert time.time() - t0 < 5
    assert result.status == "infra_failed"
    assert "ait-tiny-m is not built" in result.error and "python -m cpu.tiny_models.build" in result.error
    backend.close()
