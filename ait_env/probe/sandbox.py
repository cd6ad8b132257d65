"""Run untrusted agent code in isolation: a resident sandboxed process ("zygote") that forks one
limited child per request (see :mod:`ait_env.probe.inside` for the inside half).

Isolation modes, strongest available first (``SandboxSettings.mode = "auto"``):

``bwrap`` (bubblewrap, `apt-get install bubblewrap`)
    New mount, pid, network, IPC and UTS namespaces. The filesystem holds only read-only binds of
    /usr, /lib*, /bin, the Python installation and the virtualenv, a fresh /proc, /dev and /tmp,
    and one writable work folder; no /etc, no home directory, no project checkout (so neither
    ``ait_env``, the secrets file nor the hidden sets are reachable). The environment is cleared.
    The network namespace has only an unconfigured loopback: nothing outside is reachable.
    Before running agent code the child drops to uid/gid 65534 (when the sandbox starts as root),
    which makes the process-count limit effective and the bound files read-only to it.
``fallback`` (no bubblewrap, or it cannot start)
    A plain subprocess with a cleared environment and the same rlimits; when running as root it also
    enters a new network namespace (``unshare``); in any case the child installs a Python audit hook
    that refuses socket connections, process creation and opening files outside its work folder and
    the Python installation. This is weaker (same uid as the orchestrator; a native extension could
    bypass the audit hook) and is reported in every probe result.

In both modes a pids cgroup (v1 or v2, when writable) caps the number of processes, the child has
CPU-time, address-space, file-size and process-count rlimits, and the zygote kills every leftover
process after each request.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

INSIDE = Path(__file__).with_name("inside.py")
ADAPTER = Path(__file__).resolve().parents[1] / "integrations" / "verifiers_v0.py"
SANDBOX_UID = 65534


class SandboxError(RuntimeError):
    """The sandbox itself failed (not the agent's code): an infrastructure problem."""


class SandboxLimits(BaseModel):
    cpu_seconds: int = Field(20, ge=1)
    memory_mb: int = Field(2048, ge=64)       # address space above the zygote's own
    file_size_mb: int = Field(64, ge=1)
    max_processes: int = Field(32, ge=4)
    wall_seconds: float = Field(30.0, gt=0)


class SandboxSettings(BaseModel):
    mode: Literal["auto", "bwrap", "fallback"] = "auto"
    limits: SandboxLimits = Field(default_factory=SandboxLimits)
    preload: list[str] = Field(default_factory=lambda: [
        "verifiers", "verifiers.envs.tool_env", "verifiers.rubrics.rubric", "verifiers.rubrics.rubric_group",
        "verifiers.utils.message_utils", "datasets"])
    startup_timeout_s: float = 120.0


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


def _python_roots() -> list[Path]:
    """Directories the interpreter and the virtualenv need (bound read-only at the same paths)."""
    roots = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve()}
    exe = Path(sys.executable)
    roots.add(exe.resolve().parent.parent)
    return sorted(roots)


