"""Shared pieces of the GPU worker tests: tiny jobs for the local executor, the worker CLI, a listener
that records connections, and a process finder."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable

import pytest

from ait_env.jobs.settings import BackendBounds, BackendSettings, ModelInfo
from ait_env.hidden.secrets import DEFAULT_SEEDS

ROOT = Path(__file__).resolve().parents[2]
#: the secret seed file the worker gets: the published seeds (the tiny models are built for their hidden
#: sets: another seed would make them stale) and a canary no text leaving the worker may contain
CANARY = 31_415_926_535
SEEDS = {**DEFAULT_SEEDS, "canary": CANARY}
FAKE_KEY = "rp-fake-credential-0123456789"


def tiny_model_built() -> bool:
    from cpu.tiny_models import catalog

    return catalog.is_current("ait-tiny-s")


needs_tiny_model = pytest.mark.skipif(not tiny_model_built(),
                                      reason="ait-tiny-s is not built (python -m cpu.tiny_models.build)")


def make_job(folder: Path, job_id: str = "job-1", env_edit: Callable[[str], str] = lambda t: t,
             family: str = "arithmetic", seed: int | None = None) -> Any:
    """A 2-step job of ``family``'s reference recipe on ait-tiny-s, its environment edited by ``env_edit``
    (``seed``: the dataset seed of its ``[env]``, to make distinct jobs)."""
    from task_families import reference_files
    from ait_env.jobs.bundle import build_bundle
    from ait_env.jobs.schema import parse_job
    from task_families import get_family

    files = reference_files(family, "ait-tiny-s", backend="local")
    for old, new in [("max_steps = 27", "max_steps = 2"), ("batch_size = 48", "batch_size = 8"),
                     ("group_size = 8", "group_size = 4"), ("max_tokens = 64", "max_tokens = 32"),
                     ("num_examples = 4000", "num_examples = 50")]:
        files["job.toml"] = files["job.toml"].replace(old, new)
    if seed is not None:
        files["job.toml"] = files["job.toml"].replace("seed = 12345", f"seed = {seed}")
    files["environment.py"] = env_edit(files["environment.py"])
    ws = folder / f"ws-{job_id}"
    ws.mkdir(parents=True)
    for name, text in files.items():
        (ws / name).write_text(text)
    job, issues = parse_job(files["job.toml"])
    assert job is not None, issues
    return build_bundle(ws, job, get_family(family), folder / "jobs", job_id=job_id)


def local_settings(name: str = "local", **options: Any) -> BackendSettings:
    opts = {"eval_every": 0, "eval_limit": 8, "measure_pre": True, "eval_max_tokens": 32, **options}
    return BackendSettings(name=name, models=[ModelInfo(name="ait-tiny-s", role="small")],
                           bounds=BackendBounds(wall_clock_minutes=5), options=opts)


def worker_env(tmp: Path) -> dict[str, str]:
    """The environment a worker starts with: a private secret seed file, a fake credential, its own TMPDIR."""
    import json

    secrets = tmp / "secrets.json"
    if not secrets.exists():
        secrets.write_text(json.dumps(SEEDS))
        secrets.chmod(0o600)
    # a short TMPDIR of its own: the local endpoint's Unix socket lives below it (108 bytes at most)
    wtmp = tmp / "wtmp"
    if not wtmp.exists():
        wtmp.symlink_to(tempfile.mkdtemp(prefix="aitw-", dir="/tmp"))
    return {**os.environ, "AIT_SECRETS_FILE": str(secrets), "RUNPOD_AI_API_KEY": FAKE_KEY,
            "TMPDIR": str(wtmp.resolve()), "PYTHONPATH": str(ROOT)}


def run_worker(args: list[str], env: dict[str, str],
               timeout: float = 300) -> "subprocess.CompletedProcess[str]":
    return subprocess.run([sys.executable, "-m", "gpu.worker", *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, check=False)


class Listener:
    """A TCP server on 127.0.0.1 that records every connection it accepts (none may come from a job)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()


def pids_with(marker: str) -> set[int]:
    """Live processes whose command line holds ``marker``."""
    out = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmd and state != "Z":
            out.add(int(entry))
    return out


def path_without_bwrap(folder: Path) -> str:
    """A ``PATH`` holding the system tools the worker and the sandbox call, but not bubblewrap: the
    sandbox then runs in its fallback mode, as on a machine without it."""
    import shutil

    folder.mkdir(parents=True, exist_ok=True)
    for tool in ("rm", "chmod", "kill", "setpriv", "sh", "git"):
        found = shutil.which(tool)
        if found:
            (folder / tool).symlink_to(found)
    return str(folder)

