"""Shared fixtures: envs that write under a temporary runs dir."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import gymnasium as gym
import pytest

import ait_env  # noqa: F401  (registers the env)


def call(name: str, **arguments: Any) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


@pytest.fixture
def runs_dir(tmp_path: Path) -> Path:
    return tmp_path / "runs"


@pytest.fixture
def make_env(runs_dir: Path) -> Callable[..., gym.Env]:
    made: list[gym.Env] = []

    def _make(**kwargs: Any) -> gym.Env:
        overrides = kwargs.pop("overrides", {}) or {}
        overrides.setdefault("env", {})["runs_dir"] = str(runs_dir)
        kwargs.setdefault("backend", "stub")
        env = gym.make("AIT/JobWriting-v0", overrides=overrides, **kwargs)
        made.append(env)
        return env

    yield _make
    for env in made:
        env.close()
