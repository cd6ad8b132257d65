"""A micro version of the whole local path: bundle -> sandboxed verifiers rollouts -> GRPO -> hidden eval
-> result.json, with a micro model (seconds) instead of the built catalog models."""

from __future__ import annotations

import json

import pytest

import cpu.executor as executor
import ait_env.runner as runner
from task_families import reference_files
from ait_env.jobs.settings import BackendBounds, BackendSettings, ModelInfo
from ait_env.jobs.bundle import build_bundle
from ait_env.jobs.schema import parse_job
from cpu.tiny_models.model import TinyLM
from ait_env.hidden.secrets import job_context
from task_families import get_family

pytest.importorskip("verifiers")


def _bundle(tmp_path, env_py_edit=lambda t: t):
    fam = get_family("arithmetic")
    ws = tmp_path / "ws"
    ws.mkdir()
    files = reference_files("arithmetic", "micro")
    files["job.toml"] = (files["job.toml"].replace("max_steps = 60", "max_steps = 3")
                         .replace("batch_size = 128", "batch_size = 16").replace("group_size = 8", "group_size = 4")
                         .replace("warmup_steps = 5", "warmup_steps = 1").replace("max_tokens = 256", "max_tokens = 48")
                         .replace("num_examples = 4000", "num_examples = 200"))
    files["environment.py"] = env_py_edit(files["environment.py"])
    for k, v in files.items():
        (ws / k).write_text(v)
    job, issues = parse_job(files["job.toml"])
    assert job is not None, issues
    return build_bundle(ws, job, fam, tmp_path / "jobs")


def _settings() -> BackendSettings:
    return BackendSettings(name="local", models=[ModelInfo(name="micro", role="small")],
                           bounds=BackendBounds(wall_clock_minutes=5),
                           options={"eval_every": 2, "eval_subset": 16, "eval_limit": 32, "measure_pre": True,
                                    "eval_max_tokens": 48})


def test_micro_job_end_to_end(tmp_path, monkeypatch, micro_model, micro_tokenizer):
    model = TinyLM(micro_model.cfg)
    model.load_state_dict(micro_model.state_dict())
    monkeypatch.setattr(executor, "load_base_model", lambda name: (model, micro_tokenizer))
    b = _bundle(tmp_path)
    res = runner.run(b.root, _settings(), progress=False)
    assert res.status == "succeeded", res.log_tail
    on_disk = json.loads((b.root / "result.json").read_text())
    assert on_disk["status"] == "succeeded" and on_disk["post_score"] == res.post_score
    c = res.curves
    assert len(c["train_reward"]) == 3 and c["eval_step"] == [0.0, 2.0, 3.0] and len(c["eval_score"]) == 3
    assert "bwrap" in res.log_tail or "fallback" in res.log_tail  # the agent's code ran in the sandbox
    assert "lr_scale" in res.log_tail
    weights = b.root / "outputs" / "weights" / "step_3"
    assert TinyLM.load(weights).cfg == model.cfg and (weights / "tokenizer_config.json").exists()
    # the weights changed exactly when some step had a non-zero advantage to learn from
    changed = any((p1 - p2).abs().sum() > 0 for p1, p2 in zip(model.parameters(), micro_model.parameters()))
    assert changed == (sum(c["trained_tokens"]) > 0)


def test_job_whose_environment_breaks_is_job_failed(tmp_path, monkeypatch, micro_model, micro_tokenizer):
    monkeypatch.setattr(executor, "load_base_model", lambda name: (micro_model, micro_tokenizer))
    b = _bundle(tmp_path, lambda t: t.replace("    dataset = build_dataset(num_examples, seed)\n",
                                               "    raise RuntimeError('broken at training time')\n"))
    res = runner.run(b.root, _settings(), progress=False)
    assert res.status == "job_failed" and "broken at training time" in res.error


def test_a_stale_pin_of_the_other_model_is_measured(tmp_path, monkeypatch, micro_model, micro_tokenizer):
    """The job's model has a current pin; the other model's pin was measured on other weights, so the
    runner measures that model's base itself and ``best_pre`` compares with what it really scores."""
    from ait_env.hidden.baselines import BaselineEntry, BaselineStore
    from cpu.tiny_models import catalog

    store = BaselineStore("local", user_dir=tmp_path / "pins")
    store.put([BaselineEntry(backend="local", family="arithmetic", model="micro", score=0.25, model_hash="aa"),
               BaselineEntry(backend="local", family="arithmetic", model="other", score=0.99, model_hash="old")])
    monkeypatch.setattr(catalog, "weights_hash", lambda name: {"micro": "aa", "other": "new"}[name])
    loaded: list[str] = []

    def load(name):
        loaded.append(name)
        m = TinyLM(micro_model.cfg)
        m.load_state_dict(micro_model.state_dict())
        return m, micro_tokenizer

    monkeypatch.setattr(executor, "load_base_model", load)
    settings = _settings()
    settings.models.append(ModelInfo(name="other", role="larger"))
    settings.options.update(measure_pre=False, eval_every=0)
    b = _bundle(tmp_path)
    res = runner.run(b.root, settings, progress=False, baselines_dir=tmp_path / "pins")
    assert res.status == "succeeded", res.log_tail
    assert loaded == ["micro", "other"]
    assert res.baselines["micro"] == 0.25                      # the current pin, read
    assert res.baselines["other"] != 0.99 and 0.0 <= res.baselines["other"] <= 1.0   # measured, not the stale pin
    assert "the arithmetic baseline of other is measured on other weights (old, built here: new); measuring it" \
        in res.log_tail
    assert "pre_eval_other" in res.timings
    # measured on a subset (eval_limit): never pinned; a full-set measurement would be
    assert store.for_job(job_context("arithmetic", ["other"], {"other": "new"}))[0] == {}
    assert "pinned other" not in res.log_tail
