"""An entry point whose extra is missing says which extra to install, in one line, and exits with status 3
(ait_env/extras.py), whether the import fails at module level or inside the run; a program of your own that
imports ait_env keeps Python's own traceback. The missing module is simulated by a ``sitecustomize`` on
PYTHONPATH that puts ``None`` in ``sys.modules`` for the names in ``BLOCK_MODULES`` (Python's own way to
make an import fail)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ait_env import extras

ROOT = Path(__file__).resolve().parents[1]
BLOCKER = "import os, sys\nfor _m in filter(None, os.environ.get('BLOCK_MODULES', '').split(',')):\n" \
          "    sys.modules[_m] = None\n"


def _run(tmp_path: Path, block: str, *argv: str) -> subprocess.CompletedProcess[str]:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER)
    env = {k: v for k, v in os.environ.items() if k != "TINKER_API_KEY"}
    env.update(PYTHONPATH=f"{site}{os.pathsep}{ROOT}", BLOCK_MODULES=block, AIT_RUNS_DIR=str(tmp_path / "runs"))
    return subprocess.run([sys.executable, *argv], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)


def test_the_line_names_the_entry_the_extra_and_the_command() -> None:
    line = extras.missing_extra_line("trainers/tinker_grpo.py", "tinker_cookbook", "tinker")
    assert "\n" not in line and "'tinker' extra" in line and "bash scripts/setup.sh tinker" in line
    assert "VENV=.venv-trl" in extras.install_command("trl")
    assert extras.entry_of(str(ROOT / "cpu" / "tiny_models" / "build.py")) == "python -m cpu.tiny_models.build"
    assert extras.entry_of(str(ROOT / "scripts" / "run_episode.py")) == "python scripts/run_episode.py"
    assert extras.entry_of("/usr/lib/python3/some_tool.py") is None and extras.entry_of("-c") is None


def test_require_exits_3_with_one_line(capsys, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "tinker_cookbook", None)
    with pytest.raises(SystemExit) as exc:
        extras.require("x.py", "tinker", "tinker_cookbook")
    assert exc.value.code == extras.EXIT_MISSING_EXTRA
    assert capsys.readouterr().err.strip().count("\n") == 0
    extras.require("x.py", "test", "pytest")  # installed: nothing happens


def test_other_import_errors_propagate() -> None:
    with pytest.raises(ModuleNotFoundError):
        with extras.missing_extras_exit("x.py"):
            import not_a_module_of_any_extra  # noqa: F401
    with pytest.raises(ModuleNotFoundError):
        with extras.missing_extras_exit("x.py", active=False):
            raise ModuleNotFoundError("No module named 'torch'", name="torch")


@pytest.mark.parametrize("block, argv, extra", [
    ("torch", ["-m", "cpu.tiny_models.build"], "local"),  # fails at module level
    ("openai", ["-m", "ait_env.agents.llm", "--base-url", "http://127.0.0.1:9/v1", "--model", "m",
                "--families", "arithmetic", "--episodes", "1", "--out", "llm"], "inner"),  # fails inside the run
    ("torch", [str(ROOT / "scripts" / "run_episode.py"), "backend=local"], "local"),
    ("matplotlib", [str(ROOT / "trainers" / "local_outer.py"), "+pilot=local_smoke", "run_dir=outer"], "local"),
    ("tinker_cookbook,tinker", [str(ROOT / "trainers" / "tinker_grpo.py"), "+pilot=smoke", "dry_run=true",
                                "run_dir=tinker"], "tinker"),
], ids=["build", "llm", "run_episode", "local_outer", "tinker_dry_run"])
def test_an_entry_point_without_its_extra_says_which_in_one_line(tmp_path, block, argv, extra) -> None:
    p = _run(tmp_path, block, *argv)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == extras.EXIT_MISSING_EXTRA, p.stderr[-3000:]
    assert len(lines) == 1 and f"needs the '{extra}' extra" in lines[0] and "Traceback" not in p.stderr, p.stderr
    assert f"bash scripts/setup.sh {extra}" in lines[0]


def test_a_program_of_your_own_keeps_its_traceback(tmp_path) -> None:
    p = _run(tmp_path, "torch", "-c", "import ait_env\nimport torch")
    assert p.returncode == 1 and "Traceback" in p.stderr and "ModuleNotFoundError" in p.stderr
