"""The orchestrator's line to the sandbox's resident process (the zygote): starting it in its jail
(bubblewrap, or the announced weaker fallback only on bubblewrap's own refusal), its command line, and reading
its JSON answers (a reader thread feeds a queue, so a timed-out wait loses no later line; an answer too deep to
parse here is an error answer to its request, :func:`unreadable_answer`). A part of
:class:`ait_env.sandbox.host.Sandbox` (a mixin over its state), kept apart from its request handling."""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ait_env.processes import kill_tree, python_roots
from ait_env.sandbox import jail

if TYPE_CHECKING:
    from ait_env.sandbox.host import SandboxSettings


class SandboxError(RuntimeError):
    """The sandbox failed (could not start, died, stopped answering): an infrastructure error, never the agent's."""


class _Closed(SandboxError):
    """The sandbox was closed while it was starting (never a reason to fall back)."""


class _ZygoteLink:
    """Starting the resident process and reading its answers (the module docstring); the state it uses is
    :class:`ait_env.sandbox.host.Sandbox`'s."""

    settings: "SandboxSettings"
    jobs: dict[str, Path]
    _state: threading.Lock
    _generation: int
    _proc: "subprocess.Popen[str] | None"
    _lines: "queue.Queue[str | None]"
    _work: Path
    _runtime: Path
    _scratch: Path
    _cgroup: Path | None
    _log_path: Path
    _work_inside: str
    _scratch_inside: str
    description: str
    mode: str
    fallback_reason: str

    def close(self) -> None:  # pragma: no cover - Sandbox's
        raise NotImplementedError

    def _drop_bwrap(self, reason: str) -> None:
        """Give up on bubblewrap for this sandbox, loudly, with the reason."""
        self.fallback_reason = reason.strip() or "no reason given"
        sys.stderr.write(f"ait sandbox: bubblewrap failed to start ({self.fallback_reason[-300:]}); "
                         "FALLING BACK to the weaker subprocess sandbox\n")
        self.settings = self.settings.model_copy(update={"mode": "fallback"})

    def _launch(self, generation: int) -> None:
        mode = self.settings.mode
        if mode == "auto":
            mode = "bwrap" if jail.bwrap_path() else "fallback"
            if mode == "fallback":
                self.fallback_reason = "bubblewrap (bwrap) is not installed"
        preload = ",".join(self.settings.preload)
        python = self.settings.python or sys.executable
        if not os.access(python, os.X_OK):
            raise SandboxError(f"the sandbox's interpreter {python} is not an executable: set "
                               "probe.sandbox.python to a Python with the inner stack (pip install 'ai-trains-ai[inner]')")
        if mode == "bwrap":
            if not jail.bwrap_path():
                raise SandboxError("sandbox mode 'bwrap' requested but bubblewrap is not installed "
                                   "(apt-get install bubblewrap)")
            roots = python_roots(python) if self.settings.python else None
            argv = jail.bwrap_argv(self._work, self._runtime, roots) + [python, *self._zygote_args("/opt/ait", preload)]
            env: dict[str, str] = {}
            self._work_inside, self._scratch_inside = "/sandbox", "/scratch"
        else:
            argv = [python, *self._zygote_args(str(self._runtime), preload)]
            env = {"PATH": "/usr/bin:/bin", "HOME": str(self._scratch), "AIT_SANDBOX_NO_SETUID": "1",
                   "AIT_SANDBOX_FALLBACK": "1", "PYTHONDONTWRITEBYTECODE": "1"}
            self._work_inside, self._scratch_inside = str(self._work), str(self._scratch)

        def _pre() -> None:
            os.setsid()
            if mode == "fallback" and os.getuid() == 0:
                try:
                    os.unshare(os.CLONE_NEWNET)  # type: ignore[attr-defined]
                except (AttributeError, OSError):
                    pass

        # stderr goes to a file: an undrained pipe would fill up (progress bars, logs) and block the zygote.
        log = open(self._log_path, "w")  # noqa: SIM115 - owned by the child process
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                text=True, env=env, cwd=str(self._work), preexec_fn=_pre, bufsize=1)
        log.close()
        with self._state:
            if self._generation != generation:  # close() ran while we were starting it
                kill_tree(proc)
                raise _Closed("the sandbox was closed while it was starting")
            self._proc = proc
        self._lines = queue.Queue()
        threading.Thread(target=self._reader, args=(proc, self._lines), daemon=True).start()
        self._cgroup, cg_text = jail.cgroup_for(proc.pid, self.settings.limits.max_processes + 8)
        ready = self._readline(self.settings.startup_timeout_s)
        if ready is None or not ready.get("ready"):
            with self._state:
                closed = self._generation != generation
            exited = proc.poll() is not None
            err = self.log_tail()
            self.close()
            if closed:
                raise _Closed("the sandbox was closed while it was starting")
            # Fall back only on bubblewrap's own refusal (it exits with a "bwrap: ..." message); a zygote
            # that fails or is merely slow (a loaded machine) is an infrastructure error, never a weaker
            # sandbox.
            refusal = [ln for ln in err.splitlines() if ln.startswith("bwrap: ")]
            if mode == "bwrap" and self.settings.mode == "auto" and exited and refusal:
                self._drop_bwrap(refusal[-1])
                with self._state:
                    generation = self._generation
                return self._launch(generation)
            state = "exited" if exited else f"did not answer within {self.settings.startup_timeout_s:g} s"
            raise SandboxError(f"the sandbox did not start ({mode}: {state}): {err.strip()[-1000:] or 'no output'}")
        if mode == "fallback":
            netns = "new network namespace" if os.getuid() == 0 else "no network namespace (not root)"
            self.description = (f"fallback (no bubblewrap: {self.fallback_reason or 'requested'}): same uid, "
                                f"cleared env, rlimits, Python audit hook blocking sockets/processes/outside "
                                f"files, {netns}, {cg_text}")
            sys.stderr.write(f"ait sandbox: WEAKER MODE in force: {self.description}\n")
        else:
            drop = ready.get("drop_to")
            self.description = (f"bwrap: mount/pid/net/ipc/uts namespaces, read-only system binds, no network, "
                                f"{'uid ' + str(drop) if drop is not None else 'same uid (not root)'}, rlimits, "
                                f"{cg_text}")
        self.mode = mode

    def _zygote_args(self, runtime: str, preload: str) -> list[str]:
        """The zygote's command line, with ``runtime`` the folder of its files as the zygote sees it."""
        jobs = [arg for name in self.jobs for arg in ("--job", f"{name}={runtime}/job_{name}.py")]
        return [f"{runtime}/zygote.py", "--adapter", f"{runtime}/verifiers_v0.py", "--confine",
                f"{runtime}/confine.py", *jobs, "--preload", preload]

    def _readline(self, timeout: float) -> dict[str, Any] | None:
        """Next JSON line from the zygote (a persistent reader thread feeds a queue, so a timed-out
        wait never loses a later line); an answer too deep or too large to parse here is an error answer to its
        request (:func:`unreadable_answer`)."""
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
            except (ValueError, RecursionError):
                obj = unreadable_answer(line)
            if isinstance(obj, dict):
                return obj
            sys.stderr.write(f"ait sandbox: ignored a non-protocol line: {line[:200]!r}\n")

    def _reader(self, proc: "subprocess.Popen[str]", q: "queue.Queue[str | None]") -> None:
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                q.put(line)
        except (OSError, ValueError):
            pass  # the stream was closed by close()
        q.put(None)

    def log_tail(self, limit: int = 2000) -> str:
        try:
            return self._log_path.read_text(errors="replace")[-limit:]
        except OSError:
            return ""


def unreadable_answer(line: str) -> dict[str, Any] | None:
    """An answer line of the zygote (``{"id": N, "response": ...}``) that this process cannot parse: what the
    request's code returned nests deeper than this thread's stack allows (the zygote parsed it higher up its
    own stack) or is otherwise past the parser. Its request gets an error response that says so (the code's
    fault, reported by the request's caller) instead of no answer (which would be the sandbox's failure)."""
    m = re.match(r'\{"id": (\d{1,18}), "response": ', line)
    if m is None:
        return None
    return {"id": int(m.group(1)), "response": {
        "status": "error", "stage": "result", "kind": "exception",
        "error": "what your code returned cannot be read: lists or objects nested hundreds of levels deep, or "
                 "numbers past Python's limits; return plain strings, small numbers and flat lists"}}
