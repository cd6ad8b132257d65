"""ProcessTree: nothing a command started outlives kill(), even processes that left its session, orphans
and processes that ignore SIGTERM."""

from __future__ import annotations

import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ait_env.processes import ProcessTree, tagged_pids
from tests.helpers import alive

SLEEP = "import time\nwhile True: time.sleep(1)"

TREE = textwrap.dedent(f"""
    import os, signal, subprocess, sys, time
    py, pids = sys.executable, sys.argv[1]
    deaf = "import signal\\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\\n" + {SLEEP!r}
    orphaner = ("import subprocess, sys\\n"
                "p = subprocess.Popen([sys.executable, '-c', " + repr({SLEEP!r}) + "])\\n"
                "open(sys.argv[1], 'a').write(str(p.pid) + chr(10))")
    kids = [
        subprocess.Popen([py, "-c", {SLEEP!r}]),                          # a plain child
        subprocess.Popen([py, "-c", deaf], start_new_session=True),       # left the session, ignores SIGTERM
        subprocess.Popen([py, "-c", orphaner, pids]),                     # orphans its own child
    ]
    with open(pids, "a") as f:
        f.write("".join(f"{{k.pid}}\\n" for k in kids[:2]))
    kids[2].wait()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)                         # the leader ignores SIGTERM too
    while True:
        time.sleep(1)
""")


def _read(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []



def test_kill_ends_every_process_of_the_tree(tmp_path: Path) -> None:
    pids_file = tmp_path / "pids"
    tree = ProcessTree(grace_s=0.5).start([sys.executable, "-c", TREE, str(pids_file)], env=dict(os.environ))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(_read(pids_file)) < 3:
        time.sleep(0.05)
    pids = {int(x) for x in pids_file.read_text().split()}  # the child, the one that left, the orphan
    assert len(pids) == 3 and all(alive(p) for p in pids)
    assert pids | {tree.pid} <= tree.alive()  # found by their tag, wherever they are now
    tree.kill()
    assert not [p for p in [tree.pid, *pids] if alive(p)]
    assert tagged_pids(tree.tag) == set() and tree.poll() is not None
    tree.kill()  # idempotent


def test_a_missing_command_raises_file_not_found() -> None:
    with pytest.raises(FileNotFoundError):
        ProcessTree().start(["/nonexistent/rl"], env={})


def test_the_tag_reaches_descendants_only(tmp_path: Path) -> None:
    tree = ProcessTree(grace_s=1).start([sys.executable, "-c", SLEEP],
                                        env={"PATH": os.environ.get("PATH", "")})
    try:
        assert tagged_pids(tree.tag) == {tree.pid}
        assert os.getpid() not in tagged_pids(tree.tag)
    finally:
        tree.kill()
