"""The process toolkit: one place for what every part that starts untrusted or long-lived processes needs
(the sandbox host, the local and gpu-local backends, the worker's training jail and prime-rl executor).

- **The process table** (psutil): :func:`process_table`, :func:`live_descendants`,
  :func:`processes_of_uid`; zombies count as gone. :func:`tree_cpu_seconds`: the CPU time of a process tree.
- **Killing**: :func:`kill_all` (pids, a uid, everything below a pid: rescanned until none is left),
  :func:`kill_tree` (a ``Popen``, its group and every process below it; never raises),
  :func:`kill_as_uid`, :func:`become_subreaper`.
- **Stopping cleanly on SIGTERM** (:func:`sigterm_as_exit`): an entry point that starts children (jobs,
  pretraining workers, sandboxes) turns SIGTERM into ``SystemExit`` so its ``finally`` blocks stop them; a
  plain SIGTERM would end the Python process at once and leave them running, orphaned.
- **Tagged process trees** (:class:`ProcessTree`): a command in a new session whose descendants are found
  by an environment tag, also those that left the group or were orphaned.
- :func:`python_roots`: the directories an interpreter and its virtualenv need, bound read-only by a jail.

The sandbox's zygote (:mod:`ait_env.sandbox.zygote`) keeps a small copy of the ``/proc`` walk of its own:
it runs inside the jail as a file of its own and imports nothing from the project.

Process trees that always end: a command, every process it starts, and every process those start.

Contract
--------
:meth:`ProcessTree.start` runs one command in a **new session** (its own process group, apart from the
caller's) with the environment variable ``AIT_PROCESS_TAG=<random hex>`` added. Every descendant inherits
that variable unless it rewrites its own environment (prime-rl's launcher passes ``{**os.environ, ...}`` to
its children: ``src/prime_rl/entrypoints/rl.py`` at v0.7.0), so :meth:`ProcessTree.kill` finds them by
reading each process's environment (psutil: ``/proc/<pid>/environ``), including the ones a group kill misses:

- processes that left the group: torch elastic (prime-rl's ``torchrun`` trainer) starts every rank with
  ``start_new_session=True`` (``torch/distributed/elastic/multiprocessing/subprocess_handler/
  subprocess_handler.py``, checked in torch 2.13's copy);
- orphans whose parent died first (re-parented to init, no longer anybody's descendant of ours).

:meth:`kill`: SIGTERM to the group and to every tagged process (prime-rl's launcher stops its own children
on SIGTERM: ``sigterm_handler`` in ``rl.py``), up to ``grace_s`` seconds for all of them to exit, then
SIGKILL to whatever is left, and the direct child is reaped. Idempotent and safe to call from any thread.
Zombies (exited, not yet reaped by their parent) count as gone. Linux only (``/proc``).
"""

from __future__ import annotations

import ctypes
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import psutil


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    uid: int          # real uid
    state: str        # "Z" for a zombie (dead, not yet reaped)


def _state(status: str) -> str:
    return "Z" if status in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD) else "R"


def process_table() -> dict[int, Proc]:
    """Every process the kernel lists (psutil; processes that vanish while it is read are left out)."""
    table: dict[int, Proc] = {}
    for p in psutil.process_iter(["ppid", "uids", "status"]):
        info = p.info
        if info["ppid"] is None or info["uids"] is None or info["status"] is None:
            continue  # gone or unreadable meanwhile (psutil leaves the value None)
        table[p.pid] = Proc(p.pid, int(info["ppid"]), int(info["uids"].real), _state(info["status"]))
    return table


