"""A sandbox leaves nothing behind: its temporary folder goes when the interpreter exits."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_sandbox_folder_removed_at_exit(tmp_path):
    code = ("from ait_env.probe.sandbox import Sandbox\n"
            "sb = Sandbox()\n"
            "(sb._root / 'work' / 'left.txt').parent.mkdir(parents=True, exist_ok=True)\n"
            "(sb._root / 'work' / 'left.txt').write_text('x')\n"
            "print(sb._root)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    root = Path(out.stdout.strip().splitlines()[-1])
    assert root.parent == tmp_path
    assert not root.exists(), f"the sandbox left {root} behind"
