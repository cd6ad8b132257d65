"""The JobWriting env through verifiers 0.2.0's own rollout code (``load_environment`` by env id,
``evaluate``, prime-rl's legacy bridge), against the scripted OpenAI-compatible server on the stub
backend: full episodes, the env's rewards, tool messages, infra_failed drops, the env-id package, the
prime-rl ``rl.toml``, the example."""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

vf = pytest.importorskip("verifiers", reason="install the inner stack: pip install -e '.[inner]'")

from flaky_backend import FlakyStubBackend  # noqa: E402

from ait_env.backends import make_backend  # noqa: E402
from ait_env.config import compose  # noqa: E402
from ait_env.integrations import verifiers_env as V  # noqa: E402
from ait_env.episode.messages import action_text  # noqa: E402
from tests.fakes.job_writer import job_writer_policy  # noqa: E402
from tests.fakes.openai_server import ScriptedOpenAIServer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "environments" / "ait_job_writing"
RL_TOML = ROOT / "trainers" / "prime_rl" / "rl.toml"
EXAMPLE = ROOT / "examples" / "verifiers_outer_loop.py"
KEY = "AIT_TEST_OPENAI_KEY"


@pytest.fixture(autouse=True)
def _api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY, "test")


def _overrides(runs: Path, probe: bool = False) -> dict[str, Any]:
    return {"env": {"runs_dir": str(runs), "probe": {"enabled": probe}}}


def _evaluate(env: Any, server: ScriptedOpenAIServer, n: int, r: int, **kw: Any) -> list[dict[str, Any]]:
    out = env.evaluate_sync(client=vf.ClientConfig(api_base_url=server.base_url, api_key_var=KEY),
                            model="scripted-model", num_examples=n, rollouts_per_example=r,
                            state_columns=["ait_reward", "ait_job"], **kw)
    return out["outputs"]


def _field(message: Any, key: str) -> Any:
    """A key of an output message: verifiers leaves messages without tool calls as pydantic objects."""
    return message.get(key) if isinstance(message, dict) else getattr(message, key, None)


def _direct_episode(runs: Path, family: str, instance: int, policy: Any, probe: bool) -> dict[str, Any]:
    """The same agent straight against the gym env: its messages as text actions, no verifiers."""
    env = gym.make("AIT/JobWriting-v0", backend="stub", overrides=_overrides(runs, probe))
    _, info = env.reset(seed=instance, options={"family": family, "instance": instance})
    messages = V.opening(info["messages"], "native")
    done = False
    while not done:
        reply = policy(messages, [])
        calls = [(c["function"]["name"], json.dumps(c["function"]["arguments"]))
                 for c in reply.get("tool_calls", [])]
        n_before = len(info["messages"])
        _, _, terminated, truncated, info = env.step(action_text(reply.get("content"), calls))
        messages += info["messages"][n_before:]
        done = terminated or truncated
    env.close()
    return info["reward"]


def test_env_id_resolves_and_rows_are_the_env_openings(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(PACKAGE))  # what `pip install -e environments/ait_job_writing` does
    env = vf.load_environment("ait-job-writing", families="arithmetic,units", num_examples=3,
                              num_eval_examples=1, overrides=_overrides(tmp_path))
    assert isinstance(env, V.JobWritingVerifiersEnv) and env.env_id == "ait-job-writing"
    rows = env.get_dataset().to_list()
    assert [(r["info"]["family"], r["info"]["instance"]) for r in rows] == [
        ("arithmetic", 0), ("units", 0), ("arithmetic", 1)]
    assert env.get_eval_dataset()[0]["info"] == {"family": "triage", "instance": 500_000}
    assert sorted(t.name for t in env.tool_defs) == sorted(
        ["read_file", "write_file", "edit_file", "list_files", "get_baseline_scores", "submit_job"])
    system, task = rows[1]["prompt"]
    assert "# How to call tools" not in system["content"] and "# Rules" in system["content"]
    direct = gym.make("AIT/JobWriting-v0", backend="stub", overrides=_overrides(tmp_path))
    _, info = direct.reset(seed=0, options={"family": "units", "instance": 0})
    assert [system, task] == V.opening(info["messages"], "native")
    direct.close()
    with pytest.raises(ValueError, match="unknown"):
        V.resolve_families("arithmetic,nope")


