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


def load_script(name: str) -> ModuleType:
    """``trainers/<name>.py`` imported as a module (the trainers are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"{name}_script", REPO / "trainers" / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def compose_config(config: str, *overrides: str) -> Any:
    """The Hydra config ``ait_env/conf/<config>.yaml`` with ``overrides``, as a trainer's main receives it."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(REPO / "ait_env" / "conf"), version_base="1.3"):
        return compose(config, overrides=list(overrides))


@pytest.fixture(scope="session")
def tinker_grpo() -> ModuleType:
    return load_script("tinker_grpo")


@pytest.fixture(scope="session")
def plot_run() -> ModuleType:
    return load_script("plot_run")


@pytest.fixture
def compose_cfg() -> Callable[..., Any]:
    return lambda *overrides: compose_config("tinker_grpo", *overrides)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """AIT_CACHE_DIR for dry runs (the local tokenizer is built there once)."""
    return tmp_path_factory.mktemp("ait-cache")
