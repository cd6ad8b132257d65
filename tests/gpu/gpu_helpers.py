"""What the gpu tests share: the fakes' commands, the model ids, and the check that no process is left.

The fixtures are in ``gpu_fixtures.py``, registered by the test modules through ``pytest_plugins``: a
``conftest.py`` here would shadow ``tests/conftest.py``."""

from __future__ import annotations

import sys
from pathlib import Path

from ait_env.processes import tagged_pids

ROOT = Path(__file__).resolve().parents[2]
FAKES = Path(__file__).with_name("fakes")
FAKE_RL = [sys.executable, str(FAKES / "fake_rl.py")]   # the fake run as a script (the installed one:
                                                       # gpu_fixtures.fake_primerl)
FAKE_VLLM = [sys.executable, str(FAKES / "fake_vllm.py")]
MODEL = "Qwen/Qwen3-0.6B"       # the job's base model: prime-rl v0.7.0 has a renderer for it
OTHER = "Qwen/Qwen3-1.7B"


def leftovers(run_id: str) -> set[int]:
    """Live processes started for this test (every fake process inherits ``FAKE_RUN_ID``)."""
    return tagged_pids(run_id, var="FAKE_RUN_ID")