def test_evaluate_plays_full_episodes_and_returns_the_env_rewards(tmp_path: Path) -> None:
    """verifiers' own rollout code, the real probe (sandbox), GRPO groups of 2: every reward is the
    env's breakdown total, and the same agent played straight against the gym env scores the same."""
    env = V.load_environment(families="arithmetic,persona", num_examples=2, num_eval_examples=0,
                             overrides=_overrides(tmp_path / "vf", probe=True))
    with ScriptedOpenAIServer(job_writer_policy()) as server:
        outputs = _evaluate(env, server, n=2, r=2)
        assert all("tools" in req and len(req["tools"]) == 6 for req in server.requests)
    assert len(outputs) == 4
    for o in outputs:
        b = o["ait_reward"]
        assert o.get("error") is None and b["status"] == "scored"
        assert o["stop_condition"] == "has_final_env_response"
        assert o["reward"] == pytest.approx(b["total"]) and o["ait_scored"] == o["ait_attempts"] == 1.0
        assert o["ait_job"]["surrogate"] is True and o["num_turns"] == 4
        # every structured call was answered under its own id, by the env's tool result
        calls = [json.loads(c) for m in o["completion"] for c in _field(m, "tool_calls") or []]
        answered = [_field(m, "tool_call_id") for m in o["completion"] if _field(m, "role") == "tool"]
        assert answered == [c["id"] for c in calls] and len(calls) >= 4
    for family, instance in [("arithmetic", 0), ("persona", 0)]:
        rewards = [o["reward"] for o in outputs if o["info"]["family"] == family]
        direct = _direct_episode(tmp_path / "direct", family, instance, job_writer_policy(), probe=True)
        assert rewards == pytest.approx([direct["total"]] * 2)


def test_text_tool_format_sends_no_tools_and_reads_text_calls(tmp_path: Path) -> None:
    env = V.load_environment(families="units", num_examples=1, num_eval_examples=0, tool_format="text",
                             overrides=_overrides(tmp_path))
    assert env.tool_defs is None and "# How to call tools" in env.get_dataset()[0]["prompt"][0]["content"]
    with ScriptedOpenAIServer(job_writer_policy(structured=False)) as server:
        (o,) = _evaluate(env, server, n=1, r=1)
        assert not any(req.get("tools") for req in server.requests)
    assert o["ait_reward"]["status"] == "scored" and o["reward"] == pytest.approx(o["ait_reward"]["total"])
    replies = [m for m in o["completion"] if _field(m, "role") != "assistant"]
    assert {_field(m, "role") for m in replies} == {"user"}
    assert "<tool_response>" in _field(replies[0], "content")


def test_infra_failed_episodes_are_dropped_never_zero(tmp_path: Path) -> None:
    """A backend that loses the job's "pod": the rollout carries a vf.InfraError, its reward is NaN, the
    other episodes are untouched; prime-rl's bridge (verifiers/v1/legacy.py) turns it into an errored
    trace, which prime-rl v0.7.0's TrainSink drops before advantages. The given backend stays open."""
    settings = compose(backend="stub", overrides=_overrides(tmp_path))
    backend = FlakyStubBackend(settings.backend, tmp_path)
    env = V.load_environment(backend=backend, families="arithmetic,units", num_examples=2,
                             num_eval_examples=0,
                             overrides=_overrides(tmp_path))
    with ScriptedOpenAIServer(job_writer_policy(infra_families=("units",))) as server:
        outputs = _evaluate(env, server, n=2, r=2)
    dropped = [o for o in outputs if o["info"]["family"] == "units"]
    kept = [o for o in outputs if o["info"]["family"] == "arithmetic"]
    assert len(dropped) == len(kept) == 2
    for o in dropped:
        assert math.isnan(o["reward"]) and o["error"]["error"] == "JobInfraFailed"
        assert "pod lost" in o["error_chain"]
        assert o["ait_reward"]["status"] == "infra_failed" and o["ait_reward"]["total"] is None
        assert o["ait_infra_failed"] == 1.0 and o["stop_condition"] == "has_error"
    assert all(o["ait_reward"]["status"] == "scored" and o["reward"] > 0 for o in kept)
    assert V.scored_rewards(outputs) == [o["reward"] for o in kept]
    from verifiers.v1.legacy import rollout_output_to_trace

    traces = [rollout_output_to_trace(o, 0) for o in outputs]
    assert [t.has_error for t in traces] == [o["info"]["family"] == "units" for o in outputs]
    asyncio.run(env._teardown())
    assert not backend.closed
    backend.close()


