"""Helpers the tests share (import them: ``from tests.helpers import call, play, make_bundle``); fixtures stay
in ``conftest.py``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from task_families import get_family


def call(name: str, **arguments: Any) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def play(env: Any, agent: Any, seed: int, turns: int = 10) -> tuple[str, float, bool, bool, dict[str, Any]]:
    """Reset ``env`` and let a scripted ``agent`` (``reset(info)``, ``act(obs, info)``) play until the episode
    ends or ``turns`` turns; the last step's ``(obs, reward, terminated, truncated, info)``."""
    obs, info = env.reset(seed=seed)
    agent.reset(info)
    out: tuple[str, float, bool, bool, dict[str, Any]] = (obs, 0.0, False, False, info)
    for _ in range(turns):
        out = env.step(agent.act(out[0], out[4]))
        if out[2] or out[3]:
            break
    return out


def make_bundle(files: dict[str, str], folder: Path, family: str = "arithmetic", episode_id: str | None = None) -> Any:
    """Write ``files`` as a workspace under ``folder`` and bundle the job without the probe, the way the
    env bundles a validated job."""
    from ait_env.jobs.bundle import build_bundle
    from ait_env.jobs.schema import parse_job

    ws = folder / "ws"
    ws.mkdir()
    for name, text in files.items():
        (ws / name).parent.mkdir(parents=True, exist_ok=True)
        (ws / name).write_text(text)
    job, issues = parse_job(files["job.toml"])
    assert job is not None, issues
    return build_bundle(ws, job, get_family(family), folder / "jobs", episode_id=episode_id)


def load_reference_environment(family: str, model: str, folder: Path, args: dict[str, Any]) -> Any:
    """The family's reference job, packaged and imported the way a bundle is (in this process), then
    ``load_environment(**args)``: the verifiers environment an agent's job would train with."""
    import uuid

    from task_families import reference_files
    from ait_env.integrations import verifiers_v0 as V
    from ait_env.jobs.bundle import write_env_package
    from ait_env.jobs.schema import parse_job

    files = reference_files(family, model)
    ws = folder / "ws"
    ws.mkdir(parents=True)
    for name, text in files.items():
        (ws / name).write_text(text)
    job, issues = parse_job(files["job.toml"])
    assert job is not None, issues
    env_id = f"ait_job_test_{uuid.uuid4().hex[:8]}"
    write_env_package(ws, job, get_family(family), folder / "pkgs", env_id)
    return V.load_environment(V.import_env_package(folder / "pkgs", env_id), args)


def worker_training_uid(environ: Any = os.environ, pid: int | None = None) -> int:
    """Set and return this process's ``AIT_TRAINING_UID`` (the GPU jail's uid, which it kills wholesale).

    The session picks a base once (the xdist controller, or a plain run): ``$AIT_TRAINING_UID`` when you set
    one, else 61000 + 300 × (pid mod 13), so that two suites started side by side (two checkouts on one
    machine) rarely share one; the workers inherit it as ``AIT_TRAINING_UID_BASE``. Each xdist worker
    (``PYTEST_XDIST_WORKER=gwN``) then takes base + 100 × (N + 1), room for the per-GPU-group uids a backend
    derives from it. No uid changes what a test computes; only which processes a jail may kill."""
    worker = environ.get("PYTEST_XDIST_WORKER", "")
    if "AIT_TRAINING_UID_BASE" not in environ:
        own = environ.get("AIT_TRAINING_UID")
        if own and not own.isdigit():
            raise ValueError(f"AIT_TRAINING_UID={own!r}: give an unused numeric uid >= 1000 (e.g. 64000), or leave "
                             "it unset and the suite picks one")
        base = int(own) if own else 61000 + 300 * ((os.getpid() if pid is None else pid) % 13)
        environ["AIT_TRAINING_UID_BASE"] = str(base)
    base = int(environ["AIT_TRAINING_UID_BASE"])
    uid = base + 100 * (int(worker[2:]) + 1) if worker.startswith("gw") and worker[2:].isdigit() else base
    environ["AIT_TRAINING_UID"] = str(uid)
    return uid


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited but not reaped, counts as gone): the process toolkit's test."""
    from ait_env.processes import is_gone

    return not is_gone(pid)


def load_factor() -> float:
    """How much slower than an idle machine this one runs now: the 1-minute load average per CPU core, at
    least 1 (a 2-core machine at load 8 gives 4). Timing margins a test cannot avoid (a real child process
    that must reach a step before a wall clock) are multiplied by it, so a busy machine (another training
    job beside the suite) does not turn a slow start into a wrong verdict."""
    try:
        load = os.getloadavg()[0]
    except OSError:   # no load average on this platform: assume idle
        return 1.0
    return max(1.0, load / (os.cpu_count() or 1))


def load_scaled(seconds: float) -> float:
    """``seconds`` times :func:`load_factor`, rounded up to a whole second (a margin that grows with the load)."""
    import math

    return float(math.ceil(seconds * load_factor()))
