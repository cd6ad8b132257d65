"""A whole episode through gym.make with tool-call strings."""

from __future__ import annotations

import json

import pytest

from task_families import reference_files
from ait_env.episode.reward import RewardSettings, uplift_score
from tests.helpers import call


def test_full_episode_reject_then_accept(make_env, runs_dir):
    env = make_env(family="arithmetic")
    obs, info = env.reset(seed=7)
    assert "submit_job" in obs and "Chained arithmetic" in obs
    assert info["family"] == "arithmetic" and info["attempts_left"] == 3
    assert [m["role"] for m in info["messages"]] == ["system", "user"]
    assert {t["function"]["name"] for t in info["tools"]} == {
        "read_file", "write_file", "edit_file", "list_files", "get_baseline_scores", "submit_job"}

    files = reference_files("arithmetic", "Qwen/Qwen3-1.7B")
    bad_job = files["job.toml"].replace("batch_size = 128", "batch_size = 100").replace(
        'type = "adamw"', 'type = "adamw"\nlearning_rate = 1')
    bad_env = files["environment.py"].replace("import random\n", "import os\nimport random\n", 1)
    obs, r, term, trunc, info = env.step(call("write_file", path="job.toml", content=bad_job)
                                         + call("write_file", path="environment.py", content=bad_env))
    assert obs.count("<tool_response>") == 2 and r == 0.0 and not term

    obs, r, term, trunc, info = env.step(call("submit_job"))
    assert not term and r == 0.0 and info["attempts_left"] == 2
    assert "validation failed with 3 problem(s)" in obs
    assert "batch_size (100) must be divisible by group_size (8)" in obs
    assert "prime_rl.optim.learning_rate: unknown key" in obs
    assert "import of 'os' is not allowed" in obs and "environment.py:11" in obs
    assert "2 attempts left" in obs

    obs, r, term, trunc, info = env.step(call("write_file", path="job.toml", content=files["job.toml"])
                                         + call("edit_file", path="environment.py", old_text="import os\n",
                                                new_text=""))
    assert "edited environment.py at line 11" in obs
    obs, r, term, trunc, info = env.step("Submitting again.\n" + call("submit_job"))
    assert term and not trunc
    assert "SURROGATE" in obs
    b = info["reward"]
    assert b["status"] == "scored" and b["attempts"] == 2 and b["validated_attempt"] == 2
    s = RewardSettings()
    assert b["V"] == pytest.approx(s.validation_decay)
    assert b["U"] == pytest.approx(uplift_score(b["post"], b["best_pre"]))
    assert b["Q"] == pytest.approx(0.25 * b["post"] + 0.75 * b["U"])
    assert r == pytest.approx(b["total"]) == pytest.approx(0.35 * b["V"] + 0.60 * b["Q"] + 0.05 * b["S"])
    assert b["best_pre"] == max(info["job"]["baselines"].values())
    assert info["job"]["surrogate"] is True
    # The bundle was written with a manifest, and the result next to it.
    job_dir = runs_dir / "jobs" / info["job"]["job_id"]
    manifest = json.loads((job_dir / "manifest.json").read_text())
    assert "src/" + manifest["env_id"] + "/environment.py" in manifest["files"]
    assert (job_dir / "result.json").is_file()
    rl = (job_dir / "rl.toml").read_text()
    assert f'id = "{manifest["env_id"]}"' in rl and "max_steps = 60" in rl and "rl.toml" in manifest["files"]
    # the ledger got a line for the job
    lines = (runs_dir / "costs.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["episode_id"] == info["episode_id"]
    # messages are OpenAI-style with tool results linked to calls
    msgs = info["messages"]
    ids = {tc["id"] for m in msgs if m["role"] == "assistant" for tc in m.get("tool_calls", [])}
    assert all(m["tool_call_id"] in ids for m in msgs if m["role"] == "tool")
    # after the end, step keeps saying so without raising
    obs, r, term, _, _ = env.step(call("list_files"))
    assert term and r == 0.0 and "reset()" in obs


def test_attempts_exhausted_is_invalid(make_env):
    env = make_env(family="arithmetic", overrides={"env": {"max_attempts": 2}})
    env.reset(seed=0)
    _, _, term, _, info = env.step(call("submit_job"))
    assert not term and info["attempts_left"] == 1
    obs, r, term, _, info = env.step(call("submit_job"))
    assert term and r == 0.0 and info["reward"]["status"] == "invalid"  # the template job.toml parses
    assert "No attempts left" in obs


def test_unparsable_when_nothing_parses(make_env):
    env = make_env(family="arithmetic", overrides={"env": {"max_attempts": 1}})
    env.reset(seed=0)
    env.step(call("write_file", path="job.toml", content="this is [ not toml"))
    obs, r, term, _, info = env.step(call("submit_job"))
    assert term and info["reward"]["status"] == "unparsable" and r == pytest.approx(-0.1)


def test_turn_limit_truncates_never_on_first_step(make_env):
    env = make_env(family="arithmetic", overrides={"env": {"max_turns": 2}})
    env.reset(seed=0)
    _, r, term, trunc, _ = env.step("no tool call here")
    assert not term and not trunc
    obs, r, term, trunc, info = env.step("still nothing")
    assert trunc and not term and r == pytest.approx(-0.1)
    assert info["reward"]["status"] == "unparsable" and "turn limit" in obs


def test_malformed_action_shows_expected_format(make_env):
    env = make_env(family="arithmetic")
    env.reset(seed=0)
    obs, r, term, trunc, info = env.step('<tool_call>{"name": "write_file", "arguments": {"path": 1}}</tool_call>')
    assert "bad arguments for write_file" in obs and "content" in obs
    obs, *_ = env.step("just chatting")
    assert "no tool call found" in obs and "<tool_call>" in obs
    obs, *_ = env.step(call("rm_rf", path="/"))
    assert "unknown tool 'rm_rf'" in obs


def test_family_tools_read_only_and_calls_after_submit_skipped(make_env):
    env = make_env(family="arithmetic")
    env.reset(seed=0)
    obs, *_ = env.step(call("write_file", path="family_tools.py", content="x"))
    assert "read-only" in obs
    files = reference_files("arithmetic", "Qwen/Qwen3-0.6B")
    env.step("".join(call("write_file", path=k, content=v) for k, v in files.items()))
    obs, r, term, _, info = env.step(call("submit_job") + call("list_files"))
    assert term and "skipped" in obs and info["reward"]["status"] == "scored"


def test_reset_options_and_render(make_env):
    env = make_env(render_mode="ansi")
    _, info = env.reset(options={"family": "arithmetic", "instance": 5})
    assert info["instance_id"] == "arithmetic-5"
    env.step(call("list_files"))
    text = env.render()
    assert isinstance(text, str) and "=== assistant ===" in text and "list_files" in text


def test_unknown_family_and_backend_are_clear_errors(make_env):
    with pytest.raises(Exception, match="no backend config named 'nope'"):
        make_env(backend="nope")
    env = make_env()
    with pytest.raises(KeyError, match="unknown task family 'nope'"):
        env.reset(options={"family": "nope"})
