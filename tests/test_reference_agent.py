"""The scripted reference agent completes a valid, scored episode for every family on the stub
backend: its reference job passes the full validation probe (static + sandboxed dynamic stage)."""

from __future__ import annotations

import pytest

from ait_env.hidden.baselines import BaselineEntry, BaselineStore
from ait_env.agents.reference import ScriptedReferenceAgent, baseline_scores, pick_model
from task_families import FAMILY_NAMES


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_reference_agent_scores_on_stub(make_env, family):
    pytest.importorskip("verifiers")
    env = make_env(family=family)
    agent = ScriptedReferenceAgent()
    obs, info = env.reset(seed=1)
    agent.reset(info)
    for _ in range(10):
        obs, reward, terminated, truncated, info = env.step(agent.act(obs, info))
        if terminated or truncated:
            break
    assert terminated, obs
    r = info["reward"]
    assert r["status"] == "scored", obs
    assert r["validated_attempt"] == 1 and r["V"] == 1.0
    assert r["uplift"] > 0.2  # the surrogate rewards the reference hyperparameters


def test_reference_agent_trains_the_best_base_model(make_env, _private_data_dir):
    """It reads the baseline scores the env gives it and trains the model that scores best before
    training, here the smaller one (a user baseline store that says so), not the one with role larger."""
    BaselineStore("stub", user_dir=_private_data_dir / "baselines").put([
        BaselineEntry(backend="stub", family="arithmetic", model="Qwen/Qwen3-0.6B", score=0.5),
        BaselineEntry(backend="stub", family="arithmetic", model="Qwen/Qwen3-1.7B", score=0.2)])
    env = make_env(family="arithmetic")
    agent = ScriptedReferenceAgent()
    obs, info = env.reset(seed=1)
    agent.reset(info)
    for _ in range(3):
        obs, *_rest, info = env.step(agent.act(obs, info))
    assert agent.model == "Qwen/Qwen3-0.6B"
    assert 'base_model = "Qwen/Qwen3-0.6B"' in env.unwrapped.workspace.read("job.toml")


def test_pick_model_prefers_the_best_baseline_then_the_larger_role():
    info = {"base_models": [{"name": "small", "role": "small"}, {"name": "big", "role": "larger"}]}
    assert pick_model(info) == "big"
    assert pick_model(info, {"small": 0.41, "big": 0.30}) == "small"
    assert pick_model(info, {"small": 0.30, "big": 0.30}) == "big"
    assert pick_model(info, {"other": 0.9}) == "big"
    obs = "Hidden-eval scores of the untrained base models (fraction correct):\nsmall: 0.410\nbig: 0.303\n"
    assert baseline_scores(obs, ["small", "big"]) == {"small": 0.41, "big": 0.303}
