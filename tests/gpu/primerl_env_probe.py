"""Run with prime-rl v0.7.0's own interpreter, inside a training jail, by the slow real-prime-rl test
(``tests/gpu/test_gpu_real_primerl.py``):

    <prime-rl venv>/bin/python primerl_env_probe.py <report.json> <output_dir of a dry run>...

It starts the job's train env server exactly as prime-rl's orchestrator does (``src/prime_rl/orchestrator/
envs.py`` ``Env.start``: a ``spawn`` child running verifiers' ``serve_env`` with the legacy bridge, its
address reported over a ``multiprocessing`` queue, then ``EnvClient.info()``), from the resolved
``configs/orchestrator.toml`` the dry run wrote, and records what the jail allows: whether ``localhost``
resolves (prime-rl's ``--rdzv-endpoint`` and the orchestrator's ``base_url`` use it), whether a
``multiprocessing`` queue works (semaphores in ``/dev/shm``), and the env server's ``num_tasks``. This file
is test plumbing written for this project; it imports prime-rl, it contains none of its code.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import socket
import sys
import tomllib
import traceback
from pathlib import Path


def _queue_roundtrip() -> str:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    q.put("ok")
    value = q.get(timeout=30)
    q.close()
    q.join_thread()
    return value


async def _load_env(out_dir: Path) -> dict:
    from prime_rl.configs.orchestrator import TrainEnvConfig
    from prime_rl.orchestrator.envs import Env

    cfg = tomllib.loads((out_dir / "configs" / "orchestrator.toml").read_text())
    env_cfg = TrainEnvConfig.model_validate(cfg["train"]["env"][0])
    env = Env(env_cfg)
    try:
        await asyncio.wait_for(env.start(out_dir / "logs" / "envs" / "train"), timeout=240)
        return {"num_tasks": env.num_tasks, "env_name": env.name}
    finally:
        env.shutdown()


async def _load_all(out_dirs: list[Path], report: dict) -> None:
    for out_dir in out_dirs:
        try:
            report["envs"][str(out_dir)] = await _load_env(out_dir)
        except BaseException as exc:  # noqa: BLE001 - the report says what failed
            report["envs"][str(out_dir)] = {"error": "".join(traceback.format_exception(exc))[-3000:]}


def main() -> int:
    report_path, out_dirs = Path(sys.argv[1]), [Path(a) for a in sys.argv[2:]]
    report: dict = {"envs": {}}
    for name, check in (("localhost", lambda: sorted({a[4][0] for a in socket.getaddrinfo("localhost", 80)})),
                        ("mp_queue", _queue_roundtrip)):
        try:
            report[name] = check()
        except Exception as exc:  # noqa: BLE001 - the report says what failed
            report[name] = f"FAILED: {type(exc).__name__}: {exc}"
    asyncio.run(_load_all(out_dirs, report))
    report_path.write_text(json.dumps(report))
    return 0 if all("num_tasks" in r for r in report["envs"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
