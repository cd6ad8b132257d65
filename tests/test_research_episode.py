"""Research episodes (``env.max_jobs_per_episode > 1``): job results come back to the agent, it may submit
again or ``finish``; every end condition (job count, budget, finish, turn limit, attempts, an
infrastructure failure in a later job, which never voids the jobs that ran) and the reward ``max_k R_k - charge``. The default episode (one
job) shows none of it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from ait_env.agents.reference import TwoJobReferenceAgent, eval_curve, with_steps
from task_families import reference_files
from ait_env.backends.stub import StubBackend
from ait_env.config import compose
from ait_env.observe.ledger import CostRecord
from ait_env.episode.reward import RewardSettings
from ait_env.episode.tools import TOOL_NAMES
from tests.helpers import call, play

MODEL = "Qwen/Qwen3-1.7B"
FILES = reference_files("arithmetic", MODEL)
SHORT = with_steps(FILES["job.toml"], 5)
S = RewardSettings()
NO_PROBE = {"probe": {"enabled": False}}  # the probe is not what these tests are about


class ScriptedStub(StubBackend):
    """The stub, whose n-th job ends with ``plan[n]``: ``succeeded``, ``job_failed`` (a NaN loss, a log tail
    naming a host path) or ``raise`` (the backend crashes: an infrastructure failure)."""

    def __init__(self, *args: Any, plan: tuple[str, ...] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.plan = list(plan)

    def run(self, bundle: Any, timeout: float | None = None) -> Any:
        status = self.plan.pop(0) if self.plan else "succeeded"
        if status == "raise":
            raise RuntimeError("pod lost (simulated)")
        result = super().run(bundle, timeout)
        if status == "job_failed":
            tail = f"step 3: loss nan\nsee {Path.home()}/work/trainer.log"
            return result.model_copy(update={"status": "job_failed", "post_score": None, "curves": {},
                                             "error": "loss is NaN at step 3", "log_tail": tail})
        return result


def _research_env(make_env: Any, runs_dir: Path, jobs: int = 2, env: dict[str, Any] | None = None,
                  plan: tuple[str, ...] = (), cost: float = 0.0) -> Any:
    settings = compose(backend="stub").backend.model_copy(update={"cost_usd_per_job": cost})
    backend = ScriptedStub(settings, runs_dir, plan=plan)
    return make_env(family="arithmetic", backend=backend,
                    overrides={"env": {"max_jobs_per_episode": jobs, **NO_PROBE, **(env or {})}})


def _write(job_toml: str) -> str:
    return call("write_file", path="job.toml", content=job_toml) + call(
        "write_file", path="environment.py", content=FILES["environment.py"])


def test_a_default_episode_has_no_research_surface(make_env):
    env = make_env(family="arithmetic", overrides={"env": NO_PROBE})
    obs, info = env.reset(seed=0)
    assert [t["function"]["name"] for t in info["tools"]] == list(TOOL_NAMES)
    assert '"finish"' not in obs and "jobs_left" not in info and "per job" not in obs
    obs, *_ = env.step(call("finish"))
    assert "unknown tool 'finish'. Available tools: " + ", ".join(TOOL_NAMES) + "." in obs
    env.step(_write(FILES["job.toml"]))
    obs, r, term, _, info = env.step(call("submit_job") + call("list_files"))
    assert term and "skipped: the episode ended at submit_job" in obs and "Eval points" not in obs
    b = info["reward"]
    assert b["end"] == "job_limit" and b["charge"] == 0.0 and b["best_job"] == 0 and len(b["jobs"]) == 1
    assert r == b["total"] == b["jobs"][0]["total"] and info["job"] == info["jobs"][0]


def test_job_results_come_back_and_the_job_limit_ends_it(make_env, runs_dir):
    env = _research_env(make_env, runs_dir, jobs=2)
    obs, info = env.reset(seed=0)
    names = [t["function"]["name"] for t in info["tools"]]
    assert names == [*TOOL_NAMES, "submit_jobs", "finish"] and "You may run up to 2 jobs within a budget of $5.00" in obs
    assert "less\n  0.02 for each job after the first and 0.05 per USD" in obs
    assert info["jobs_left"] == 2 and info["budget_left_usd"] == 5.0
    env.step(_write(SHORT))
    obs, r, term, trunc, info = env.step(call("submit_job"))
    assert not term and not trunc and r == 0.0
    first = info["jobs"][0]
    assert re.search(r"Job 1 of 2 \(\S+\) finished \[SURROGATE score: stub backend, nothing was trained\]: "
                     r"hidden-eval score 0\.\d{3} \(Qwen/Qwen3-1\.7B before training 0\.\d{3}; "
                     r"best untrained base 0\.\d{3}; uplift \+0\.\d{3}\)\.", obs), obs
    assert eval_curve(obs) == [(s, round(v, 3)) for s, v in zip(first["curves"]["eval_step"],
                                                                first["curves"]["eval_score"])]
    # the stub's simulated job: its wall time is its simulated training time, never less
    assert "Wall time 12.8 s (training 12.8 s); cost $0.00. This job's reward on its own: " in obs
    assert "Jobs left: 1 of 2; budget: $5.00 of $5.00 left" in obs and "call finish" in obs
    assert info["jobs_left"] == 1 and info["attempts_left"] == 3 and info["job"] == first
    env.step(call("write_file", path="job.toml", content=FILES["job.toml"]))
    obs, r, term, _, info = env.step(call("submit_job"))
    b = info["reward"]
    assert term and b["end"] == "job_limit" and b["status"] == "scored" and b["best_job"] == 1
    assert "That was the last of your 2 jobs; the episode ends. Reward " in obs
    j1, j2 = b["jobs"]
    assert j2["post"] > j1["post"] and b["post"] == j2["post"]
    assert b["charge"] == pytest.approx(S.research.per_extra_job)
    assert r == b["total"] == pytest.approx(j2["total"] - S.research.per_extra_job)
    assert b["attempts"] == 2 and j1["attempts"] == j2["attempts"] == 1
    assert info["job"]["job_id"] == j2["job_id"] == b["job_id"] and len(info["jobs"]) == 2
    gpu = [rec for rec in env.unwrapped.ledger.records() if rec.kind == "gpu_job"]
    assert [rec.meta["job_id"] for rec in gpu] == [j1["job_id"], j2["job_id"]]


def test_one_job_then_finish_is_the_single_job_reward(make_env, runs_dir):
    single = make_env(family="arithmetic", overrides={"env": NO_PROBE})
    single.reset(seed=0)
    single.step(_write(FILES["job.toml"]))
    *_, info_single = single.step(call("submit_job"))
    env = _research_env(make_env, runs_dir, jobs=3)
    env.reset(seed=0)
    env.step(_write(FILES["job.toml"]))
    env.step(call("submit_job"))
    obs, r, term, _, info = env.step(call("finish") + call("list_files"))
    assert term and "Episode finished after 1 job. Reward " in obs
    assert "skipped: the episode ended at finish" in obs
    b = info["reward"]
    assert b["end"] == "finish" and b["charge"] == 0.0
    assert r == b["total"] == info_single["reward"]["total"]


@pytest.mark.parametrize("submitted,status,reward", [(False, "unparsable", -0.1), (True, "invalid", 0.0)])
def test_finish_without_a_job(make_env, runs_dir, submitted, status, reward):
    env = _research_env(make_env, runs_dir)
    env.reset(seed=0)
    if submitted:  # the template's job.toml parses but does not validate
        env.step(call("submit_job"))
    obs, r, term, _, info = env.step(call("finish"))
    assert term and r == reward and info["reward"]["status"] == status and info["reward"]["end"] == "finish"
    assert f"Episode finished without a job ({status})" in obs and "jobs" not in info


def test_the_budget_ends_it_when_it_cannot_pay_another_job(make_env, runs_dir):
    """$2 jobs, a $5 episode budget (the ledger's env.ledger.episode_budget_usd): after two jobs $1 is left,
    less than a job like the last, so the episode ends before its job limit."""
    env = _research_env(make_env, runs_dir, jobs=5, cost=2.0)
    env.reset(seed=0)
    env.step(_write(SHORT))
    obs, _, term, _, info = env.step(call("submit_job"))
    assert not term and "budget: $3.00 of $5.00 left" in obs and info["budget_left_usd"] == 3.0
    obs, r, term, _, info = env.step(call("submit_job"))
    b = info["reward"]
    assert term and b["end"] == "budget" and len(b["jobs"]) == 2
    assert "cannot pay for another job like this one ($1.00 left, $2.00 a job)" in obs
    assert b["charge"] == pytest.approx(S.research.per_extra_job + S.research.per_usd * 2.0)
    assert r == pytest.approx(b["jobs"][0]["total"] - b["charge"])  # the same job twice: the first counts


def test_a_budget_refusal_at_dispatch_ends_it_on_the_jobs_that_ran(make_env, runs_dir):
    """Spend the env did not make (the agent's tokens, recorded by a trainer) leaves too little for the next
    job: the ledger refuses it, it is neither run nor charged, and the episode is scored on job 1."""
    env = _research_env(make_env, runs_dir, jobs=3, cost=2.0)
    env.reset(seed=0)
    env.step(_write(FILES["job.toml"]))
    *_, info = env.step(call("submit_job"))
    env.unwrapped.ledger.append(CostRecord(kind="llm", episode_id=info["episode_id"], usd=2.5))
    obs, r, term, _, info = env.step(call("submit_job"))
    b = info["reward"]
    assert term and b["end"] == "budget" and b["status"] == "scored" and len(b["jobs"]) == 1
    assert "the episode's budget cannot pay for it: episode budget exceeded" in obs
    assert r == b["total"] == b["jobs"][0]["total"] and b["charge"] == 0.0
    assert len([rec for rec in env.unwrapped.ledger.records() if rec.kind == "gpu_job"]) == 1


def test_the_turn_limit_scores_the_jobs_that_ran(make_env, runs_dir):
    env = _research_env(make_env, runs_dir, jobs=3, env={"max_turns": 3})
    env.reset(seed=0)
    env.step(_write(FILES["job.toml"]))
    *_, info = env.step(call("submit_job"))
    obs, r, term, trunc, info = env.step(call("list_files"))
    b = info["reward"]
    assert trunc and not term and b["status"] == "scored" and b["end"] == "turn_limit"
    assert "The turn limit (3) was reached; the episode ends. Reward " in obs
    assert r == b["total"] == b["jobs"][0]["total"]


def test_attempts_that_run_out_on_a_later_job_keep_the_earlier_one(make_env, runs_dir):
    env = _research_env(make_env, runs_dir, jobs=3, env={"max_attempts": 2})
    env.reset(seed=0)
    env.step(_write(FILES["job.toml"]))
    *_, info = env.step(call("submit_job"))
    assert info["attempts_left"] == 2
    bad = FILES["job.toml"].replace("batch_size = 128", "batch_size = 100")
    obs, _, term, _, info = env.step(call("write_file", path="job.toml", content=bad) + call("submit_job"))
    assert not term and "1 attempt left" in obs and info["attempts_left"] == 1
    obs, r, term, _, info = env.step(call("submit_job"))
    b = info["reward"]
    assert term and b["end"] == "attempts" and b["status"] == "scored" and len(b["jobs"]) == 1
    assert "No attempts left; the episode ends. It counts your best job. Reward " in obs
    assert r == b["total"] == b["jobs"][0]["total"] and b["attempts"] == 3


def test_an_infra_failure_in_the_second_job_ends_the_episode_scored_on_the_first(make_env, runs_dir):
    """No voiding (issue 46): the lost job is dropped alone, the job that ran keeps its score
    (tests/episode/test_no_voiding.py has the property over many schedules)."""
    env = _research_env(make_env, runs_dir, jobs=2, plan=("succeeded", "raise"))
    env.reset(seed=0)
    env.step(_write(SHORT))
    env.step(call("submit_job"))
    env.step(call("write_file", path="job.toml", content=FILES["job.toml"]))
    obs, r, term, _, info = env.step(call("submit_job"))
    b = info["reward"]
    assert term and b["status"] == "scored" and not b["drop"] and r == b["total"] == b["jobs"][0]["total"]
    assert b["end"] == "infra_failed" and "pod lost (simulated)" in b["reason"] and b["charge"] == 0.0
    assert [j["status"] for j in b["jobs"]] == ["scored", "infra_failed"] and b["best_job"] == 0
    assert "infrastructure failed (RuntimeError: pod lost (simulated)); the job does not count" in obs


def test_a_failed_job_shows_its_cause_and_log_then_a_fix_counts(make_env, runs_dir):
    env = _research_env(make_env, runs_dir, jobs=2, plan=("job_failed",))
    env.reset(seed=0)
    env.step(_write(FILES["job.toml"]))
    obs, _, term, _, info = env.step(call("submit_job"))
    assert not term and "was valid but failed while running: loss is NaN at step 3" in obs
    assert "step 3: loss nan" in obs and str(Path.home()) not in obs  # through ait_env.hidden.redact.for_agent
    assert "Jobs left: 1 of 2" in obs and info["jobs"][0]["status"] == "job_failed"
    obs, r, term, _, info = env.step(call("submit_job"))
    b = info["reward"]
    assert term and b["status"] == "scored" and b["best_job"] == 1
    assert [j["status"] for j in b["jobs"]] == ["job_failed", "scored"]
    assert r == pytest.approx(b["jobs"][1]["total"] - S.research.per_extra_job)


def test_the_two_job_reference_agent_uses_its_first_result(make_env):
    """With the probe on: a 5-step job, then, since its curve still rose, the reference's 60 steps. The
    stub's surrogate curve flattens within every job, so the default ``min_rise`` keeps the first job."""
    pytest.importorskip("verifiers")
    for min_rise, jobs in ((0.0, 2), (0.01, 1)):
        env = make_env(family="arithmetic", overrides={"env": {"max_jobs_per_episode": 2}})
        agent = TwoJobReferenceAgent(min_rise=min_rise)
        obs, _, term, _, info = play(env, agent, seed=1)
        b = info["reward"]
        assert term and b["status"] == "scored" and len(b["jobs"]) == jobs, obs
        assert agent.curve[0][0] == 0 and agent.curve[-1][0] == 5 and agent.second is (jobs == 2)
        if jobs == 2:
            first, second = b["jobs"]
            assert second["post"] > first["post"] and b["best_job"] == 1 and b["end"] == "job_limit"
            assert info["jobs"][1]["curves"]["eval_step"][-1] == 60
        else:
            assert b["end"] == "finish" and info["jobs"][0]["curves"]["eval_step"][-1] == 5
