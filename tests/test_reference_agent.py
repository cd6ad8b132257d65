"""The scripted reference agent completes a valid, scored episode for every family on the stub
backend: its reference job passes the full validation probe (static + sandboxed dynamic stage)."""

from __future__ import annotations

import pytest

from ait_env.agents.reference import ScriptedReferenceAgent
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