def live_descendants(pid: int, table: dict[int, Proc] | None = None) -> set[int]:
    """The live (not zombie) processes below ``pid``."""
    table = process_table() if table is None else table
    kids: dict[int, list[int]] = {}
    for p in table.values():
        kids.setdefault(p.ppid, []).append(p.pid)
    out: set[int] = set()
    todo = [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            if k not in out:
                out.add(k)
                todo.append(k)
    return {p for p in out if table[p].state != "Z"}


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) the process ``pid`` and every process below it have used, by the kernel's
    accounting: each one's own time and its reaped children's, zombies included, so a child that exited is
    not lost. Read from outside a sandbox, nothing inside can lower it. 0.0 when ``pid`` is gone."""
    stats: dict[int, tuple[int, float]] = {}
    for p in psutil.process_iter(["ppid", "cpu_times"]):
        ppid, t = p.info["ppid"], p.info["cpu_times"]
        if ppid is None or t is None:
            continue
        stats[p.pid] = (int(ppid), t.user + t.system + t.children_user + t.children_system)
    kids: dict[int, list[int]] = {}
    for p, (ppid, _) in stats.items():
        kids.setdefault(ppid, []).append(p)
    total, todo, seen = 0.0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen or p not in stats:
            continue
        seen.add(p)
        total += stats[p][1]
        todo.extend(kids.get(p, []))
    return total


def processes_of_uid(uid: int, table: dict[int, Proc] | None = None) -> set[int]:
    """The live processes whose real uid is ``uid``."""
    table = process_table() if table is None else table
    return {p.pid for p in table.values() if p.uid == uid and p.state != "Z" and p.pid != os.getpid()}


def become_subreaper() -> bool:
    """Make this process a child subreaper: orphaned processes below it are re-parented to it, not to init
    (so a daemonised grandchild stays a descendant). False where the kernel refuses."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def _reap(pids: Iterable[int]) -> None:
    """Collect the exit status of those of ``pids`` that are this process's children (never ``waitpid(-1)``:
    that would steal the status of a child another part of the program waits for)."""
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except (ChildProcessError, OSError):
            pass


