"""The JobWriting env through tinker-cookbook 0.5.8's own rollout code (offline: local tokenizer,
scripted token completer, stub backend): rewards, actions, datums, advantages, drops, ledger, splits."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import threading
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

pytest.importorskip("tinker_cookbook", reason="install the outer-loop extra: pip install -e '.[tinker]'")

from tinker_cookbook import renderers
from tinker_cookbook.exceptions import AllTrajectoriesFailedError
from tinker_cookbook.renderers.base import ToolCall, UnparsedToolCall
from tinker_cookbook.rl.data_processing import assemble_training_data, compute_advantages
from tinker_cookbook.rl.rollouts import do_group_rollout
from tinker_fixtures import local_tokenizer  # noqa: F401  (fixture)

from task_families import reference_files
from ait_env.integrations.tinker import (
    AdapterConfig,
    get_renderer,
    message_to_action,
    serialize_tokenizer,
    strip_tool_sections,
)
from ait_env.integrations.tinker_datasets import JobWritingDatasetBuilder, JobWritingGroupBuilder, drop_infra_strategy
from ait_env.integrations.tinker_offline import PlanContext, ScriptedPolicy, _job_files
from ait_env.episode.spec import system_prompt

INSTRUCT = "Qwen/Qwen3-4B-Instruct-2507"
BIG = "Qwen/Qwen3.6-35B-A3B"
PLANS = ("reference", "template", "collapse", "invalid")


def _cfg(runs: Path, renderer: str = "qwen3_instruct", model: str = INSTRUCT, **kw: Any) -> AdapterConfig:
    overrides = {"env": {"runs_dir": str(runs), "probe": {"enabled": False}}}
    prices = {"prefill": 1.0, "cached_prefill": 0.1, "sample": 2.0, "train": 3.0, "as_of": "test"}
    return AdapterConfig(model_name=model, renderer_name=renderer, env_overrides=overrides, max_tokens=20000,
                         prices=prices, run_id="t", **kw)


def _rollout(builder: JobWritingGroupBuilder, plans: tuple[str, ...] = PLANS, **strategy: Any) -> Any:
    policy = ScriptedPolicy(get_renderer(builder.cfg.renderer_name, builder.cfg.model_name), plans=plans)
    return asyncio.run(do_group_rollout(builder, policy, strategy=drop_infra_strategy(builder.group_size, **strategy)))


def _keep_envs(builder: JobWritingGroupBuilder) -> list[Any]:
    """The list that will hold the envs the builder makes (the builder forgets them at cleanup)."""
    envs: list[Any] = []
    orig = builder.make_envs

    async def keep() -> Any:
        made = await orig()
        envs.extend(made)
        return made

    builder.make_envs = keep  # type: ignore[method-assign]
    return envs


def _direct_reward(runs: Path, family: str, instance: int, plan: str) -> float:
    """The same job written straight into the gym env (JSON tool calls, no renderer, no cookbook)."""
    env = gym.make("AIT/JobWriting-v0", family="train", backend="stub",
                   overrides={"env": {"runs_dir": str(runs / "direct"), "probe": {"enabled": False}}})
    obs, info = env.reset(seed=instance, options={"family": family, "instance": instance})
    larger = next(m["name"] for m in info["base_models"] if m["role"] == "larger")
    small = next(m["name"] for m in info["base_models"] if m["role"] == "small")
    text = f'family = "{family}"\n' + "\n".join(f"- `{m}` ({r})" for m, r in ((larger, "larger"), (small, "small")))
    files = _job_files(PlanContext(turn=2, text=text), plan)
    env.step("".join("<tool_call>" + json.dumps({"name": "write_file", "arguments": {"path": k, "content": v}})
                     + "</tool_call>" for k, v in files.items()))
    r, done = 0.0, False
    while not done:
        _, r, term, trunc, info = env.step('<tool_call>{"name": "submit_job", "arguments": {}}</tool_call>')
        done = term or trunc
    env.close()
    return float(r)


@pytest.mark.parametrize("renderer,model,datums_per_traj", [("qwen3_instruct", INSTRUCT, 1), ("qwen3_5", BIG, None)])
def test_group_rollout_rewards_actions_datums_advantages(local_tokenizer, tmp_path, renderer, model,
                                                         datums_per_traj):
    builder = JobWritingGroupBuilder(_cfg(tmp_path / "runs", renderer, model), "arithmetic", 7, 4, "train",
                                     ["train", "arithmetic"])
    envs = _keep_envs(builder)
    group = _rollout(builder)
    rewards = group.get_total_rewards()
    assert len(rewards) == 4 and not group.rollout_errors
    # G rollouts of the same instance; each plan's reward equals the env's reward for that job
    assert {e.message_env.instance for e in envs} == {7}
    tok = get_renderer(renderer, model).tokenizer

    def plan_of(traj: Any) -> str:  # the policy writes "[plan NAME]" into an episode's first turn
        first = tok.decode(traj.transitions[0].ac.tokens)
        return next(p for p in PLANS if f"[plan {p}]" in first)

    by_plan = {plan_of(t): r for t, r in zip(group.trajectories_G, rewards, strict=True)}
    assert set(by_plan) == set(PLANS)
    for traj, r in zip(group.trajectories_G, rewards, strict=True):
        assert r == pytest.approx(sum(t.reward for t in traj.transitions))
    for plan in PLANS:
        assert by_plan[plan] == pytest.approx(_direct_reward(tmp_path, "arithmetic", 7, plan), abs=1e-9)
    assert by_plan["reference"] > by_plan["template"] > by_plan["collapse"] > by_plan["invalid"] == 0.0
    # tool calls parsed by the renderer became exactly these env actions
    ref = next(e for e in envs if "[plan reference]" in json.dumps(e.message_env.info["messages"][2]))
    msgs = ref.message_env.info["messages"]
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
             for m in msgs if m["role"] == "assistant" for c in m.get("tool_calls", [])]
    files = reference_files("arithmetic", "Qwen/Qwen3-1.7B")
    if renderer == "qwen3_5":  # Qwen3.5's XML parameters strip leading/trailing newlines of a value
        files = {k: v.strip("\n") for k, v in files.items()}
    assert calls[0] == ("read_file", {"path": "job.toml"}) and calls[1] == ("get_baseline_scores", {})
    assert ("write_file", {"path": "job.toml", "content": files["job.toml"]}) in calls
    assert ("write_file", {"path": "environment.py", "content": files["environment.py"]}) in calls
    assert calls[-1] == ("submit_job", {})
    assert ref.message_env.info["reward"]["status"] == "scored"
    # advantages centred per group; datums
    (adv,) = compute_advantages([group])
    assert float(adv.sum()) == pytest.approx(0.0, abs=1e-6)
    assert [float(a) for a in adv] == pytest.approx([r - sum(rewards) / 4 for r in rewards])
    data, meta = assemble_training_data([group], [adv])
    if datums_per_traj is not None:  # the renderer has the extension property
        assert len(data) == datums_per_traj * 4
    else:  # qwen3_5: no extension property in cookbook 0.5.8, one datum per turn
        assert len(data) == sum(len(t.transitions) for t in group.trajectories_G)
    # per-episode metrics for metrics.jsonl
    m = {plan_of(t): v for t, v in zip(group.trajectories_G, group.metrics_G, strict=True)}
    ref_m, tmpl_m, inv_m = m["reference"], m["template"], m["invalid"]
    assert ref_m["ait/status/scored"] == 1 and ref_m["ait/validated"] == 1 and "ait/post" in ref_m
    assert ref_m["ait/model/Qwen3-1.7B"] == 1 and ref_m["ait/model/Qwen3-0.6B"] == 0
    assert ref_m["ait/surface/adopted"] == 1 and ref_m["ait/surface/beyond_template"] == 1
    assert tmpl_m["ait/surface/adopted"] == 0 and tmpl_m["ait/model/Qwen3-0.6B"] == 1
    assert inv_m["ait/status/invalid"] == 1 and inv_m["ait/validated"] == 0 and "ait/post" not in inv_m


def test_infra_failed_episodes_are_dropped_not_scored(local_tokenizer, tmp_path):
    cfg = _cfg(tmp_path / "runs", backend_factory="flaky_backend:FlakyStubBackend")
    group = _rollout(JobWritingGroupBuilder(cfg, "units", 3, 4, "train", ["train"]),
                     plans=("reference", "infra", "template", "reference"), min_group=2, max_retries=0)
    assert len(group.trajectories_G) == 3
    assert [e.error_type for e in group.rollout_errors] == ["InfraFailedEpisode"]
    assert all(m["ait/infra_dropped_frac"] == pytest.approx(0.25) for m in group.metrics_G)
    assert all(m["ait/status/scored"] == 1 for m in group.metrics_G)
    # a group left below min_group is dropped whole
    with pytest.raises(AllTrajectoriesFailedError):
        _rollout(JobWritingGroupBuilder(cfg, "units", 3, 2, "train", ["train"]), plans=("infra",),
                 min_group=2, max_retries=1)


def test_research_episodes_through_the_cookbook(local_tokenizer, tmp_path):
    """env.max_jobs_per_episode=2 in the env overrides: the renderer declares the finish tool, both jobs'
    results come back as tool messages, the reward is the best job's less the charge, and the metrics say
    so; an infrastructure failure in the second job ends its episode scored on the first (no voiding)."""
    cfg = _cfg(tmp_path / "runs", backend_factory="flaky_backend:FlakyStubBackend")
    cfg.env_overrides["env"]["max_jobs_per_episode"] = 2
    builder = JobWritingGroupBuilder(cfg, "arithmetic", 7, 3, "train", ["train"])
    envs = _keep_envs(builder)
    group = _rollout(builder, plans=("research", "reference", "research_infra"), min_group=2, max_retries=0)
    assert group.rollout_errors == []
    done = {e.message_env.info["reward"]["jobs"][0]["job_id"]: e.message_env for e in envs
            if not e.message_env.dropped}
    assert len(done) == 3

    def plan(me) -> str:
        return re.search(r"\[plan (\w+)\]", json.dumps(me.info["messages"][2])).group(1)

    by_plan = {plan(me): me for me in done.values()}
    research, reference, lost = by_plan["research"], by_plan["reference"], by_plan["research_infra"]
    gone = lost.info["reward"]  # the lost job stays in jobs, dropped alone: never best, never charged
    assert gone["status"] == "scored" and gone["end"] == "infra_failed" and gone["best_job"] == 0
    assert [j["status"] for j in gone["jobs"]] == ["scored", "infra_failed"] and gone["jobs"][1]["drop"]
    assert gone["charge"] == 0 and gone["total"] == pytest.approx(gone["jobs"][0]["total"])
    first = research.history[0]
    assert first["role"] == "system" and '"finish"' in str(first["content"])  # the renderer's tool list
    r = research.info["reward"]
    assert r["status"] == "scored" and r["end"] == "job_limit" and r["best_job"] == 1
    assert [m["role"] for m in research.history].count("tool") >= 6
    assert any("Job 1 of 2" in str(m["content"]) and "Eval points during training" in str(m["content"])
               for m in research.history if m["role"] == "tool")
    # the reference plan submitted the same job twice: the first counts, charged for the second
    ref = reference.info["reward"]
    assert ref["best_job"] == 0 and ref["total"] == pytest.approx(ref["jobs"][0]["total"] - 0.02)
    m = {("research" if v.get("ait/later_job_best") else "lost" if v.get("ait/end/infra_failed") else "reference"): v
         for v in group.metrics_G}
    assert len(m) == 3, group.metrics_G
    assert m["research"]["ait/jobs"] == 2 and m["research"]["ait/later_job_best"] == 1
    assert m["research"]["ait/charge"] == pytest.approx(0.02) and m["research"]["ait/end/job_limit"] == 1
    assert m["research"]["ait/post_gain"] == pytest.approx(r["jobs"][1]["post"] - r["jobs"][0]["post"])
    assert m["research"]["ait/post"] == r["jobs"][1]["post"]  # the best job's
    assert m["reference"]["ait/later_job_best"] == 0 and m["reference"]["ait/post_gain"] == 0


def test_llm_calls_and_train_tokens_go_to_the_ledger(local_tokenizer, tmp_path):
    group = _rollout(JobWritingGroupBuilder(_cfg(tmp_path / "runs"), "persona", 5, 2, "train", ["train"]),
                     plans=("reference",))
    lines = [json.loads(x) for x in (tmp_path / "runs" / "costs.jsonl").read_text().splitlines()]
    llm = [r for r in lines if r["kind"] == "llm"]
    assert len(llm) == sum(len(t.transitions) for t in group.trajectories_G) == 8
    for r in llm:
        cached = r["meta"]["cached_in"]
        want = ((r["tokens_in"] - cached) * 1.0 + cached * 0.1 + r["tokens_out"] * 2.0) / 1e6
        assert r["usd"] == pytest.approx(want) and r["meta"]["prices_as_of"] == "test"
    assert all(r["meta"]["cached_in"] > 0 for r in llm if r["meta"]["turn"] > 1)  # prefix reuse
    train = [r for r in lines if r["kind"] == "llm_train"]
    assert len(train) == 2 and all(r["usd"] == pytest.approx(r["tokens_in"] * 3.0 / 1e6) for r in train)
    assert {r["episode_id"] for r in llm} == {r["episode_id"] for r in train}
    # the GPU job of each episode is in the same ledger under the same episode id
    gpu = [r for r in lines if r["kind"] == "gpu_job"]
    assert {r["episode_id"] for r in gpu} == {r["episode_id"] for r in train}
    per_ep = [m["ait/llm_usd"] for m in group.metrics_G]
    assert sum(per_ep) == pytest.approx(sum(r["usd"] for r in llm))


def test_heldout_family_only_in_evaluation(local_tokenizer):
    b = JobWritingDatasetBuilder(model_name=INSTRUCT, renderer_name="qwen3_instruct", group_size=4,
                                 groups_per_batch=5, n_batches=30, eval_heldout_groups=2, eval_train_groups=1,
                                 eval_group_size=3)
    train_ds, eval_ds = asyncio.run(b())
    train_fams = {g.family for i in range(len(train_ds)) for g in train_ds.get_batch(i)}
    assert train_fams == {"arithmetic", "persona", "units", "calendar", "inventory", "warehouse"}
    assert "triage" not in train_fams
    assert all(g.group_size == 4 and g.tags[0] == "train" for g in train_ds.get_batch(3))
    assert len({g.instance for g in train_ds.get_batch(0)}) == 5  # fresh instances
    assert eval_ds is not None and len(eval_ds) == 1
    ev = eval_ds.get_batch(0)
    held = [g for g in ev if g.tags[0] == "heldout"]
    assert {g.family for g in held} == {"triage"} and len(held) == 2
    assert {g.family for g in ev if g.tags[0] == "train"} == train_fams
    assert all(g.group_size == 3 and g.split == "eval" for g in ev)
    train_instances = {g.instance for i in range(len(train_ds)) for g in train_ds.get_batch(i)}
    assert not train_instances & {g.instance for g in ev}


def test_message_to_action_and_system_prompt():
    msg = renderers.Message(role="assistant", content=[{"type": "thinking", "thinking": "hmm"},
                                                       {"type": "text", "text": "Writing.\n"}],
                            tool_calls=[ToolCall(function=ToolCall.FunctionBody(
                                name="write_file", arguments=json.dumps({"path": "a.json", "content": {"x": 1}})))],
                            unparsed_tool_calls=[UnparsedToolCall(raw_text="<tool_call>{bad</tool_call>",
                                                                  error="Invalid JSON")])
    action = message_to_action(msg)
    assert "hmm" not in action and action.startswith("Writing.")
    assert '{"name": "write_file", "arguments": {"path": "a.json", "content": "{\\"x\\": 1}"}}' in action
    assert action.endswith("<tool_call>{bad</tool_call>")
    core = strip_tool_sections(system_prompt(30, 3))
    assert "<tools>" not in core and "# How to call tools" not in core
    assert core.startswith("You are an ML engineer") and "# Rules" in core and "30 messages" in core


def test_serialized_tokenizer_survives_concurrent_renders(local_tokenizer):
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(str(local_tokenizer))
    text = Path(__file__).read_text() * 2
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for _ in range(15):
                tok.encode(text, add_special_tokens=False, split_special_tokens=bool(i % 2))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    serialize_tokenizer(tok)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_closing_a_run_closes_only_that_runs_backend(tmp_path: Path) -> None:
    """Two runs in one process each keep their one backend; closing one run's leaves the other's open."""
    from ait_env.integrations.tinker import close_run_backends, run_backend

    mine = run_backend(dataclasses.replace(_cfg(tmp_path / "a"), run_id="mine"))
    theirs = run_backend(dataclasses.replace(_cfg(tmp_path / "b"), run_id="theirs"))
    assert run_backend(dataclasses.replace(_cfg(tmp_path / "a"), run_id="mine")) is mine
    close_run_backends("mine")
    assert mine.closed and not theirs.closed
    assert run_backend(dataclasses.replace(_cfg(tmp_path / "a"), run_id="mine")) is not mine  # a fresh one
    close_run_backends("theirs")
    close_run_backends("mine")
    assert theirs.closed
