"""The job bundle: hashes, the rendered rl.toml, and the env importable under the id rl.toml names."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest

from task_families import reference_files
from ait_env.jobs.bundle import BundleError, JobBundle, build_bundle
from ait_env.jobs.schema import parse_job
from task_families import get_family


def _bundle(tmp_path):
    fam = get_family("arithmetic")
    ws = tmp_path / "ws"
    ws.mkdir()
    for name, text in reference_files("arithmetic", "Qwen/Qwen3-0.6B").items():
        (ws / name).write_text(text)
    (ws / "family_tools.py").write_text("TOOLS = []  # the agent's copy must never be used\n")
    job, issues = parse_job((ws / "job.toml").read_text())
    assert job is not None, issues
    return build_bundle(ws, job, fam, tmp_path / "jobs", episode_id="ep1")


def test_bundle_layout_and_hashes(tmp_path):
    b = _bundle(tmp_path)
    b.verify()
    assert JobBundle.load(b.root).manifest == b.manifest
    rl = tomllib.loads((b.root / "rl.toml").read_text())
    assert rl["orchestrator"]["train"]["env"][0]["id"] == b.manifest.env_id
    assert (b.package_dir / "family_tools.py").read_text() == get_family("arithmetic").tools_source()
    (b.package_dir / "environment.py").write_text("tampered")
    with pytest.raises(BundleError, match="modified"):
        b.verify()


def test_env_importable_under_its_id(tmp_path):
    pytest.importorskip("verifiers")
    b = _bundle(tmp_path)
    code = (f"import sys; sys.path.insert(0, {str(b.root / 'src')!r}); import {b.manifest.env_id} as m; "
            "env = m.load_environment(num_examples=20); import verifiers as vf; "
            "assert isinstance(env, vf.ToolEnv); print(len(env.get_dataset()), sorted(env.tool_map))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "20 ['calculator']" in out.stdout
