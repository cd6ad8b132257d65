"""Expert demonstrations: every strategy plays through the env's public actions and its job validates."""

from __future__ import annotations

import json
import random
from typing import Any

import gymnasium as gym
import pytest

from ait_env.agents.experts import GENERIC_ENV, STRATEGIES, ExpertError, demonstrate, generic_files


@pytest.fixture
def env(runs_dir: Any) -> Any:
    e = gym.make("AIT/JobWriting-v0", backend="stub", overrides={"env": {"runs_dir": str(runs_dir)}})
    yield e
    e.close()


def test_the_workspace_gives_the_task_texts_data_and_the_generic_job_uses_it(env: Any) -> None:
    _, info = env.reset(seed=3, options={"family": "triage"})
    task, ws = info["messages"][1]["content"], env.unwrapped.workspace
    space: dict[str, Any] = {}
    exec((ws.root / "task_data.py").read_text(), space)   # our own module, read-only in the workspace
    examples = space["DEV_EXAMPLES"]
    assert len(examples) == 3 and all(json.dumps(e["question"]) in task and json.dumps(e["answer"]) in task
                                      for e in examples)
    assert space["SYSTEM_PROMPT"].startswith("Triage the incident") and f"> {space['SYSTEM_PROMPT']}" in task
    assert "task_data.py" in ws.read_only and "from task_data import" in task
    files = generic_files("triage", "Qwen/Qwen3-1.7B", "stub", task)
    assert files["environment.py"] == GENERIC_ENV and 'family = "triage"' in files["job.toml"]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_each_strategy_validates_and_trains_only_its_own_turns(env: Any, strategy: str) -> None:
    family = "units" if strategy != "reference" else "persona"
    demo = demonstrate(env, family, 5, strategy, random.Random(1))
    roles = [m["role"] for m in demo.messages]
    assert roles[:2] == ["system", "user"] and roles[-1] == "assistant"
    assert demo.messages[-1]["content"].strip().endswith("</tool_call>") and "submit_job" in demo.messages[-1]["content"]
    assert all(not t or r == "assistant" for t, r in zip(demo.trained, roles))
    assert 'read_file' in demo.messages[2]["content"] and "get_baseline_scores" in demo.messages[2]["content"]
    if strategy == "recover":   # the refused attempt is shown, not trained
        assert len(demo.messages) == 11 and demo.trained[4:8] == [False, False, False, False]
        assert "attempt" in demo.messages[7]["content"] and demo.trained[8] is True
        assert demo.messages[8]["content"].startswith("That submission was refused.")
    else:
        assert len(demo.messages) == 7 and demo.trained == [False, False, True, False, True, False, True]
    # the episode is still open: the last submit_job was checked by the probe but never dispatched
    assert env.unwrapped.backend.name == "stub" and not list((env.unwrapped.runs_dir / "jobs").glob("*"))


def test_the_generic_job_serves_a_stateful_family_by_its_rules(env: Any) -> None:
    """One generic environment for every family: on warehouse it builds a world per rollout from the row's
    ``info`` and its reward needs the tools to have acted; the probe's stateful checks refuse each shortcut."""
    from ait_env.agents.experts import _validate

    demo = demonstrate(env, "warehouse", 0, "generic", random.Random(0))
    assert "generic" == demo.strategy and "submit_job" in demo.messages[-1]["content"]
    ws = env.unwrapped.workspace
    shortcuts = {
        "state_ignored": GENERIC_ENV.replace("acted and ", ""),
        "world_per_rollout": GENERIC_ENV.replace('state.update(rollout_state(state.get("info")))', "state.update(W)")
                                        .replace("def reward", 'W = rollout_state(DEV_EXAMPLES[0]["info"])\n\n\ndef reward'),
    }
    for problem, text in shortcuts.items():
        ws.write("environment.py", text)
        ok, report = _validate(env)
        assert not ok and f"[{problem}]" in report, report
