"""The base of the backends whose jobs each run as one child process on this machine (``local``: the job
runner; ``gpu-local``: the GPU worker).

Contract: :meth:`SubprocessBackend._start` takes a slot (:meth:`_acquire`: may wait, e.g. for a free GPU
set), starts the child in a session of its own with its stdout in the bundle (:attr:`out_file`) and
returns the handle; a child that cannot start gives its slot back. :meth:`wait` waits for the child
(past ``timeout``: the child, its group and every process below it are killed and ``TimeoutError`` is
raised), gives the slot back, and returns the bundle's ``result.json``; a child that exits without one is
an ``infra_failed`` result with its exit code and the tail of :attr:`log_file`. :meth:`close` kills every
child still running (and everything below it) and gives their slots back.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any, ClassVar

from ait_env.backends.base import Backend, JobHandle
from ait_env.jobs.bundle import JobBundle
from ait_env.jobs.result import JobResult
from ait_env.jobs.settings import BackendSettings
from ait_env.processes import kill_tree


class SubprocessBackend(Backend):
    """See the module docstring. Subclasses build the command and call :meth:`_start` from ``submit``."""

    #: what the child is called in an error ("the job runner")
    child_name: ClassVar[str] = "the job process"
    #: the bundle file the child's stdout goes to, and the one whose tail an infra_failed result reports
    out_file: ClassVar[str] = "job.out"
    log_file: ClassVar[str] = "job.out"

    def __init__(self, settings: BackendSettings, runs_dir: Path | str | None = None, show_progress: bool = True) -> None:
        super().__init__(settings, runs_dir)
        self.show_progress = show_progress
        self._procs: dict[str, tuple[subprocess.Popen[bytes], Any]] = {}

    def _acquire(self) -> Any:
        """Take a slot for one job (may wait); what it returns is given back to :meth:`_release`."""
        return None

    def _release(self, slot: Any) -> None:
        """Give back a slot :meth:`_acquire` returned."""

    def _start(self, bundle: JobBundle, cmd: list[str], *, env: dict[str, str], cwd: Path | None = None,
               slot: Any = None, meta: dict[str, Any] | None = None) -> JobHandle:
        """Start ``cmd`` for ``bundle`` holding ``slot`` (from :meth:`_acquire`); the slot is given back if
        the child cannot start."""
        try:
            with open(bundle.root / self.out_file, "wb") as out:
                proc = subprocess.Popen(cmd, stdout=out, stderr=None if self.show_progress else subprocess.STDOUT,
                                        env=env, cwd=cwd, start_new_session=True)
        except BaseException:
            self._release(slot)
            raise
        self._procs[bundle.job_id] = (proc, slot)
        return JobHandle(job_id=bundle.job_id, backend=self.name,
                         meta={"root": str(bundle.root), "pid": proc.pid, **(meta or {})})

    def wait(self, handle: JobHandle, timeout: float | None = None) -> JobResult:
        root = Path(handle.meta["root"])
        proc, slot = self._procs.get(handle.job_id, (None, None))   # listed while it runs: close() stops it
        t0 = time.time()
        try:
            if proc is not None:
                try:
                    proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    kill_tree(proc)
                    raise TimeoutError(f"{self.name} job {handle.job_id} did not finish within {timeout} s") from None
        finally:
            # unlisted once it has ended; a wait interrupted (Ctrl-C, SIGTERM as SystemExit) leaves it listed
            # for close() to stop
            if proc is not None and proc.poll() is not None and self._procs.pop(handle.job_id, None) is not None:
                self._release(slot)
        path = root / "result.json"
        if not path.exists():
            log = root / self.log_file
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            code = proc.returncode if proc is not None else None
            return JobResult(job_id=handle.job_id, backend=self.name, status="infra_failed",
                             error=f"{self.child_name} exited (code {code}) without a result", log_tail=tail,
                             wall_seconds=time.time() - t0)
        return JobResult.model_validate_json(path.read_text())

    def close(self) -> None:
        """Stop the jobs still running, also those a :meth:`wait` is waiting on (each child and everything it
        started); their waits return an ``infra_failed`` result."""
        for job_id in list(self._procs):
            entry = self._procs.pop(job_id, None)
            if entry is not None:
                kill_tree(entry[0])
                self._release(entry[1])
        super().close()
