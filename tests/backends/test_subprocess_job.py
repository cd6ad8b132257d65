"""The subprocess backends' base (ait_env/backends/subprocess_job.py): ``close`` stops a job another thread is
waiting on (its wait returns ``infra_failed``), and an entry point stopped with SIGTERM under
``sigterm_as_exit`` closes its backend, so no job outlives it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from types import SimpleNamespace

from ait_env.backends.subprocess_job import SubprocessBackend
from ait_env.jobs.settings import BackendSettings
from tests.helpers import alive

ROOT = Path(__file__).resolve().parents[2]
SLEEP = [sys.executable, "-c", "import time\nwhile True: time.sleep(1)"]



class Sleeper(SubprocessBackend):
    name = "sleeper"

    def submit(self, bundle):  # noqa: ANN001, ANN201
        return self._start(bundle, SLEEP, env=dict(os.environ))


def _bundle(tmp_path: Path, job_id: str) -> SimpleNamespace:
    root = tmp_path / job_id
    root.mkdir()
    return SimpleNamespace(root=root, job_id=job_id)


def test_close_stops_a_job_that_another_thread_is_waiting_on(tmp_path):
    b = Sleeper(BackendSettings(name="local"), tmp_path / "runs", show_progress=False)
    waited, queued = b.submit(_bundle(tmp_path, "waited")), b.submit(_bundle(tmp_path, "queued"))
    pids = [waited.meta["pid"], queued.meta["pid"]]
    results: list = []
    t = threading.Thread(target=lambda: results.append(b.wait(waited)))
    t.start()
    time.sleep(0.5)                               # the wait is under way
    b.close()
    t.join(20)
    assert not t.is_alive() and results[0].status == "infra_failed"
    deadline = time.time() + 10
    while any(alive(p) for p in pids) and time.time() < deadline:
        time.sleep(0.05)
    assert not any(alive(p) for p in pids), "a job outlived close()"


ENTRY = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from types import SimpleNamespace
    sys.path.insert(0, sys.argv[2])
    from tests.backends.test_subprocess_job import Sleeper, _bundle
    from ait_env.jobs.settings import BackendSettings
    from ait_env.processes import sigterm_as_exit

    def main():
        b = Sleeper(BackendSettings(name="local"), Path(sys.argv[1]) / "runs", show_progress=False)
        try:
            h = b.submit(_bundle(Path(sys.argv[1]), "job"))
            print(h.meta["pid"], flush=True)
            b.wait(h)
        finally:
            b.close()

    with sigterm_as_exit():
        main()
""")


def test_an_entry_point_stopped_with_sigterm_stops_its_running_job(tmp_path):
    """The entry points (trainers/local_outer.py, scripts/run_episode.py, the LLM runner, ...) run their main
    under ``sigterm_as_exit``: SIGTERM becomes SystemExit, the backend's close runs, the job dies with them."""
    proc = subprocess.Popen([sys.executable, "-c", ENTRY, str(tmp_path), str(ROOT)], stdout=subprocess.PIPE,
                            text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert proc.stdout is not None
        job_pid = int(proc.stdout.readline())
        assert alive(job_pid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 143
        deadline = time.time() + 10
        while alive(job_pid) and time.time() < deadline:
            time.sleep(0.05)
        assert not alive(job_pid), "the job outlived its SIGTERM'd entry point"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_every_long_running_entry_point_runs_under_sigterm_as_exit():
    for path in ("trainers/local_outer.py", "trainers/tinker_grpo.py", "scripts/run_episode.py",
                 "scripts/seed_baselines.py"):
        main_block = (ROOT / path).read_text().split('if __name__ == "__main__":', 1)[1]
        assert "with sigterm_as_exit():" in main_block, path
    for path in ("ait_env/agents/llm/__main__.py",):   # a package's __main__ is its main block
        main_block = (ROOT / path).read_text()
        assert "with sigterm_as_exit():" in main_block, path
