"""Fixtures for the trainer tests (imported by name, not a conftest.py: see tests/integrations/tinker_fixtures.py)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def tinker_grpo() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tinker_grpo_script", REPO / "trainers" / "tinker_grpo.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def plot_run() -> ModuleType:
    spec = importlib.util.spec_from_file_location("plot_run_script", REPO / "trainers" / "plot_run.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def compose_cfg() -> Callable[..., Any]:
    from hydra import compose, initialize_config_dir

    def _compose(*overrides: str) -> Any:
        with initialize_config_dir(config_dir=str(REPO / "ait_env" / "conf"), version_base="1.3"):
            return compose("tinker_grpo", overrides=list(overrides))

    return _compose


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """AIT_CACHE_DIR for dry runs (the local tokenizer is built there once)."""
    return tmp_path_factory.mktemp("ait-cache")
