"""Every example runs, in a micro configuration, as a user would run it (a fresh process, its own folder).
The LLM, verifiers and TRL examples are run by tests/agents/test_llm.py,
tests/integrations/test_verifiers_env.py and tests/integrations/test_trl_grpo.py (they need a scripted
endpoint or TRL's venv)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _run(tmp_path: Path, name: str, *args: str) -> str:
    out = subprocess.run([sys.executable, str(EXAMPLES / name), *args], cwd=tmp_path, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


@pytest.mark.parametrize("family", ["train", "warehouse"])
def test_random_agent(tmp_path, family):
    assert "episode 0: turns=" in _run(tmp_path, "random_agent.py", "--episodes", "1", "--family", family)


@pytest.mark.parametrize("family", ["inventory", "warehouse"])
def test_scripted_agent(tmp_path, family):
    out = _run(tmp_path, "scripted_agent.py", "--family", family)
    assert '"status": "scored"' in out


def test_tinker_grpo_dry_run(tmp_path):
    pytest.importorskip("tinker_cookbook")
    out = _run(tmp_path, "tinker_grpo.py", "--dry-run", "--steps", "1", "--groups", "1", "--group-size", "2",
               "--log-dir", str(tmp_path / "log"))
    assert "step 0: reward" in out
