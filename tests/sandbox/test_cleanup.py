"""A sandbox leaves nothing behind: its temporary folder goes when the interpreter exits."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_sandbox_folder_removed_at_exit(tmp_path):
    code = ("from ait_env.sandbox import Sandbox\n"
            "sb = Sandbox()\n"
            "(sb.folder / 'work' / 'left.txt').parent.mkdir(parents=True, exist_ok=True)\n"
            "(sb.folder / 'work' / 'left.txt').write_text('x')\n"
            "print(sb.folder)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    root = Path(out.stdout.strip().splitlines()[-1])
    assert root.parent == tmp_path
    assert not root.exists(), f"the sandbox left {root} behind"


def _descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (read from /proc)."""
    kids: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        kids.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out: set[int] = set()
    todo = [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.add(k)
            todo.append(k)
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_closed_sandbox_leaves_no_process_in_a_live_interpreter() -> None:
    """A process that runs many jobs (benchmarks run the runner in-process) closes one sandbox per job:
    every process of it must go then, not when the interpreter exits. bubblewrap's process inside the
    pid namespace starts a session of its own, so killing the outer process's group alone left it and
    the resident zygote running (about 280 MB each)."""
    import time

    from ait_env.sandbox import Sandbox

    sb = Sandbox()
    sb.new_workdir()  # starts the resident process
    assert sb.pid is not None
    time.sleep(2)
    tree = {sb.pid} | _descendants(sb.pid)
    assert len(tree) >= 2, tree
    sb.destroy()
    deadline = time.time() + 10
    while time.time() < deadline and any(_alive(p) for p in tree):
        time.sleep(0.2)
    assert not [p for p in tree if _alive(p)], "processes of a closed sandbox are still running"