def kill_as_uid(uid: int) -> None:
    """``kill(-1, SIGKILL)`` from a helper running as ``uid``: every process of that uid at once (the
    kernel's own iteration, which a forking process cannot outrun). Needs root (CAP_SETUID)."""
    # a system binary: the uid must be able to execute it (an interpreter under /root would not do)
    kill = shutil.which("kill", path="/usr/bin:/bin")
    argv = ([kill, "-KILL", "--", "-1"] if kill
            else ["/usr/bin/python3", "-I", "-c", "import os; os.kill(-1, 9)"])
    subprocess.run(argv, user=uid, group=uid, extra_groups=[], check=False, timeout=30,
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def kill_all(pids: Iterable[int] = (), *, uid: int | None = None, below: int | None = None,
             keep: Iterable[int] = (), timeout_s: float = 10.0) -> tuple[set[int], set[int]]:
    """SIGKILL ``pids``, every process of ``uid`` (when given) and every live process below ``below``
    except ``keep``, rescanning until none is alive or ``timeout_s`` passed (what forks meanwhile is
    caught by the next scan). Returns ``(killed, survivors)``."""
    targets, keep = set(pids), set(keep)
    killed: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while True:
        table = process_table()
        alive = {p for p in targets if p in table and table[p].state != "Z"}
        if uid is not None:
            alive |= processes_of_uid(uid, table)
        if below is not None:
            alive |= live_descendants(below, table) - keep
        alive.discard(os.getpid())
        if not alive or time.monotonic() > deadline:
            return killed, alive
        if uid is not None and os.getuid() == 0:
            kill_as_uid(uid)
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except OSError:
                pass
        _reap(alive)
        time.sleep(0.05)


def kill_tree(proc: "subprocess.Popen[Any]", *, timeout_s: float = 10.0) -> None:
    """Kill ``proc``, its process group and every live process below it, wait for it, and close its pipes.
    Never raises."""
    if proc.poll() is None:
        tree = live_descendants(proc.pid)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            proc.kill()
        kill_all(tree, timeout_s=timeout_s)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
    for stream in (proc.stdin, proc.stdout):
        try:
            if stream is not None:
                stream.close()
        except OSError:
            pass


def python_roots(python: str | None = None) -> list[str]:
    """Directories ``python`` (default: this interpreter) and its virtualenv need: its prefix as written and
    as resolved, and for this interpreter ``sys.prefix`` and ``sys.base_prefix`` too (a jail binds them
    read-only at the same paths)."""
    exe = Path(python or sys.executable)
    roots = {str(exe.parent.parent), str(exe.resolve().parent.parent)}
    if python is None:
        roots |= {str(Path(sys.base_prefix).resolve()), str(Path(sys.prefix).resolve())}
    return sorted(roots)


# ---------------------------------------------------------------------------------------- tagged process trees
TAG_VAR = "AIT_PROCESS_TAG"


def tagged_pids(tag: str, var: str = TAG_VAR) -> set[int]:
    """Live (not zombie) processes whose environment carries ``<var>=<tag>`` (default ``AIT_PROCESS_TAG``)."""
    me = os.getpid()
    out: set[int] = set()
    for p in psutil.process_iter():
        if p.pid == me:
            continue
        try:
            if p.environ().get(var) != tag or is_gone(p.pid):
                continue
        except (psutil.Error, OSError):  # gone meanwhile, or not ours to read
            continue
        out.add(p.pid)
    return out


def is_gone(pid: int) -> bool:
    """Whether ``pid`` no longer runs: no such process, or a zombie (exited, not yet reaped)."""
    try:
        return _state(psutil.Process(pid).status()) == "Z"
    except psutil.Error:
        return True


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class ProcessTree:
    """One command and all its descendants; see the module docstring."""

    def __init__(self, grace_s: float = 20.0) -> None:
        self.tag = secrets.token_hex(8)
        self.grace_s = grace_s
        self.proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def start(self, argv: Sequence[str], *, env: dict[str, str], cwd: str | Path | None = None,
              stdout: IO[bytes] | int | None = None) -> ProcessTree:
        """Start ``argv`` in a new session with ``env`` plus the tag (stderr goes where stdout goes).
        Raises ``FileNotFoundError`` when the command does not exist."""
        assert self.proc is None, "a ProcessTree starts one command"
        self.proc = subprocess.Popen(list(argv), env={**env, TAG_VAR: self.tag}, cwd=cwd,
                                     stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None, "start first"
        return self.proc.pid

    def poll(self) -> int | None:
        """The direct child's exit code (negative: killed by that signal), or None while it runs."""
        return None if self.proc is None else self.proc.poll()

    def alive(self) -> set[int]:
        """Every live process of the tree (the direct child, its group, tagged descendants)."""
        if self.proc is None:
            return set()
        pids = tagged_pids(self.tag)
        if self.proc.poll() is None:
            pids.add(self.proc.pid)
        return pids

    def kill(self) -> None:
        """End the whole tree (see the module docstring); returns when nothing of it is left."""
        if self.proc is None:
            return
        with self._lock:
            self._send(signal.SIGTERM)
            deadline = time.monotonic() + self.grace_s
            while self.alive() and time.monotonic() < deadline:
                time.sleep(0.05)
            for _ in range(100):  # SIGKILL cannot be ignored; a new child may appear between scans
                if not self.alive():
                    break
                self._send(signal.SIGKILL)
                time.sleep(0.05)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            left = self.alive()
            if left:
                raise RuntimeError(f"processes {sorted(left)} of {self.proc.args!r} survived SIGKILL")

    def _send(self, sig: int) -> None:
        assert self.proc is not None
        if self.proc.returncode is None:  # not reaped yet: its pid (= the group id) cannot have been reused
            try:
                os.killpg(self.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        for pid in self.alive():
            _signal(pid, sig)


@contextmanager
def sigterm_as_exit() -> Iterator[None]:
    """Within the block, SIGTERM raises ``SystemExit(143)`` in the main thread instead of ending the process
    outright, so the block's ``finally`` and ``with`` exits run (a backend's ``close`` stops its running
    jobs, a ``Pool`` terminates its workers). Only in the main thread (elsewhere it does nothing); the
    previous handler is restored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _exit(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, _exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