def _descendants(pid: int) -> list[int]:
    """The live processes below ``pid``, parents first (Linux ``/proc``; empty where it is missing)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(0), []):
            out.append(child)
            todo.append(child)
    return out


def _bwrap_argv(work: Path, runtime: Path) -> list[str]:
    # No --die-with-parent: its PR_SET_PDEATHSIG fires when the *thread* that started bwrap exits (the
    # sandbox is warmed up from a short-lived thread). The zygote exits at EOF on stdin instead, which
    # happens when the orchestrator exits or dies, and the pid namespace takes every child with it.
    argv = [bwrap_path() or "bwrap", "--new-session",
            "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp",
            "--setenv", "PYTHONDONTWRITEBYTECODE", "1"]
    for d in ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin"):
        if Path(d).exists():
            argv += ["--ro-bind", d, d]
    # the private /tmp first: an interpreter under /tmp (a checkout's .venv there) is bound on top of it
    # below; mounted last, the tmpfs hid it and bubblewrap could not start
    argv += ["--perms", "1777", "--tmpfs", "/tmp"]
    made: set[str] = {"/tmp"}
    for root in _python_roots():
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


def _cgroup_for(pid: int, max_pids: int) -> tuple[Path | None, str]:
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


class Sandbox:
    """A resident sandboxed process. Thread-safe (one request at a time); restarts after failures."""

    def __init__(self, settings: SandboxSettings | None = None) -> None:
        self.settings = settings or SandboxSettings()
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[str] | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._root = Path(tempfile.mkdtemp(prefix="ait-sandbox-"))
        self._work = self._root / "work"
        self._runtime = self._root / "runtime"
        self._cgroup: Path | None = None
        self._ids = itertools.count()
        self.description = ""
        self.mode = ""
        atexit.register(self.destroy)  # the process and its temporary folder go when the interpreter exits

    # ------------------------------------------------------------------ lifecycle
    def _prepare_runtime(self) -> None:
        self._work.mkdir(parents=True, exist_ok=True)
        self._runtime.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(INSIDE, self._runtime / "inside.py")
        shutil.copyfile(ADAPTER, self._runtime / "verifiers_v0.py")
        os.chmod(self._root, 0o755)
        os.chmod(self._work, 0o755)
        os.chmod(self._runtime, 0o755)

    def _start(self) -> None:
        self._prepare_runtime()
        mode = self.settings.mode
        if mode == "auto":
            mode = "bwrap" if bwrap_path() else "fallback"
        preload = ",".join(self.settings.preload)
        if mode == "bwrap":
            if not bwrap_path():
                raise SandboxError("sandbox mode 'bwrap' requested but bubblewrap is not installed "
                                   "(apt-get install bubblewrap)")
            argv = _bwrap_argv(self._work, self._runtime) + [
                sys.executable, "/opt/ait/inside.py", "--adapter", "/opt/ait/verifiers_v0.py", "--preload", preload]
            env = {}
            work_inside = "/sandbox"
        else:
            argv = [sys.executable, str(self._runtime / "inside.py"), "--adapter",
                    str(self._runtime / "verifiers_v0.py"), "--preload", preload]
            env = {"PATH": "/usr/bin:/bin", "HOME": str(self._work), "AIT_SANDBOX_NO_SETUID": "1",
                   "AIT_SANDBOX_FALLBACK": "1", "PYTHONDONTWRITEBYTECODE": "1"}
            work_inside = str(self._work)
        self._work_inside = work_inside
        netns = ""

        def _pre() -> None:
            os.setsid()
            if mode == "fallback" and os.getuid() == 0:
                try:
                    os.unshare(os.CLONE_NEWNET)  # type: ignore[attr-defined]
                except (AttributeError, OSError):
                    pass

        # stderr goes to a file: an undrained pipe would fill up (progress bars, logs) and block the zygote.
        self._log_path = self._root / "sandbox.log"
        log = open(self._log_path, "w")  # noqa: SIM115 - owned by the child process
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                text=True, env=env, cwd=str(self._work), preexec_fn=_pre, bufsize=1)
        log.close()
        self._proc = proc
        self._lines = queue.Queue()
        threading.Thread(target=self._reader, args=(proc, self._lines), daemon=True).start()
        self._cgroup, cg_text = _cgroup_for(proc.pid, self.settings.limits.max_processes + 8)
        ready = self._readline(self.settings.startup_timeout_s)
        if ready is None or not ready.get("ready"):
            err = self.log_tail()
            self.close()
            if mode == "bwrap" and self.settings.mode == "auto":
                sys.stderr.write(f"ait sandbox: bubblewrap failed to start ({err.strip()[-300:]}); "
                                 "FALLING BACK to the weaker subprocess sandbox\n")
                self.settings = self.settings.model_copy(update={"mode": "fallback"})
                return self._start()
            raise SandboxError(f"the sandbox did not start ({mode}): {err.strip()[-1000:]}")
        if mode == "fallback":
            netns = "new network namespace" if os.getuid() == 0 else "no network namespace (not root)"
            self.description = (f"fallback (no bubblewrap): same uid, cleared env, rlimits, Python audit hook "
                                f"blocking sockets/processes/outside files, {netns}, {cg_text}")
            sys.stderr.write(f"ait sandbox: WEAKER MODE in force: {self.description}\n")
        else:
            drop = ready.get("drop_to")
            self.description = (f"bwrap: mount/pid/net/ipc/uts namespaces, read-only system binds, no network, "
                                f"{'uid ' + str(drop) if drop is not None else 'same uid (not root)'}, rlimits, {cg_text}")
        self.mode = mode

    def _readline(self, timeout: float) -> dict[str, Any] | None:
        """Next JSON line from the zygote (a persistent reader thread feeds a queue, so a timed-out
        wait never loses a later line)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return None
            if line is None:
                return None
            try:
                obj = json.loads(line)
            except ValueError:
                obj = None
            if isinstance(obj, dict):
                return obj
            sys.stderr.write(f"ait sandbox: ignored a non-protocol line: {line[:200]!r}\n")

    def _reader(self, proc: "subprocess.Popen[str]", q: "queue.Queue[str | None]") -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            q.put(line)
        q.put(None)

    def log_tail(self, limit: int = 2000) -> str:
        try:
            return self._log_path.read_text(errors="replace")[-limit:]
        except (OSError, AttributeError):
            return ""

    def close(self) -> None:
        """Stop the resident process and everything it started. bubblewrap's process inside the pid
        namespace starts a session of its own, so the outer process's group does not reach it: its
        descendants are killed one by one (the namespace's processes go with its first), and stdin is
        closed, which ends the zygote as well."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            tree = _descendants(proc.pid)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                proc.kill()
            for pid in tree:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            proc.wait(timeout=10)
        if proc is not None:
            for stream in (proc.stdin, proc.stdout):
                try:
                    if stream is not None:
                        stream.close()
                except OSError:
                    pass
        if self._cgroup is not None:
            try:
                self._cgroup.rmdir()
            except OSError:
                pass
            self._cgroup = None

    def destroy(self) -> None:
        self.close()
        shutil.rmtree(self._root, ignore_errors=True)

    def warm(self) -> None:
        """Start the resident process in the background (it takes seconds to import verifiers)."""
        def _go() -> None:
            with self._lock:
                if self._proc is None or self._proc.poll() is not None:
                    try:
                        self._start()
                    except SandboxError:
                        pass  # reported on the first real request
        threading.Thread(target=_go, daemon=True).start()

    # ------------------------------------------------------------------ requests
    def new_workdir(self) -> tuple[Path, str]:
        """A fresh folder for one request: (path outside, path inside the sandbox)."""
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._start()
        name = f"req-{uuid.uuid4().hex[:10]}"
        outside = self._work / name
        outside.mkdir()
        return outside, f"{self._work_inside}/{name}"

    def run(self, request: dict[str, Any], workdir: Path) -> dict[str, Any]:
        """Send one request (its ``dir`` must be the inside path of ``workdir``); returns the response."""
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._start()
            assert self._proc is not None and self._proc.stdin is not None
            if self.mode == "bwrap" and os.getuid() == 0:
                for p in [workdir, *workdir.rglob("*")]:
                    os.lchown(p, SANDBOX_UID, SANDBOX_UID)
            req = dict(request)
            req["id"] = next(self._ids)
            req.setdefault("limits", self.settings.limits.model_dump())
            try:
                self._proc.stdin.write(json.dumps(req) + "\n")
                self._proc.stdin.flush()
            except (BrokenPipeError, OSError) as exc:
                self.close()
                raise SandboxError(f"the sandbox died: {exc}") from None
            wall = float(req["limits"].get("wall_seconds", 30))
            deadline = time.monotonic() + wall + 30
            line = None
            while time.monotonic() < deadline:
                line = self._readline(max(0.1, deadline - time.monotonic()))
                if line is None or line.get("id") == req["id"]:
                    break  # (answers to earlier, abandoned requests are skipped)
                line = None
            if line is None:
                proc = self._proc
                if proc is None:  # closed by another thread (e.g. the job ended while this request ran)
                    raise SandboxError("the sandbox was shut down while the request was running")
                tail = self.log_tail(800)
                alive = proc.poll() is None
                code = proc.returncode
                self.close()
                raise SandboxError(f"the sandbox stopped answering within {wall + 30:.0f} s (process "
                                   f"{'alive' if alive else f'exited with code {code}'}); it will be restarted. "
                                   f"Log tail: {tail}")
            return line["response"]

    def release(self, workdir: Path) -> None:
        shutil.rmtree(workdir, ignore_errors=True)


_SHARED: dict[str, Sandbox] = {}


def shared_sandbox(settings: SandboxSettings | None = None) -> Sandbox:
    """One resident sandbox per distinct settings, shared by every probe in the process."""
    settings = settings or SandboxSettings()
    key = settings.model_dump_json()
    if key not in _SHARED:
        _SHARED[key] = Sandbox(settings)
    return _SHARED[key]
