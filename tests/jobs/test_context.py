"""One job context (issue 49, item 4): the family, hidden set, seeds, models and built weights a job is judged
against are derived in one place per process and read from there by the baselines policy, the job cache and
the env; the kernel type imports nothing above it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ait_env.backends import make_backend
from ait_env.config import compose
from ait_env.hidden.baselines import BaselineEntry, BaselineStore
from ait_env.hidden.secrets import hidden_seeds_label, hidden_set_hash, job_context
from task_families import reference_files
from tests.helpers import make_bundle

ROOT = Path(__file__).resolve().parents[2]
MODEL = "Qwen/Qwen3-1.7B"


def _loads(module: str) -> set[str]:
    code = (f"import sys, {module};"
            "print(' '.join(m for m in sys.modules if m.startswith(('ait_env', 'task_families', 'gpu', 'fleet'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_the_kernel_type_imports_alone() -> None:
    assert _loads("ait_env.jobs.context") - _loads("ait_env") == {"ait_env.jobs", "ait_env.jobs.context"}


@pytest.mark.parametrize("seeds", ["published", "private"])
def test_a_backends_context_is_this_processs_hidden_set_and_its_built_weights(
        seeds: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AIT_SECRETS_FILE", str(tmp_path / "secrets.json"))
    monkeypatch.setenv("AIT_HIDDEN_SEEDS", seeds)
    backend = make_backend(compose(backend="stub").backend, tmp_path)
    monkeypatch.setattr(backend, "built_weights_hash", lambda m: f"w-{m}")
    job = backend.job_context("units")
    assert job.family == "units" and job.hidden_seeds == hidden_seeds_label()
    assert job.hidden_set_hash == hidden_set_hash("units") and job.hidden_seeds.startswith(seeds)
    assert job.models == tuple(m.name for m in backend.settings.models)
    assert all(job.weights_hash(m) == f"w-{m}" for m in job.models) and job.weights_hash("absent") == ""


def test_the_baselines_policy_reads_the_contexts_set_not_the_process_seeds(tmp_path: Path) -> None:
    """A pin holds for the hidden set the context names: a worker's context on another set finds it stale."""
    store = BaselineStore("unit-test-backend", user_dir=tmp_path)
    here = job_context("arithmetic", ["m"], {"m": "aa"})
    store.put([BaselineEntry(backend="unit-test-backend", family="arithmetic", model="m", score=0.3, n=300,
                             model_hash="aa", hidden_set_hash=here.hidden_set_hash)])
    assert store.for_job(here) == ({"m": 0.3}, {})
    assert store.best_pre(here, {}) == 0.3 and store.best_pre(here, {"m": 0.5, "other": 0.9}) == 0.5
    elsewhere = type(here)(family="arithmetic", hidden_set_hash="another-set", hidden_seeds="private:x",
                           models=("m",), weights={"m": "aa"})
    holding, missing = store.for_job(elsewhere)
    assert holding == {} and missing["m"].startswith("measured on another hidden set")


def test_the_job_cache_keys_on_the_context(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another hidden set or other built weights is another key: a cached result never crosses them."""
    backend = make_backend(compose(backend="stub", overrides={"backend": {"job_cache": True}}).backend, tmp_path)
    (tmp_path / "a").mkdir()
    bundle = make_bundle(reference_files("arithmetic", MODEL), tmp_path / "a")
    first = backend.run(bundle)
    assert backend.run(bundle).cache_hit
    monkeypatch.setattr(backend, "built_weights_hash", lambda m: "other-weights")
    assert not backend.run(bundle).cache_hit
    real = backend.job_context
    monkeypatch.setattr(backend, "job_context", lambda f, models=None: type(real(f))(
        family=f, hidden_set_hash="another-set", hidden_seeds="private:x", models=tuple(models or ())))
    again = backend.run(bundle)
    assert not again.cache_hit and first.post_score == again.post_score
