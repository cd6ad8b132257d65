"""Process trees that always end: a command, every process it starts, and every process those start.

Contract
--------
:meth:`ProcessTree.start` runs one command in a **new session** (its own process group, apart from the
caller's) with the environment variable ``AIT_PROCESS_TAG=<random hex>`` added. Every descendant inherits
that variable unless it rewrites its own environment (prime-rl's launcher passes ``{**os.environ, ...}`` to
its children: ``src/prime_rl/entrypoints/rl.py`` at v0.7.0), so :meth:`ProcessTree.kill` finds them by
reading ``/proc/<pid>/environ``, including the ones a group kill misses:

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

import os
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

TAG_VAR = "AIT_PROCESS_TAG"


def tagged_pids(tag: str, var: str = TAG_VAR) -> set[int]:
    """Live (not zombie) processes whose environment carries ``<var>=<tag>`` (default ``AIT_PROCESS_TAG``)."""
    needle = f"{var}={tag}".encode()
    me = os.getpid()
    out: set[int] = set()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            if needle not in Path(f"/proc/{name}/environ").read_bytes().split(b"\0"):
                continue
            if _is_zombie(int(name)):
                continue
        except OSError:  # gone meanwhile, or not ours to read
            continue
        out.add(int(name))
    return out


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rfind(")") + 2:][:1] in ("Z", "X")


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
