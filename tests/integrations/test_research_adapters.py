"""Research episodes in every outer loop: the verifiers environment, the TRL adapter, the Tinker adapter and the
LLM runner declare exactly the gym env's tools (``submit_jobs`` and ``finish`` only when
``env.max_jobs_per_episode > 1``) with the same schemas, and the same scripted research episode (an lr sweep of
three jobs in one ``submit_jobs``, then ``finish``) scores the same through each; a Tinker turn that fails to
parse after jobs ran scores those jobs, not the parse-error reward."""

from __future__ import annotations

import asyncio
import inspect
import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

from ait_env.agents.reference import lr_sweep
from ait_env.backends import make_backend
from ait_env.config import compose
from ait_env.episode.messages import action_text
from ait_env.episode.tools import tool_schemas
from tests.fakes.job_writer import plan_files, sweep_policy
from tests.fakes.openai_server import ScriptedOpenAIServer

JOBS = 4
KEY = "AIT_TEST_OPENAI_KEY"


def _overrides(runs: Path, jobs: int = JOBS) -> dict[str, Any]:
    return {"env": {"runs_dir": str(runs), "probe": {"enabled": False}, "max_jobs_per_episode": jobs}}


def _fn(schemas: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {s["function"]["name"]: s["function"] for s in schemas}


def _direct(runs: Path, reset: dict[str, Any]) -> dict[str, Any]:
    """The scripted research episode straight against the gym env (text actions)."""
    env = gym.make("AIT/JobWriting-v0", backend="stub", overrides=_overrides(runs))
    _, info = env.reset(**reset)
    policy, messages, done = sweep_policy(), list(info["messages"]), False
    while not done:
        reply = policy(messages, info["tools"])
        calls = [(c["function"]["name"], json.dumps(c["function"]["arguments"])) for c in reply["tool_calls"]]
        n = len(info["messages"])
        _, _, term, trunc, info = env.step(action_text(reply["content"], calls))
        messages += info["messages"][n:]
        done = term or trunc
    env.close()
    return info["reward"]


@pytest.mark.parametrize("jobs", [1, JOBS])
def test_the_gym_env_declares_research_tools_only_in_research_episodes(tmp_path: Path, jobs: int) -> None:
    env = gym.make("AIT/JobWriting-v0", backend="stub", overrides=_overrides(tmp_path, jobs))
    _, info = env.reset(seed=0, options={"family": "arithmetic"})
    env.close()
    assert info["tools"] == tool_schemas(research=jobs > 1)
    names = [t["function"]["name"] for t in info["tools"]]
    assert ("submit_jobs" in names) == ("finish" in names) == (jobs > 1)


@pytest.mark.parametrize("jobs", [1, JOBS])
def test_verifiers_declares_the_gym_envs_tools(tmp_path: Path, jobs: int) -> None:
    pytest.importorskip("verifiers")
    from ait_env.integrations import verifiers_env as V

    env = V.load_environment(families="arithmetic", num_examples=1, num_eval_examples=0,
                             overrides=_overrides(tmp_path, jobs))
    got = {t.name: {"name": t.name, "description": t.description, "parameters": t.parameters}
           for t in env.tool_defs}
    assert got == _fn(tool_schemas(research=jobs > 1))
    assert ("submit_jobs" in env.get_dataset()[0]["prompt"][0]["content"]) == (jobs > 1)


@pytest.mark.parametrize("jobs", [1, JOBS])
def test_trl_declares_the_gym_envs_tools(tmp_path: Path, jobs: int) -> None:
    get_json_schema = pytest.importorskip("transformers.utils").get_json_schema
    from ait_env.integrations.trl import EnvironmentFactory

    backend = make_backend(compose(backend="stub").backend, tmp_path)
    with EnvironmentFactory(backend, family="arithmetic", overrides=_overrides(tmp_path, jobs)) as factory:
        env = factory()
        methods = [getattr(env, n) for n, _ in inspect.getmembers(type(env), predicate=inspect.isfunction)
                   if n not in ("reset", "get_reward") and not n.startswith("_")]
        got = {s["function"]["name"]: s["function"] for s in map(get_json_schema, methods)}
        system = factory.dataset(1)[0]["prompt"][0]["content"]
    want = _fn(tool_schemas(research=jobs > 1))
    assert sorted(got) == sorted(want)
    for name, f in want.items():
        assert got[name]["description"] == f["description"], name
        assert got[name]["parameters"]["properties"] == f["parameters"]["properties"], name
        assert got[name]["parameters"].get("required", []) == f["parameters"]["required"], name
    assert ("submit_jobs" in system) == (jobs > 1)


def test_the_same_research_episode_scores_the_same_through_gym_verifiers_trl_and_the_llm_runner(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    direct = _direct(tmp_path / "direct", {"seed": 0, "options": {"family": "arithmetic", "instance": 0}})
    assert direct["status"] == "scored" and direct["end"] == "finish" and len(direct["jobs"]) == 3
    assert direct["charge"] == pytest.approx(0.04)
    assert direct["total"] == pytest.approx(max(j["total"] for j in direct["jobs"]) - 0.04)
    assert len({j["total"] for j in direct["jobs"]}) >= 2   # the sweep's jobs differ

    # TRL: each tool call is one env step
    from ait_env.integrations.trl import EnvironmentFactory, ResearchToolEnv

    backend = make_backend(compose(backend="stub").backend, tmp_path / "trl")
    with EnvironmentFactory(backend, family="arithmetic", overrides=_overrides(tmp_path / "trl")) as factory:
        env = factory()
        assert isinstance(env, ResearchToolEnv)
        env.reset(family="arithmetic", instance=0, prompt=[])
        env.read_file(path="job.toml")
        env.get_baseline_scores()
        sweep = lr_sweep(plan_files("\n".join(str(m["content"]) for m in env.info["messages"])))
        for k, v in sweep.items():
            env.write_file(path=k, content=v)
        assert "Ran 3 jobs at once" in env.submit_jobs(folders=["lr_0", "lr_1", "lr_2"])
        env.finish()
        assert env.get_reward() == pytest.approx(direct["total"])

    # verifiers' own rollout code against a scripted OpenAI-compatible server
    pytest.importorskip("verifiers")
    import verifiers as vf

    from ait_env.integrations import verifiers_env as V

    monkeypatch.setenv(KEY, "test")
    venv = V.load_environment(families="arithmetic", num_examples=1, num_eval_examples=0,
                              overrides=_overrides(tmp_path / "vf"))
    with ScriptedOpenAIServer(sweep_policy()) as server:
        out = venv.evaluate_sync(client=vf.ClientConfig(api_base_url=server.base_url, api_key_var=KEY),
                                 model="scripted-model", num_examples=1, rollouts_per_example=1,
                                 state_columns=["ait_reward", "ait_job"])["outputs"]
        assert all(_fn(req["tools"]) == _fn(tool_schemas(research=True)) for req in server.requests)
    (o,) = out
    assert o.get("error") is None and o["ait_reward"]["end"] == "finish"
    assert o["reward"] == pytest.approx(direct["total"])

    # the LLM runner (native tools): the same tools, the same reward, and the research columns
    from ait_env.agents.llm import AgentSettings, run

    llm_direct = _direct(tmp_path / "direct-llm", {"seed": 0, "options": {"family": "arithmetic"}})
    with ScriptedOpenAIServer(sweep_policy()) as server:
        rows = run(AgentSettings(base_url=server.base_url, model="scripted-model", tool_mode="native"),
                   ["arithmetic"], 1, backend="stub", out=tmp_path / "llm", concurrency=1,
                   overrides={"env": {"probe": {"enabled": False}, "max_jobs_per_episode": JOBS}})
        assert all(_fn(req["tools"]) == _fn(tool_schemas(research=True)) for req in server.requests)
    row = rows["all"]
    assert row["mean_reward"] == pytest.approx(llm_direct["total"])
    assert row["jobs_per_episode"] == 3 and row["batch_share"] == 1.0
    best = max(j["total"] for j in llm_direct["jobs"])
    assert row["best_vs_first"] == pytest.approx(best - llm_direct["jobs"][0]["total"])
    assert "| jobs/episode | batch share | best − first job | USD/episode |" in (tmp_path / "llm" / "results.md").read_text()


# ------------------------------------------------------------------------------------------- Tinker
tinker_cookbook = pytest.importorskip("tinker_cookbook", reason="install the outer-loop extra: pip install -e '.[tinker]'")

from tinker_cookbook.rl.rollouts import do_group_rollout  # noqa: E402
from tinker_fixtures import local_tokenizer  # noqa: E402,F401  (fixture)

from ait_env.integrations.tinker import AdapterConfig, get_renderer  # noqa: E402
from ait_env.integrations.tinker_datasets import JobWritingGroupBuilder, drop_infra_strategy  # noqa: E402
from ait_env.integrations.tinker_offline import ScriptedPolicy  # noqa: E402

INSTRUCT = "Qwen/Qwen3-4B-Instruct-2507"


def _tinker(runs: Path, plan: str, jobs: int = JOBS) -> tuple[Any, list[Any]]:
    cfg = AdapterConfig(model_name=INSTRUCT, renderer_name="qwen3_instruct", env_overrides=_overrides(runs, jobs),
                        max_tokens=20000, run_id="t")
    builder = JobWritingGroupBuilder(cfg, "arithmetic", 0, 1, "train", ["train"])
    envs: list[Any] = []
    orig = builder.make_envs

    async def keep() -> Any:
        made = await orig()
        envs.extend(made)
        return made

    builder.make_envs = keep  # type: ignore[method-assign]
    policy = ScriptedPolicy(get_renderer(cfg.renderer_name, cfg.model_name), plans=(plan,))
    group = asyncio.run(do_group_rollout(builder, policy, strategy=drop_infra_strategy(1, min_group=1)))
    return group, envs


def test_the_tinker_dry_run_plays_the_same_research_episode(local_tokenizer, tmp_path: Path) -> None:
    direct = _direct(tmp_path / "direct", {"seed": 0, "options": {"family": "arithmetic", "instance": 0}})
    group, envs = _tinker(tmp_path / "runs", "research_batch")
    (traj,) = group.trajectories_G
    me = envs[0].message_env
    assert '"submit_jobs"' in str(me.history[0]["content"]) and me.info["tools"] == tool_schemas(research=True)
    assert me.info["reward"]["end"] == "finish" and len(me.info["reward"]["jobs"]) == 3
    assert sum(t.reward for t in traj.transitions) == pytest.approx(direct["total"])
    (m,) = group.metrics_G
    assert m["ait/jobs"] == 3 and m["ait/batch_share"] == 1.0 and m["ait/end/finish"] == 1.0


def test_a_tinker_parse_failure_after_jobs_ran_scores_those_jobs(local_tokenizer, tmp_path: Path) -> None:
    group, envs = _tinker(tmp_path / "runs", "research_parse")
    (traj,) = group.trajectories_G
    me = envs[0].message_env
    b = me.info["reward"]
    assert traj.transitions[-1].metrics.get("parse_error") == 1.0   # the cookbook did see a parse failure
    assert b["end"] == "aborted" and b["status"] == "scored" and len(b["jobs"]) == 3
    total = sum(t.reward for t in traj.transitions)
    assert total == pytest.approx(b["total"]) and total != pytest.approx(-0.1)
    assert total == pytest.approx(max(j["total"] for j in b["jobs"]) - 0.04)
    (m,) = group.metrics_G
    assert m["ait/status/scored"] == 1.0 and m["ait/end/aborted"] == 1.0


def test_a_tinker_parse_failure_before_any_job_keeps_the_parse_error_reward(local_tokenizer, tmp_path: Path) -> None:
    """A parse failure with no job run yet: nothing to score, the cookbook's parse-error reward stands."""
    from ait_env.integrations import tinker_offline

    orig = tinker_offline.plan_turn

    def early(variant: str, ctx: Any) -> Any:   # the unterminated turn comes before the batch
        return orig(variant, ctx.__class__(turn=4, text=ctx.text) if ctx.turn >= 2 else ctx)

    tinker_offline.plan_turn = early
    try:
        group, envs = _tinker(tmp_path / "runs", "research_parse")
    finally:
        tinker_offline.plan_turn = orig
    (traj,) = group.trajectories_G
    assert sum(t.reward for t in traj.transitions) == pytest.approx(-0.1)
    assert not envs[0].message_env.info.get("jobs")
