"""A rubric that is finite on the probe's dev transcripts and NaN during training fails the job at the
trainer, and what the agent reads names the cause in its own terms, with no host path (issue:
untrusted submissions, item 3)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import gymnasium as gym
import pytest

pytest.importorskip("verifiers")

import cpu.executor as executor  # noqa: E402
import ait_env.runner as runner  # noqa: E402
from ait_env.backends.base import Backend, JobHandle
from ait_env.jobs.settings import BackendBounds, BackendSettings, ModelInfo  # noqa: E402
from ait_env.conf import load_group  # noqa: E402
from cpu.trainer import RolloutWorkerError, check_rewards  # noqa: E402
from task_families import reference_files  # noqa: E402
from hostile import MODEL, bundle_of, submit  # noqa: E402

CHECKOUT = str(Path(__file__).resolve().parents[2])
#: finite for the probe's few dev transcripts, NaN from the 20th call on (the second training step)
LATE_NAN = ("_calls = [0]\n\n\ndef late_nan(completion, answer, **kwargs) -> float:\n    _calls[0] += 1\n"
            "    return float('nan') if _calls[0] > 20 else correct_answer(completion, answer)\n")
RUBRIC = "rubric = vf.Rubric(funcs=[correct_answer, calculator_use], weights=[0.9, 0.1])"


def _late_nan_files(model: str = MODEL) -> dict[str, str]:
    files = reference_files("arithmetic", model)
    env = files["environment.py"]
    assert RUBRIC in env
    env = env.replace(RUBRIC, "rubric = vf.Rubric(funcs=[late_nan], weights=[1.0])")
    files["environment.py"] = env.replace("\ndef load_environment(", LATE_NAN + "\n\ndef load_environment(", 1)
    return files


def host_paths() -> list[str]:
    return [p for p in {sys.prefix, sys.base_prefix, CHECKOUT, tempfile.gettempdir(), str(Path.home())} if len(p) > 1]


def test_check_rewards_names_the_step_and_the_value():
    groups = [[{"reward": 1.0}, {"reward": None, "reward_raw": "nan"}], [{"reward": float("inf")}, {"reward": 0.0}]]
    with pytest.raises(RolloutWorkerError, match=r"your rubric returned nan at training step 2 \(for 2 of 4"):
        check_rewards(groups, 2)
    check_rewards([[{"reward": 0.5}, {"reward": 1}]], 1)


def test_the_probe_accepts_the_rubric(make_env):
    obs, info = submit(make_env(family="arithmetic"), _late_nan_files())
    assert info["reward"]["status"] == "scored", obs  # why the trainer must guard on its own


def test_training_fails_the_job_with_the_agents_cause(tmp_path, monkeypatch, micro_model, micro_tokenizer):
    monkeypatch.setattr(executor, "load_base_model", lambda name: (micro_model, micro_tokenizer))
    files = _late_nan_files("micro")
    files["job.toml"] = (files["job.toml"].replace("max_steps = 60", "max_steps = 3")
                         .replace("batch_size = 128", "batch_size = 16").replace("group_size = 8", "group_size = 4")
                         .replace("warmup_steps = 5", "warmup_steps = 1").replace("max_tokens = 256", "max_tokens = 48")
                         .replace("num_examples = 4000", "num_examples = 200"))
    bundle = bundle_of(files, tmp_path)
    settings = BackendSettings(name="local", models=[ModelInfo(name="micro", role="small")],
                               bounds=BackendBounds(wall_clock_minutes=5),
                               options={"eval_every": 0, "eval_limit": 16, "measure_pre": True, "eval_max_tokens": 48})
    res = runner.run(bundle.root, settings, progress=False)
    assert res.status == "job_failed", res.log_tail
    assert "your rubric returned nan at training step 2" in res.error

    # what the agent reads of it: the cause, and no path of this machine
    class Replay(Backend):
        def submit(self, b):  # noqa: ANN001
            return JobHandle(job_id=b.job_id, backend=self.name)

        def wait(self, handle, timeout=None):  # noqa: ANN001
            return res.model_copy(update={"job_id": handle.job_id, "error": res.error + "\n" + res.log_tail})

    replay = Replay(BackendSettings.model_validate(load_group("backend", "stub")))
    env = gym.make("AIT/JobWriting-v0", family="arithmetic", backend=replay,
                   overrides={"env": {"runs_dir": str(tmp_path / "runs")}})
    try:
        obs, info = submit(env, _late_nan_files())
    finally:
        env.close()
    assert info["reward"]["status"] == "job_failed"
    assert "your rubric returned nan at training step 2" in obs
    leaked = [p for p in host_paths() if p in obs]
    assert not leaked, (leaked, obs)
