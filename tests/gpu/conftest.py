"""Fixtures of the GPU worker tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.gpu.helpers import worker_env


@pytest.fixture
def wenv(tmp_path: Path):
    """:func:`tests.gpu.helpers.worker_env`, its short TMPDIR removed afterwards."""
    env = worker_env(tmp_path)
    yield env
    shutil.rmtree(env["TMPDIR"], ignore_errors=True)
