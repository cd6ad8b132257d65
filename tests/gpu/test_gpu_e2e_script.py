"""scripts/gpu_e2e.sh, the prepared first GPU run (issue 48, item 6), stays runnable: on a machine without a
GPU or prime-rl it builds the short bundle, runs the worker, which refuses at its self-check
(``infra_failed``, saying what is missing), and writes its summary."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_prepared_gpu_run_goes_end_to_end_to_the_workers_verdict(tmp_path: Path) -> None:
    if shutil.which("nvidia-smi"):
        pytest.skip("a GPU machine: run the script itself (it would train there)")
    out = tmp_path / "e2e"
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_e2e.sh"), "--steps", "2", "--timeout", "60"],
                          cwd=ROOT, env={**os.environ, "OUT": str(out), "PYTHON": sys.executable,
                                         "AIT_PRIME_RL_DIR": str(tmp_path / "no-prime-rl")},
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = (out / "summary.txt").read_text()
    assert "status: infra_failed" in summary and "refuses 'gpu' jobs" in summary, summary
    assert (out / "jobs" / "gpu-e2e" / "rl.toml").is_file() and (out / "selfcheck.json").is_file()
    assert "max_steps = 2" in (out / "jobs" / "gpu-e2e" / "job.toml").read_text()
    # the real-launcher liveness cases need the GPU image (prime-rl's orchestrator imports flash_attn): not run
    assert "not run (no GPU" in (out / "liveness.txt").read_text()
