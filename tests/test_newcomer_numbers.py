"""Numbers that do not drift with the machine (issue 38, items 5-7): the baseline an agent is shown is the
one the reward uses; the local backend's speed term does not depend on wall time; gym.make writes under the
per-user data folder, not the current one."""

from __future__ import annotations

import os
import re
from pathlib import Path

import gymnasium as gym
import pytest

import ait_env  # noqa: F401  (registers the env)
from ait_env.backends.stub import StubBackend
from ait_env.conf import data_dir, default_runs_dir
from ait_env.config import compose
from ait_env.episode.reward import RewardSettings, episode_reward, training_share
from ait_env.hidden.baselines import BaselineEntry
from ait_env.hidden.secrets import hidden_set_hash
from task_families import reference_files
from tests.helpers import call


class _OtherWeights(StubBackend):
    """A stub whose 'built' weights differ from those a measured baseline was taken on."""

    def built_weights_hash(self, model: str) -> str:  # noqa: ARG002
        return "this-machine"


def _play_reference(env: gym.Env, model: str) -> tuple[str, dict]:
    env.reset(seed=3)
    files = reference_files("arithmetic", model)
    env.step("".join(call("write_file", path=p, content=t) for p, t in files.items()))
    obs, _, _, _, info = env.step(call("get_baseline_scores"))
    shown = obs
    obs, _, term, _, info = env.step(call("submit_job"))
    assert term, obs
    return shown, info


def test_the_baseline_shown_is_the_baseline_the_reward_uses(tmp_path: Path) -> None:
    env = gym.make("AIT/JobWriting-v0", family="arithmetic", backend="stub",
                   overrides=[f"env.runs_dir={tmp_path / 'runs'}"])
    try:
        shown, info = _play_reference(env, "Qwen/Qwen3-1.7B")
        best = float(re.search(r"best of these \((\d\.\d{3})\)", shown).group(1))
        assert best == pytest.approx(info["reward"]["best_pre"], abs=5e-4)
    finally:
        env.close()


def test_a_stale_baseline_is_not_shown_as_the_one_the_reward_uses(tmp_path: Path) -> None:
    """A measured entry taken on other weights does not hold for this machine's build: it is not shown with
    its figure (the reward would not use it); the agent is told the job measures it."""
    backend = _OtherWeights(compose(backend="stub").backend, tmp_path / "runs")
    backend.baselines.put([BaselineEntry(backend="stub", family="arithmetic", model="Qwen/Qwen3-0.6B",
                                         score=0.777, ci95=0.01, n=300, model_hash="another-machine",
                                         hidden_set_hash=hidden_set_hash("arithmetic"))])
    env = gym.make("AIT/JobWriting-v0", family="arithmetic", backend=backend,
                   overrides=[f"env.runs_dir={tmp_path / 'runs'}"])
    try:
        env.reset(seed=1)
        obs, *_ = env.step(call("get_baseline_scores"))
        assert "0.777" not in obs
        assert "Qwen/Qwen3-0.6B: not measured for this machine's build yet" in obs
        assert "your job measures it" in obs
    finally:
        env.close()
        backend.close()


def test_the_local_speed_term_is_the_share_of_the_bounds_rollouts_not_wall_time() -> None:
    s = RewardSettings()
    share = training_share(20, 64, 200, 512)
    assert share == pytest.approx(20 * 64 / (200 * 512))
    fast = episode_reward("scored", s, attempts=1, validated_attempt=1, post=0.6, best_pre=0.3,
                          train_seconds=10, wall_clock_limit_s=3600, train_fraction=share)
    loaded = episode_reward("scored", s, attempts=1, validated_attempt=1, post=0.6, best_pre=0.3,
                            train_seconds=3000, wall_clock_limit_s=3600, train_fraction=share)
    assert fast.S == loaded.S == pytest.approx(1 - share)
    # on a wall-time backend the load still counts, as the seed defines it for GPUs
    gpu = episode_reward("scored", s, attempts=1, validated_attempt=1, post=0.6, best_pre=0.3,
                         train_seconds=1800, wall_clock_limit_s=3600)
    assert gpu.S == pytest.approx(0.5)


def test_an_episode_on_a_rollouts_backend_scores_speed_by_rollouts(tmp_path: Path) -> None:
    class RolloutsStub(StubBackend):
        speed_measure = "rollouts"

    backend = RolloutsStub(compose(backend="stub").backend, tmp_path / "runs")
    env = gym.make("AIT/JobWriting-v0", family="arithmetic", backend=backend,
                   overrides=[f"env.runs_dir={tmp_path / 'runs'}"])
    try:
        _, info = _play_reference(env, "Qwen/Qwen3-1.7B")
        r = info["reward"]
        assert r["status"] == "scored" and r["post"] > r["best_pre"]
        b = env.unwrapped.task.bounds
        text = reference_files("arithmetic", "Qwen/Qwen3-1.7B")["job.toml"]
        steps = int(re.search(r"max_steps\s*=\s*(\d+)", text).group(1))
        batch = int(re.search(r"batch_size\s*=\s*(\d+)", text).group(1))
        assert r["S"] == pytest.approx(1 - training_share(steps, batch, b.max_steps, b.max_batch_size))
    finally:
        env.close()
        backend.close()


def test_gym_make_writes_under_the_per_user_data_folder_not_the_current_one(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    cwd = tmp_path / "somewhere"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    assert default_runs_dir() == data_dir() / "runs" and str(data_dir()) == os.environ["AIT_DATA_DIR"]
    env = gym.make("AIT/JobWriting-v0", family="arithmetic", backend="stub")
    try:
        _play_reference(env, "Qwen/Qwen3-1.7B")
    finally:
        env.close()
    assert not (cwd / "runs").exists() and list(cwd.iterdir()) == []
    assert any((default_runs_dir() / "jobs").iterdir())
    assert (default_runs_dir() / "costs.jsonl").exists() or any(default_runs_dir().iterdir())
