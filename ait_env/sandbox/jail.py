"""How the sandbox's resident process is jailed on the host, and how a request's leftovers go: bubblewrap's
command line (:func:`bwrap_argv`: read-only system binds, no /etc, home or checkout, new namespaces, a cleared
environment), the pids cgroup that caps a sandbox's processes (:func:`cgroup_for`), and deleting whatever a
request left (:func:`remove_tree`). Used by :mod:`ait_env.sandbox.host` (and its :mod:`~ait_env.sandbox.link`);
docs/security.md states what they guarantee."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

from ait_env.processes import python_roots


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


def remove_tree(path: Path, timeout_s: float = 60.0) -> bool:
    """Delete ``path`` whatever agent code left in it: any depth (no recursion in this process, no
    path-length limit: coreutils' ``rm`` walks by file descriptor), folders without permissions, and
    bounded in time. Never raises; returns whether the path is gone."""
    path = Path(path)
    if not os.path.lexists(path):
        return True
    try:
        subprocess.run(["chmod", "-R", "u+rwx", "--", str(path)], timeout=timeout_s / 2, check=False,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        subprocess.run(["rm", "-rf", "--one-file-system", "--", str(path)], timeout=timeout_s / 2, check=False,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        pass
    if os.path.lexists(path) and _shallow(path):  # no `rm` here: Python's recursive rmtree, where it is safe
        shutil.rmtree(path, ignore_errors=True)
    gone = not os.path.lexists(path)
    if not gone:
        sys.stderr.write(f"ait sandbox: could not remove {path} within {timeout_s:g} s; remove it by hand\n")
    return gone


def _shallow(path: Path, depth: int = 200) -> bool:
    """Whether ``path`` is shallow enough for shutil.rmtree (a fallback where ``rm`` is missing)."""
    todo = [(str(path), 0)]
    while todo:
        cur, d = todo.pop()
        if d > depth:
            return False
        try:
            with os.scandir(cur) as it:
                todo += [(e.path, d + 1) for e in it if e.is_dir(follow_symlinks=False)]
        except OSError:
            continue
    return True


def bwrap_argv(work: Path, runtime: Path, roots: list[str] | None = None) -> list[str]:
    # No --die-with-parent: its PR_SET_PDEATHSIG fires when the *thread* that started bwrap exits (the
    # sandbox is warmed up from a short-lived thread). The zygote exits at EOF on stdin instead, which
    # happens when the orchestrator exits or dies, and the pid namespace takes every child with it.
    argv = [bwrap_path() or "bwrap", "--new-session",
            "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/scratch",
            "--setenv", "PYTHONDONTWRITEBYTECODE", "1"]
    for d in ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin"):
        if Path(d).exists():
            argv += ["--ro-bind", d, d]
    # the private /tmp first: an interpreter under /tmp (a checkout's .venv there) is bound on top of it
    # below; mounted last, the tmpfs hid it and bubblewrap could not start. Only the zygote may write
    # there: a request writes to its own scratch tmpfs (/scratch, mounted per request by confine.py).
    argv += ["--perms", "0755", "--tmpfs", "/tmp", "--perms", "0755", "--dir", "/scratch"]
    made: set[str] = {"/tmp"}
    for root in map(Path, python_roots() if roots is None else roots):
        # bwrap would create missing parents with mode 0700, unreadable after the uid drop.
        for parent in reversed(root.parents):
            if str(parent) != "/" and str(parent) not in made and not any(
                    str(parent) == d or str(parent).startswith(d + "/") for d in ("/usr", "/lib", "/lib64", "/bin")):
                argv += ["--perms", "0755", "--dir", str(parent)]
                made.add(str(parent))
        argv += ["--ro-bind", str(root), str(root)]
    argv += ["--ro-bind", str(runtime), "/opt/ait",
             "--bind", str(work), "/sandbox",
             "--proc", "/proc", "--dev", "/dev", "--chdir", "/sandbox"]
    return argv


def cgroup_for(pid: int, max_pids: int) -> tuple[Path | None, str]:
    """Put ``pid`` in a fresh pids cgroup capped at ``max_pids`` (best effort: v1 or v2 when writable)."""
    for base in (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup")):
        if not base.is_dir():
            continue
        cg = base / f"ait-sandbox-{pid}-{uuid.uuid4().hex[:6]}"
        try:
            cg.mkdir()
        except OSError:
            continue
        try:
            if not (cg / "pids.max").exists():
                raise OSError("no pids controller here")
            (cg / "pids.max").write_text(str(max_pids))
            (cg / "cgroup.procs").write_text(str(pid))
            return cg, f"pids cgroup (max {max_pids})"
        except OSError:
            try:
                cg.rmdir()
            except OSError:
                pass
    return None, "no pids cgroup (not writable here)"
