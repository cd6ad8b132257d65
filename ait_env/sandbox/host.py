"""Run untrusted agent code in isolation: a resident sandboxed process ("zygote") that forks one
limited child per request (see :mod:`ait_env.sandbox.zygote` for the inside half and
:mod:`ait_env.sandbox.confine` for what each request's child does before agent code runs). The
sandbox runs the job modules it is given (the validation probe's ``inspect``, the local executor's
``rollout_worker``).

Isolation modes, strongest available first (``SandboxSettings.mode = "auto"``):

``bwrap`` (bubblewrap, `apt-get install bubblewrap`)
    New mount, pid, network, IPC and UTS namespaces. The filesystem holds only read-only binds of
    /usr, /lib*, /bin, the Python installation and the virtualenv, a fresh /proc and /dev, and the
    folder of request folders; no /etc, no home directory, no project checkout (so neither
    ``ait_env``, the secrets file nor the hidden sets are reachable). The environment is cleared.
    The network namespace has only an unconfigured loopback: nothing outside is reachable.
    Before running agent code the child drops to uid/gid 65534 (when the sandbox starts as root),
    which makes the process-count limit effective and its request folder read-only to it.
``fallback`` (no bubblewrap, or bubblewrap itself refuses to start)
    A plain subprocess with a cleared environment and the same rlimits; when running as root it also
    enters a new network namespace (``unshare``); in any case the child installs a Python audit hook
    that refuses socket connections, process creation and opening files outside its work folder and
    the Python installation. This is weaker (same uid as the orchestrator; a native extension could
    bypass the audit hook), is announced on stderr with its reason and is reported in every probe
    result. Only bubblewrap's own refusal (it exits with a message) leads here; a slow start or a
    start interrupted by :meth:`Sandbox.close` is an error, never a weaker sandbox.

In both modes each request gets a fresh, size-limited scratch space (a private tmpfs where mounts are
permitted, else a folder the zygote bounds and wipes) that is its only writable place and is gone when
the request ends; capabilities are dropped and a seccomp filter refuses namespaces, mounts, chroot and
other host administration calls (``confine.py``). A pids cgroup (v1 or v2, when writable) caps the
number of processes, the child has CPU-time, address-space, file-size and process-count rlimits, and
the zygote kills every leftover process after each request. Request folders are deleted whatever
they hold (:func:`remove_tree`).
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import queue
import shutil
import stat
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from ait_env.processes import kill_tree
from ait_env.sandbox.jail import bwrap_argv, bwrap_path, cgroup_for, remove_tree
from ait_env.sandbox.link import SandboxError, _Closed, _ZygoteLink, unreadable_answer

__all__ = ["Sandbox", "SandboxError", "SandboxLimits", "SandboxSettings", "bwrap_argv", "bwrap_path", "cgroup_for",
           "remove_tree", "shared_sandbox", "unreadable_answer"]

ZYGOTE = Path(__file__).with_name("zygote.py")
CONFINE = Path(__file__).with_name("confine.py")
ADAPTER = Path(__file__).resolve().parents[1] / "integrations" / "verifiers_v0.py"


class SandboxLimits(BaseModel):
    cpu_seconds: int = Field(20, ge=1)
    memory_mb: int = Field(2048, ge=64)       # address space above the zygote's own
    file_size_mb: int = Field(64, ge=1)
    max_processes: int = Field(32, ge=4)
    wall_seconds: float = Field(30.0, gt=0)
    #: the request's only writable space: a fresh tmpfs of this size (and inode count), gone when the
    #: request ends (see ``confine.py``)
    scratch_mb: int = Field(256, ge=1)
    scratch_inodes: int = Field(20000, ge=16)
    #: False: the scratch space is a plain folder bounded by the zygote's polling and wiped after each
    #: request, as where mounts are not permitted (tests use it to exercise that path)
    scratch_tmpfs: bool = True


class SandboxSettings(BaseModel):
    mode: Literal["auto", "bwrap", "fallback"] = "auto"
    limits: SandboxLimits = Field(default_factory=SandboxLimits)
    preload: list[str] = Field(default_factory=lambda: [
        "verifiers", "verifiers.envs.tool_env", "verifiers.rubrics.rubric", "verifiers.rubrics.rubric_group",
        "verifiers.utils.message_utils", "datasets"])
    startup_timeout_s: float = 120.0
    #: the interpreter the agent's code runs under; it must hold the inner stack the jobs are written for
    #: (verifiers 0.2.0 and datasets: ``pip install 'ai-trains-ai[inner]'``). Default: this process's own. An
    #: outer loop on another verifiers (the verifiers v1 adapter's venv, docs/verifiers.md) names the
    #: project's main venv here, so jobs are still validated with the pinned stack.
    python: str | None = None


class Sandbox(_ZygoteLink):
    """A resident sandboxed process. Thread-safe (one request at a time); restarts after failures.

    Every request runs in a fresh child with its own scratch space (see ``confine.py``); its folder
    is readable but not writable by the agent's code where the sandbox drops to another uid."""

    def __init__(self, settings: SandboxSettings | None = None, jobs: dict[str, Path] | None = None) -> None:
        """``jobs``: the job modules this sandbox runs, by name (each a file with ``run(req, adapter, ctx)``
        that runs inside, e.g. ``{"inspect": ait_env/probe/inspect_job.py}``)."""
        self.settings = settings or SandboxSettings()
        self.jobs = {name: Path(path) for name, path in (jobs or {}).items()}
        self._lock = threading.Lock()          # one request (or start) at a time
        self._state = threading.Lock()         # guards _proc and _generation against close()
        self._generation = 0                   # bumped by close(): a start in progress is abandoned
        self._destroyed = False
        self._proc: subprocess.Popen[str] | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._root = Path(tempfile.mkdtemp(prefix="ait-sandbox-"))
        self._work = self._root / "work"
        self._runtime = self._root / "runtime"
        self._scratch = self._root / "scratch"
        self._cgroup: Path | None = None
        self._ids = itertools.count()
        self._log_path = self._root / "sandbox.log"
        self.description = ""
        self.mode = ""
        self.fallback_reason = ""
        atexit.register(self.destroy)  # the process and its temporary folder go when the interpreter exits

    # ------------------------------------------------------------------ lifecycle
    def _prepare_runtime(self) -> None:
        for d in (self._work, self._runtime, self._scratch):
            d.mkdir(parents=True, exist_ok=True)
        for src in (ZYGOTE, CONFINE):
            shutil.copyfile(src, self._runtime / src.name)
        shutil.copyfile(ADAPTER, self._runtime / "verifiers_v0.py")
        for name, src in self.jobs.items():
            shutil.copyfile(src, self._runtime / f"job_{name}.py")
        for p in self._runtime.iterdir():
            os.chmod(p, 0o644)
        os.chmod(self._root, 0o755)
        os.chmod(self._runtime, 0o755)
        os.chmod(self._scratch, 0o755)
        # request folders are reachable by their (random) names only: nobody inside can list them
        os.chmod(self._work, 0o711)

    def _start(self) -> None:
        with self._state:
            generation = self._generation
            if self._destroyed:
                raise _Closed("the sandbox was destroyed")
        try:
            self._prepare_runtime()
            self._launch(generation)
        except OSError as exc:
            with self._state:
                closed = self._generation != generation
            raise (_Closed("the sandbox was closed while it was starting") if closed
                   else SandboxError(f"the sandbox could not be started: {exc}")) from None

    def close(self) -> None:
        """Stop the resident process and everything it started (a start in progress is abandoned, never
        turned into a fallback). bubblewrap's process inside the pid namespace starts a session of its
        own, so the outer process's group does not reach it: its descendants are killed one by one (the
        namespace's processes go with its first), and stdin is closed, which ends the zygote as well."""
        with self._state:
            self._generation += 1
            proc, self._proc = self._proc, None
        if proc is not None:
            kill_tree(proc)
        if self._cgroup is not None:
            try:
                self._cgroup.rmdir()
            except OSError:
                pass
            self._cgroup = None

    def destroy(self) -> None:
        """Close the sandbox for good and delete its folder (a later request raises SandboxError)."""
        with self._state:
            self._destroyed = True
        self.close()
        remove_tree(self._root)

    def warm(self) -> threading.Thread:
        """Start the resident process in the background (it takes seconds to import verifiers); returns
        the starting thread."""
        def _go() -> None:
            with self._lock:
                if self._proc is None or self._proc.poll() is not None:
                    try:
                        self._start()
                    except SandboxError:
                        pass  # reported on the first real request
        thread = threading.Thread(target=_go, name="ait-sandbox-warm", daemon=True)
        thread.start()
        return thread

    # ------------------------------------------------------------------ requests
    def _ensure_started(self) -> None:
        if self._proc is None or self._proc.poll() is not None:
            self._start()

    def new_workdir(self) -> tuple[Path, str]:
        """A fresh folder for one request: (path outside, path inside the sandbox)."""
        with self._lock:
            self._ensure_started()
        name = f"req-{uuid.uuid4().hex[:10]}"
        outside = self._work / name
        outside.mkdir()
        return outside, f"{self._work_inside}/{name}"

    @property
    def folder(self) -> Path:
        """The host folder holding everything of this sandbox (removed by :meth:`destroy` or at exit)."""
        return self._root

    @property
    def pid(self) -> int | None:
        """The resident process's pid (None when it is not running)."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def request_folders(self) -> list[Path]:
        """The request folders that exist on the host now (each is deleted when its request ends)."""
        try:
            return sorted(self._work.iterdir())
        except OSError:
            return []

    @staticmethod
    def share_socket(path: Path) -> None:
        """Let the request's code connect to the Unix socket ``path`` (in its folder) after the uid drop."""
        os.chmod(path, 0o666)

    def _seal(self, workdir: Path) -> None:
        """Make the request's folder readable and not writable by the agent's code (which runs as another
        uid when the sandbox starts as root): root-owned, folders 0755, files 0644, whatever the umask."""
        if self.mode != "bwrap" or os.getuid() != 0:
            return
        for dirpath, dirnames, filenames in os.walk(workdir):
            os.chmod(dirpath, 0o755)
            for name in filenames:
                p = os.path.join(dirpath, name)
                if not os.path.islink(p) and not stat.S_ISSOCK(os.lstat(p).st_mode):
                    os.chmod(p, 0o644)

    def run(self, request: dict[str, Any], workdir: Path) -> dict[str, Any]:
        """Send one request (its ``dir`` must be the inside path of ``workdir``); returns the response."""
        with self._lock:
            self._ensure_started()
            with self._state:
                proc = self._proc
            if proc is None or proc.stdin is None:
                raise SandboxError("the sandbox was shut down before the request started")
            self._seal(workdir)
            req = dict(request)
            req["id"] = next(self._ids)
            req["scratch"] = self._scratch_inside
            req["limits"] = dict(req.get("limits") or self.settings.limits.model_dump())
            # a pids cgroup caps this sandbox's processes alone; RLIMIT_NPROC counts every process of the shared
            # sandbox uid on the machine (other sandboxes' threads made a probe's "can't start new thread"),
            # so the zygote sets it only when no cgroup does the job
            req["limits"]["pids_cgroup"] = self._cgroup is not None
            try:
                line_out = json.dumps(req, allow_nan=False) + "\n"
            except (TypeError, ValueError) as exc:
                raise SandboxError(f"the request cannot be sent to the sandbox as JSON: {exc}") from None
            try:
                proc.stdin.write(line_out)
                proc.stdin.flush()
            except (BrokenPipeError, OSError, ValueError) as exc:
                self.close()
                raise SandboxError(f"the sandbox died: {exc}") from None
            wall = float(req["limits"].get("wall_seconds", 30))
            deadline = time.monotonic() + wall + 90  # + the zygote's own cleanup of the request
            line = None
            while time.monotonic() < deadline:
                line = self._readline(max(0.1, deadline - time.monotonic()))
                if line is None or line.get("id") == req["id"]:
                    break  # (answers to earlier, abandoned requests are skipped)
                line = None
            if line is None or not isinstance(line.get("response"), dict):
                with self._state:
                    closed = self._proc is not proc
                if closed:  # closed by another thread (e.g. the job ended while this request ran)
                    raise SandboxError("the sandbox was shut down while the request was running")
                tail = self.log_tail(800)
                alive = proc.poll() is None
                code = proc.returncode
                self.close()
                raise SandboxError(f"the sandbox stopped answering within {wall + 90:.0f} s (process "
                                   f"{'alive' if alive else f'exited with code {code}'}); it will be restarted. "
                                   f"Log tail: {tail}")
            return line["response"]

    def release(self, workdir: Path) -> None:
        """Delete a request's folder (never raises, bounded in time, any tree the request left)."""
        remove_tree(workdir)


_SHARED: dict[str, Sandbox] = {}


def shared_sandbox(settings: SandboxSettings | None = None, jobs: dict[str, Path] | None = None) -> Sandbox:
    """One resident sandbox per distinct settings and jobs, shared by every user in the process (the
    probes of every env): each request is isolated from the others all the same."""
    settings = settings or SandboxSettings()
    key = settings.model_dump_json() + json.dumps(sorted((k, str(v)) for k, v in (jobs or {}).items()))
    if key not in _SHARED:
        _SHARED[key] = Sandbox(settings, jobs)
    return _SHARED[key]
