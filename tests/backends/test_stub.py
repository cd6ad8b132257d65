"""The stub surrogate rewards better jobs more (documented formula, not training)."""

import pytest

from task_families import reference_files
from tests.helpers import call


def _episode(make_env, job_toml_edit):
    env = make_env(family="arithmetic")
    env.reset(seed=0)
    files = reference_files("arithmetic", "Qwen/Qwen3-1.7B")
    files["job.toml"] = job_toml_edit(files["job.toml"])
    env.step("".join(call("write_file", path=k, content=v) for k, v in files.items()))
    _, r, term, _, info = env.step(call("submit_job"))
    assert term and info["reward"]["status"] == "scored", info.get("reward")
    return r, info


def test_better_hyperparameters_score_higher(make_env):
    good, info = _episode(make_env, lambda t: t)
    assert info["job"]["surrogate"] and "SURROGATE" in info["job"]["log_tail"]
    # a simulated job's wall time is its simulated training time, never less ("Wall 0.0 s (training 12.8 s)")
    assert info["job"]["train_seconds"] > 0 and info["job"]["wall_seconds"] >= info["job"]["train_seconds"]
    lr0, _ = _episode(make_env, lambda t: t.replace("lr = 3e-6", "lr = 0.0").replace("min_lr = 3e-7", "min_lr = 0.0"))
    few_steps, _ = _episode(make_env, lambda t: t.replace("max_steps = 60", "max_steps = 6"))
    collapse, cinfo = _episode(make_env, lambda t: t.replace("lr = 3e-6", "lr = 1e-3"))
    small, _ = _episode(make_env, lambda t: t.replace("Qwen3-1.7B", "Qwen3-0.6B"))
    assert good > few_steps > lr0 > collapse
    assert good > small
    assert cinfo["reward"]["uplift"] < 0
    # lr 0 changes nothing: U = 0.5 and no speed term (S counts only for jobs that lifted the model)
    assert lr0 == pytest.approx(0.35 + 0.6 * (0.25 * 0.216 + 0.75 * 0.5), abs=1e-3)
