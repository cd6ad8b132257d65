"""A research episode on the real local backend (slow: about 2 minutes on 2 cores; run with ``pytest -m
slow``): the two-job reference agent trains ait-tiny-m for 5 steps, reads the curve and submits the
reference job (27 steps); the reward counts the better of the two jobs, less the charge for a second job.
Which job is better depends on the machine (the tiny models' weights differ by CPU vendor: on an AMD EPYC
the 5-step job already reaches the 27-step job's post score, 0.753 vs 0.757, and is cheaper), so the test
holds the rule, not one machine's winner. The same as ``python scripts/run_episode.py agent=research
env.max_jobs_per_episode=2``."""

from __future__ import annotations

import pytest

pytest.importorskip("verifiers")

from ait_env.agents.reference import TwoJobReferenceAgent  # noqa: E402
from ait_env.episode.reward import RewardSettings  # noqa: E402
from tests.helpers import play  # noqa: E402

MODEL = "ait-tiny-m"


@pytest.mark.slow
def test_the_second_job_of_the_two_job_reference_agent_improves_on_the_first(make_env):
    from cpu.tiny_models import catalog

    if not catalog.is_current(MODEL):
        pytest.skip(f"{MODEL} is not built here: python -m cpu.tiny_models.build")
    env = make_env(family="arithmetic", backend="local", overrides={"env": {"max_jobs_per_episode": 2}})
    agent = TwoJobReferenceAgent()
    obs, reward, terminated, _, info = play(env, agent, seed=0)
    b = info["reward"]
    assert terminated and agent.second, (agent.curve, obs)
    first, second = b["jobs"]
    assert first["status"] == second["status"] == "scored", obs
    assert [j["curves"]["eval_step"][-1] for j in info["jobs"]] == [5, 27]
    assert b["end"] == "job_limit" and second["post"] > second["best_pre"]  # the longer job trains too
    totals = [first["total"], second["total"]]
    assert b["best_job"] == totals.index(max(totals))
    assert reward == b["total"] == pytest.approx(max(totals) - RewardSettings().research.per_extra_job)