def test_prime_rl_legacy_bridge_serves_the_env_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The code prime-rl v0.7.0's env server runs for a v0 id (``verifiers/v1/legacy.py`` of its
    verifiers pin, 0.2.0): load by id, one rollout per request, the v0 output mapped to a v1 trace.
    A scored episode's trace carries the env's reward; an infra_failed one is an errored trace, which
    prime-rl's TrainSink.process_group drops (``survivors = [r for r in group if not r.has_error]``)."""
    from verifiers.v1.clients.config import EvalClientConfig
    from verifiers.v1.legacy import LegacyEnvServer
    from verifiers.v1.serve.types import RunRolloutRequest
    from verifiers.v1.trace import Trace
    from verifiers.v1.types import SamplingConfig

    monkeypatch.syspath_prepend(str(PACKAGE))
    backend = FlakyStubBackend(compose(backend="stub", overrides=_overrides(tmp_path)).backend, tmp_path)
    args = {"backend": backend, "families": "arithmetic,units", "num_examples": 2, "num_eval_examples": 0,
            "overrides": _overrides(tmp_path)}
    server = LegacyEnvServer("ait-job-writing", args, address="tcp://127.0.0.1:0")
    try:
        assert len(server.tasks) == 2 and server.requires_group_scoring is False  # rollouts run one by one
        with ScriptedOpenAIServer(job_writer_policy(infra_families=("units",))) as openai:
            client = EvalClientConfig(base_url=openai.base_url, api_key_var=KEY)

            async def run(i: int) -> Any:
                request = RunRolloutRequest(task_idx=i, client=client, model="scripted",
                                            sampling=SamplingConfig(max_tokens=4096))
                return (await server._run_rollout(request)).trace

            async def both() -> list[Any]:  # one event loop, as in the server (its clients are cached)
                return [await run(0), await run(1)]

            traces = [Trace.model_validate(t) for t in asyncio.run(both())]
    finally:
        server.frontend.close(0)
        backend.close()
    scored, dropped = traces
    assert not scored.has_error and scored.num_turns == 4 and 0 < scored.reward <= 1
    # the bridge reads the error's "type" key; verifiers 0.2.0's ErrorData calls it "error", so the type
    # arrives as "Error" and the message names the failure
    assert dropped.has_error and "infra_failed" in dropped.error.message
    assert "pod lost" in dropped.error.message
    assert math.isnan(dropped.reward)  # never a zero, even in prime-rl's all-rollouts metrics


def test_teardown_closes_only_a_backend_it_built(tmp_path: Path) -> None:
    env = V.load_environment(families="arithmetic", num_examples=1, num_eval_examples=0,
                             overrides=_overrides(tmp_path))
    assert env.owns_backend and not env.backend.closed
    asyncio.run(env._teardown())
    assert env.backend.closed
    with make_backend(compose(backend="stub").backend, tmp_path) as shared:
        env = V.load_environment(backend=shared, families="arithmetic", num_examples=1, num_eval_examples=0,
                                 overrides=_overrides(tmp_path))
        assert env.backend is shared and not env.owns_backend
    with pytest.raises(ValueError, match="at least one episode"):
        V.load_environment(num_examples=0, num_eval_examples=0, overrides=_overrides(tmp_path))


def test_tool_replies_answer_every_call_under_its_id() -> None:
    """The env's messages of one turn (its copy of the turn, results, a note) mapped back: a call it could
    not parse gets an answer pointing at the note; a call written as text comes back in the user message."""
    calls = [vf.ToolCall(id="a", name="list_files", arguments="{}"),
             vf.ToolCall(id="b", name="read_file", arguments="[1]"),
             vf.ToolCall(id="c", name="read_file", arguments='{"path": "job.toml"}')]
    new = [{"role": "assistant", "content": "", "tool_calls": [
               {"id": "call_1_0", "function": {"name": "get_baseline_scores", "arguments": "{}"}},
               {"id": "call_1_1", "function": {"name": "list_files", "arguments": "{}"}},
               {"id": "call_1_2", "function": {"name": "read_file", "arguments": '{"path": "job.toml"}'}}]},
           {"role": "tool", "tool_call_id": "call_1_0", "content": "scores"},
           {"role": "tool", "tool_call_id": "call_1_1", "content": "files"},
           {"role": "tool", "tool_call_id": "call_1_2", "content": "toml"},
           {"role": "user", "content": "note: arguments must be an object"}]
    replies = V.tool_replies(calls, new)
    assert [(m.role, getattr(m, "tool_call_id", None)) for m in replies] == [
        ("tool", "a"), ("tool", "b"), ("tool", "c"), ("user", None)]
    assert [m.content for m in replies[:3]] == ["files", V.NOT_RUN, "toml"]
    assert replies[3].content == "<tool_response>\nscores\n</tool_response>\n" + new[-1]["content"]


