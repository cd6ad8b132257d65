"""The real prime-rl v0.7.0 inside each training jail, on a CPU (issue 31). Slow; needs the install that
``bash scripts/install_primerl.sh`` makes (skipped with that command when it is absent):

    AIT_TRAINING_UID=61031 AIT_PRIME_RL_DIR=~/.cache/ai-trains-ai/prime-rl-v0.7.0/prime-rl \\
        .venv/bin/python -m pytest -m slow tests/gpu/test_gpu_real_primerl.py -v -s

(the default ``-n 2`` runs the cases side by side: each jail mode gets a training uid of its own,
``$AIT_TRAINING_UID`` + 0 / + 1, since every jail kills all processes of its uid; give each suite its own
base. User mode needs every folder above prime-rl's interpreter to let the training uid pass: under a
0700 home the test opens them (``o+x``) for its run and restores them after.)

For each jail mode (``bwrap``, ``user``, ``none``) and every family's reference bundle:

- the executor's own dry run (:class:`gpu.primerl_executor.PrimeRLExecutor`, ``rl @ <bundle>/rl.toml
  --output-dir ... --dry-run`` started by :meth:`gpu.isolation.TrainingJail.command` exactly as for a job)
  must pass and write the resolved configs;
- prime-rl's orchestrator code then starts each bundle's train env server in the same jail as it does in a
  run (``tests/gpu/primerl_env_probe.py``: ``prime_rl.orchestrator.envs.Env.start``: a ``spawn`` child with
  verifiers' legacy server, its address over a ``multiprocessing`` queue, then ``info()``), and
  ``localhost`` must resolve and a ``multiprocessing`` queue must work in the jail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ait_env.jobs.settings import BackendBounds, BackendSettings, ModelInfo
from gpu.isolation import JAIL_ENV, JailConfig, TrainingJail, bwrap_works, training_uid
from gpu.venv_paths import program_paths

pytestmark = pytest.mark.slow

MODEL = "Qwen/Qwen3-0.6B"
PRIME_RL = Path(os.environ.get("AIT_PRIME_RL_DIR")
                or Path.home() / ".cache" / "ai-trains-ai" / "prime-rl-v0.7.0" / "prime-rl")
PROBE = Path(__file__).with_name("primerl_env_probe.py")


def _installed() -> str | None:
    if not (PRIME_RL / ".venv" / "bin" / "rl").exists() or not (PRIME_RL.parent / "INSTALLED").exists():
        return (f"no prime-rl v0.7.0 install at {PRIME_RL} (set AIT_PRIME_RL_DIR, or run: bash "
                "scripts/install_primerl.sh --help)")
    return None


@pytest.fixture(scope="module")
def bundles() -> Iterator[dict[str, Any]]:
    """Every family's reference bundle on Qwen3-0.6B, below a folder every uid may pass."""
    from task_families import reference_files
    from ait_env.jobs.bundle import build_bundle
    from ait_env.jobs.schema import parse_job
    from task_families import FAMILY_NAMES, get_family

    why = _installed()
    if why:
        pytest.skip(why)
    root = Path(tempfile.mkdtemp(prefix="ait-real-primerl-", dir="/tmp"))
    root.chmod(0o755)
    out = {}
    try:
        for family in FAMILY_NAMES:
            ws = root / f"ws-{family}"
            ws.mkdir()
            files = reference_files(family, MODEL)
            for name, text in files.items():
                (ws / name).write_text(text)
            job, issues = parse_job(files["job.toml"])
            assert job is not None, issues
            out[family] = build_bundle(ws, job, get_family(family), root / "jobs", job_id=f"real-{family}")
        for path in [root, *root.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        yield out
    finally:
        shutil.rmtree(root, ignore_errors=True)


#: each jail mode's training uid above $AIT_TRAINING_UID: cases run side by side under -n 2, and a jail kills
#: every process of its uid when it ends
UID_OFFSET = {"bwrap": 0, "user": 1}


def _jail(mode: str) -> JailConfig:
    root = os.getuid() == 0
    if mode == "bwrap":
        ok, why = bwrap_works()
        if not ok:
            pytest.skip(f"bubblewrap cannot run here: {why}")
        return JailConfig(mode="bwrap", uid=training_uid() + UID_OFFSET[mode] if root else None)
    if mode == "user":
        if not root:
            pytest.skip("the user jail needs root")
        return JailConfig(mode="user", uid=training_uid() + UID_OFFSET[mode])
    return JailConfig(mode="none")


@pytest.fixture
def passable_ancestors() -> Iterator[Any]:
    """``open(paths)``: let every uid pass the folders above ``paths`` (``o+x``) until the test ends, then put
    their modes back (an install under a 0700 home, which user mode cannot reach otherwise)."""
    changed: dict[Path, int] = {}

    def open_(paths: list[str]) -> None:
        for p in paths:
            for d in Path(p).resolve().parents:
                mode = d.stat().st_mode & 0o7777
                if not mode & 0o001 and d not in changed:
                    changed[d] = mode
                    d.chmod(mode | 0o001)

    try:
        yield open_
    finally:
        for d, mode in changed.items():
            d.chmod(mode)


@pytest.mark.parametrize("mode", ["bwrap", "user", "none"])
def test_real_primerl_dry_run_and_env_server_in_the_jail(mode: str, bundles: dict[str, Any],
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        record_property: Any, passable_ancestors: Any) -> None:
    from gpu.primerl_executor import PrimeRLExecutor

    cfg = _jail(mode)
    jail = TrainingJail(cfg)
    rl = PRIME_RL / ".venv" / "bin" / "rl"
    python = PRIME_RL / ".venv" / "bin" / "python"
    if mode == "user":   # every folder above the install must let the training uid pass
        passable_ancestors(program_paths(python))
        try:
            jail.prepare([], None, readable=program_paths(python))
        except RuntimeError as exc:
            pytest.skip(f"user mode cannot reach the install: {exc}")
    monkeypatch.setenv(JAIL_ENV, cfg.model_dump_json())
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    settings = BackendSettings(name="gpu", models=[ModelInfo(name=MODEL)], bounds=BackendBounds(),
                               options={"primerl_cmd": [str(rl)], "gpus": [0], "dry_run": True,
                                        "colocated_gpu_memory_utilization": 0.3, "kill_grace_s": 2.0})
    t0 = time.monotonic()
    lines: list[str] = []
    for family, bundle in bundles.items():
        out = bundle.root / "outputs"
        ex = PrimeRLExecutor(bundle, settings, log=lines.append, progress=False)   # runs the dry run
        try:
            assert (out / "configs" / "orchestrator.toml").is_file(), (family, lines[-5:])
            assert f"training jail {mode}" in "\n".join(lines)
        finally:
            ex.close()
    dry_s = time.monotonic() - t0
    # the env servers, as prime-rl's orchestrator starts them, in the same jail
    home = Path(next(iter(bundles.values())).root).parent / f"home-{mode}"
    report = home / "report.json"
    outs = [str(b.root / "outputs") for b in bundles.values()]
    env = {"PYTHONPATH": os.pathsep.join(str(b.root / "src") for b in bundles.values()),
           "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "PATH": f"{python.parent}:/usr/bin:/bin"}
    t1 = time.monotonic()
    proc = jail.popen([str(python), str(PROBE), str(report), *outs], home=home,
                      writable=[str(b.root / "outputs") for b in bundles.values()],
                      readable=[*program_paths(python), str(PROBE.parent),
                                *[str(b.root) for b in bundles.values()]],
                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        log = proc.communicate(timeout=1500)[0].decode(errors="replace")
    finally:
        assert not jail.reap()
    env_s = time.monotonic() - t1
    record_property("dry_run_seconds", round(dry_s, 1))
    record_property("env_server_seconds", round(env_s, 1))
    print(f"\n[{mode}] {len(bundles)} dry runs in {dry_s:.0f} s; {len(bundles)} env servers in {env_s:.0f} s")
    assert report.is_file(), log[-3000:]
    data = json.loads(report.read_text())
    assert data["localhost"] == ["127.0.0.1"] and data["mp_queue"] == "ok", data
    for family, bundle in bundles.items():
        got = data["envs"][str(bundle.root / "outputs")]
        assert got.get("num_tasks", 0) > 0 and got["env_name"] == family, (family, got, log[-2000:])
