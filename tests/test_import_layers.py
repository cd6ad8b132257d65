"""The layers hold at run time, not only for the linter (.importlinter): each entry point imported alone, in a
fresh interpreter, loads only the ``ait_env`` modules its layer may use. ``import ait_env`` registers the env
by entry-point string and imports nothing else of it; the job contracts, the two workers (``gpu``, ``cpu``) and
the fleet load no env, backend, probe or episode module."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: the parts of the package that hold the episode (what the kernel, the worker and the fleet never load)
EPISODE_SIDE = ("ait_env.env", "ait_env.probe", "ait_env.episode", "ait_env.backends")


def loaded(statement: str) -> list[str]:
    """The ``ait_env`` modules a fresh interpreter holds after ``statement``."""
    code = (f"{statement}\nimport json, sys\n"
            "print(json.dumps(sorted(m for m in sys.modules if m == 'ait_env' or m.startswith('ait_env.'))))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_the_root_registers_the_env_and_imports_nothing_else_of_it():
    code = "import gymnasium as gym, ait_env\nassert 'AIT/JobWriting-v0' in gym.registry"
    assert loaded(code) == ["ait_env", "ait_env.extras"]
    # the env class is still one attribute away, and gym.make finds it by its entry point
    assert "ait_env.env" in loaded("from ait_env import JobWritingEnv")


def test_the_job_contracts_import_alone():
    mods = loaded("import ait_env.jobs.settings")
    assert len(mods) <= 12, mods
    assert not [m for m in mods if m.startswith(EPISODE_SIDE)], mods


@pytest.mark.parametrize("module", ["gpu.worker", "cpu.executor", "cpu.tiny_models.build", "fleet.dispatch",
                                    "fleet.pool", "ait_env.runner", "ait_env.jobs.bundle", "ait_env.jobs.wire"])
def test_the_workers_and_the_fleet_load_no_episode_module(module):
    mods = loaded(f"import {module}")
    assert not [m for m in mods if m.startswith(EPISODE_SIDE)], mods