def test_rubric_reward_for_unfinished_and_errored_rollouts() -> None:
    rubric = V.JobRubric(unfinished_reward=-0.25)
    assert asyncio.run(rubric.job_reward({"error": None})) == -0.25       # stopped by verifiers, not the env
    assert math.isnan(asyncio.run(rubric.job_reward({"error": vf.InfraError("x")})))
    assert math.isnan(asyncio.run(rubric.job_reward({"ait_reward": {"drop": True, "total": None}})))
    assert asyncio.run(rubric.job_reward({"ait_reward": {"drop": False, "total": 0.5}})) == 0.5


def test_env_id_package_installs(tmp_path: Path) -> None:
    """``environments/ait_job_writing`` builds and installs (offline: no build isolation) and, once
    installed, ``verifiers.load_environment("ait-job-writing")`` finds its ``load_environment``."""
    target, source = tmp_path / "site", tmp_path / "src"
    shutil.copytree(PACKAGE, source)  # setuptools builds in the source tree
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                           "--no-build-isolation", "--target", str(target), str(source)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    check = ("from verifiers.utils.env_utils import import_env_module; import inspect; "
             "m = import_env_module('ait-job-writing'); "
             "print(m.__file__, inspect.signature(m.load_environment))")
    proc = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": f"{target}{os.pathsep}{ROOT}"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith(str(target)) and "families" in proc.stdout


def test_rl_toml_drives_this_env() -> None:
    """The outer rl.toml names the env id and only arguments load_environment takes."""
    cfg = tomllib.loads(RL_TOML.read_text(encoding="utf-8"))
    params = inspect.signature(V.load_environment).parameters
    envs = cfg["orchestrator"]["train"]["env"] + cfg["orchestrator"]["eval"]["env"]
    for env in envs:
        assert env["id"] == V.ENV_ID and set(env["args"]) <= set(params), env
        assert env["pool"] == {"type": "static", "num_workers": 1}  # one backend per env server
        V.resolve_families(env["args"]["families"])
        compose(backend=env["args"]["backend"], overrides=env["args"]["overrides"])
    assert cfg["orchestrator"]["batch_size"] % cfg["orchestrator"]["group_size"] == 0


PRIMERL_PY = os.environ.get("AIT_PRIMERL_CONFIGS_PYTHON", "")


@pytest.mark.skipif(not PRIMERL_PY or not Path(PRIMERL_PY).is_file(), reason=(
    "set AIT_PRIMERL_CONFIGS_PYTHON to a python with prime-rl v0.7.0 prime-rl-configs installed"))
def test_rl_toml_validates_with_prime_rl() -> None:
    proc = subprocess.run([PRIMERL_PY, str(ROOT / "tests" / "jobs" / "primerl_validate.py"), "validate",
                           str(RL_TOML)], capture_output=True, text=True, timeout=600, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr[-4000:]
    (result,) = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert result["ok"], result["error"]
    res = result["resolved"]
    assert res["orchestrator.train.env.id"] == [V.ENV_ID] and res["trainer.ckpt.weights"] is True
    assert res["trainer.model.seq_len"] == res["orchestrator.seq_len"] and res["wandb"] is False


def test_example_runs_in_a_micro_configuration(tmp_path: Path) -> None:
    """examples/verifiers_outer_loop.py as a user runs it (env id installed), against the scripted server."""
    with ScriptedOpenAIServer(job_writer_policy()) as server:
        proc = subprocess.run([sys.executable, str(EXAMPLE), "--base-url", server.base_url,
                               "--model", "scripted", "--api-key-var", KEY, "--families", "calendar",
                               "--num-examples", "1", "--rollouts", "2", "--max-turns", "8",
                               "--runs-dir", str(tmp_path / "runs")],
                              capture_output=True, text=True, timeout=300, cwd=str(tmp_path),
                              env={**os.environ, "PYTHONPATH": f"{PACKAGE}{os.pathsep}{ROOT}"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("calendar #500000") == 2 and "scored" in proc.stdout
    assert "over 2 episodes; 0 dropped" in proc.stdout
