"""A fake prime-rl v0.7.0 ``rl`` launcher that follows the contracts read in its source (the facts are cited
in ``gpu/primerl_executor.py`` and ``gpu/primerl_logs.py``; nothing here is prime-rl's code).

    python fake_rl.py @ rl.toml [--output-dir D] [--dry-run] [--weight-broadcast.type T]
        [--inference.gpu-memory-utilization F] [--inference.server.port P]
        [--orchestrator.model.client.base-url URL]

- CLI: ``@ file`` (a space after ``@``; ``@file`` is refused), later flags win, kebab-case keys, bare
  booleans; any other flag is a config error (exit 1).
- ``--dry-run``: writes ``<out>/configs/{trainer,orchestrator,inference}.toml`` and exits 0, launching
  nothing.
- Run: reads ``CUDA_VISIBLE_DEVICES`` as integers, inference on the first ``num_infer_gpus`` entries, the
  trainer on the next ones (too few: exit 1); starts an inference process (``logs/inference.log``), an
  orchestrator (``logs/orchestrator.log``) that starts an env server which imports the job's package
  and calls verifiers' real ``load_environment`` (``logs/envs/train/<name>.log``), and a trainer
  "torchrun" whose rank runs in a new session (``logs/trainer.log``, lines prefixed ``[trainer0]:``).
  Step lines have the formats of the orchestrator's ``log_train_batch`` and the trainer's step message.
  At the end the trainer writes ``<out>/weights/step_<max_steps>/`` (the base micro model perturbed, saved
  as HF files with its tokenizer) and ``STABLE``; the launcher prints ``Training finished!`` and exits 0.
  A child failing makes the launcher stop the others and exit 1; SIGTERM makes it do the same.
- Mirrors of what goes wrong on a real GPU: both children on one GPU with the NCCL broadcast fail in
  the trainer ("Duplicate GPU detected"); the colocated vLLM asking for more than half the GPU fails
  ("less than desired GPU memory utilization").

``FAKE_PRIMERL_SCENARIO``: ``success``; ``nan_loss`` / ``nan_reward`` (step 2 logs nan and the run goes
on, as prime-rl has no guard); ``oom`` (the trainer dies with torch's CUDA OOM at step 2); ``empty_batches``
(the orchestrator gives up after 10 empty batches); ``hang`` (the trainer rank ignores SIGTERM and stops
after step 1); ``stall`` (the policy server never gets ready, so no step is made); ``killed`` (the
launcher is SIGKILLed after step 1, its children orphaned); ``bad_config`` (the config is refused, dry
run included); ``rollout_error`` (the env server logs one rollout's traceback after the first batch: the
run goes on). ``FAKE_INFERENCE_SERVE=1``: the inference process serves
the base micro model on ``inference.server.port`` (eval points during training); ``FAKE_STEP_SECONDS``:
the orchestrator's pause between steps.
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path
from typing import Any

try:   # installed like prime-rl: the package ait_fake_primerl, editable, in a venv of its own
    from .common import logline, models, scenario, serve_local, wait_forever

    SELF = [sys.executable, "-m", f"{__package__}.fake_rl"]
except ImportError:   # run as a script from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from tests.gpu.fakes.common import logline, models, scenario, serve_local, wait_forever

    SELF = [sys.executable, str(Path(__file__).resolve())]

VALUE_FLAGS = {"output-dir", "weight-broadcast.type", "inference.gpu-memory-utilization",
               "inference.server.port", "orchestrator.model.client.base-url"}
VALUE_FLAGS |= {"inference.model.max-model-len", "inference.vllm-extra"}
BOOL_FLAGS = {"dry-run", "clean-output-dir"}


def say(level: str, message: str) -> None:
    print(logline(level, message), flush=True)


def config_error(message: str) -> int:
    print(f"╭─ Config file error ─╮\n│ {message}\n╰─────────────────────╯", flush=True)
    return 1


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    for k, v in top.items():
        base[k] = _merge(base.get(k, {}), v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return base


def parse_cli(argv: list[str]) -> tuple[dict[str, Any], bool] | str:
    cfg: dict[str, Any] = {}
    dry = False
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "@":
            cfg = _merge(cfg, tomllib.loads(Path(argv[i + 1]).read_text()))
            i += 2
        elif tok.startswith("@"):
            return f"{tok!r}: mind the space, '@ path/to/x.toml'"
        elif tok.startswith("--") and tok[2:] in BOOL_FLAGS:
            if tok[2:] == "dry-run":
                dry = True
            i += 1
        elif tok.startswith("--") and tok[2:] in VALUE_FLAGS:
            keys = [k.replace("-", "_") for k in tok[2:].split(".")]
            value: Any = argv[i + 1]
            if keys[-1] == "gpu_memory_utilization":
                value = float(value)
            elif keys[-1] in ("port", "max_model_len"):
                value = int(value)
            elif keys[-1] == "vllm_extra":   # a JSON object, as prime-rl v0.7.0's CLI takes it (checked: its dry run)
                value = json.loads(value)
            elif keys[-1] == "base_url":
                value = [value]
            node = cfg
            for k in keys[:-1]:
                node = node.setdefault(k, {})
            node[keys[-1]] = value
            i += 2
        else:
            return f"unknown CLI flag {tok!r} (extra_forbidden)"
    return cfg, dry


def write_configs(cfg: dict[str, Any], out: Path) -> None:
    import tomli_w

    port = cfg.get("inference", {}).get("server", {}).get("port", 8000)
    name = cfg["model"]["name"]
    orch = {**cfg["orchestrator"], "output_dir": str(out / "run_default"), "max_steps": cfg["max_steps"],
            "model": {"name": name, "client": {"base_url": cfg.get("orchestrator", {}).get("model", {}).get(
                "client", {}).get("base_url", [f"http://localhost:{port}/v1"])}}}
    inference = {**cfg.get("inference", {}), "model": {"name": name}, "server": {"port": port}}
    (out / "configs").mkdir(parents=True, exist_ok=True)
    trainer_cfg = {**cfg.get("trainer", {}), "output_dir": str(out)}
    for fname, data in (("trainer", trainer_cfg), ("orchestrator", orch), ("inference", inference)):
        (out / "configs" / f"{fname}.toml").write_text(tomli_w.dumps(data))
    (out / ".fake").mkdir(exist_ok=True)
    (out / ".fake" / "config.json").write_text(json.dumps(cfg))


# ----------------------------------------------------------------------------- the launcher

def launcher(argv: list[str]) -> int:
    parsed = parse_cli(argv)
    if isinstance(parsed, str):
        return config_error(parsed)
    cfg, dry = parsed
    if scenario() == "bad_config":
        return config_error("orchestrator.batch_size: Value error, batch size must be divisible by group "
                            "size")
    out = Path(cfg.get("output_dir", "outputs")).resolve()
    cfg["output_dir"] = str(out)
    write_configs(cfg, out)
    say("INFO", f"Wrote subconfigs to {out / 'configs'}")
    if dry:
        say("SUCCESS", "Dry run complete. To start an RL run locally, remove --dry-run from your command.")
        return 0
    try:   # prime-rl's launcher gives torchrun --rdzv-endpoint=localhost:<port>
        socket.getaddrinfo("localhost", 29500)
    except OSError as exc:
        print(f"torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: localhost: {exc}",
              flush=True)
        return 1
    ids = [int(t) for t in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if t.strip()]
    dep = cfg.get("deployment", {})
    n_infer, n_train = dep.get("num_infer_gpus", 1), dep.get("num_train_gpus", 1)
    if n_infer + n_train > len(ids):
        print(f"ValueError: Requested {n_infer + n_train} GPUs via deployment settings, but only {len(ids)} "
              f"physical GPU(s) are available: {ids}", flush=True)
        return 1
    infer, train = ids[:n_infer], ids[n_infer:n_infer + n_train]
    shared = bool(set(infer) & set(train))
    broadcast = cfg.get("weight_broadcast", {}).get("type", "nccl")
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    children: dict[str, subprocess.Popen[bytes]] = {}

    def start(role: str, gpus: list[int], **env: str) -> None:
        with open(logs / f"{role}.log", "w") as f:
            visible = ",".join(map(str, gpus))
            children[role] = subprocess.Popen([*SELF, "--fake-role", role, str(out)], stdout=f, stderr=f,
                                              env={**os.environ, "CUDA_VISIBLE_DEVICES": visible, **env})

    def stop_all(*_: Any) -> None:
        for p in children.values():
            if p.poll() is None:
                p.terminate()
        for p in children.values():
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        os._exit(1)

    signal.signal(signal.SIGTERM, stop_all)
    say("INFO", f"Starting inference on GPU(s) {' '.join(map(str, infer))}")
    start("inference", infer, FAKE_SHARED_GPU="1" if shared else "0")
    say("INFO", "Starting orchestrator process")
    start("orchestrator", [])
    say("INFO", f"Starting trainer on GPU(s) {' '.join(map(str, train))}")
    start("trainer", train, FAKE_NCCL_DUPLICATE="1" if shared and broadcast == "nccl" else "0")
    say("SUCCESS", "Startup complete. Showing orchestrator logs...")
    threading.Thread(target=_echo, args=(logs / "orchestrator.log",), daemon=True).start()
    while True:
        for role, p in children.items():
            if p.poll() not in (None, 0):
                say("ERROR", f"Error: {role.capitalize()} failed with exit code {p.returncode}")
                say("ERROR", "Terminating all processes...")
                stop_all()
        if scenario() == "killed" and "Step 1 |" in (logs / "trainer.log").read_text(errors="replace"):
            os.kill(os.getpid(), signal.SIGKILL)
        if children["orchestrator"].poll() == 0 and children["trainer"].poll() == 0:
            break
        time.sleep(0.1)
    say("SUCCESS", "Training finished!")
    children["inference"].terminate()
    children["inference"].wait()
    return 0


def _echo(path: Path) -> None:
    """The launcher's ``tail -F`` of the orchestrator log."""
    pos = 0
    while True:
        data = path.read_bytes()[pos:]
        pos += len(data)
        sys.stdout.write(data.decode(errors="replace"))
        sys.stdout.flush()
        time.sleep(0.1)


# ----------------------------------------------------------------------------- the children

def inference(out: Path, cfg: dict[str, Any]) -> int:
    util = cfg.get("inference", {}).get("gpu_memory_utilization", 0.9)
    if os.environ.get("FAKE_SHARED_GPU") == "1" and util > 0.5:
        print(f"ValueError: Free memory on device cuda:0 (70.0/139.8 GiB) on startup is less than desired "
              f"GPU memory utilization ({util}, {139.8 * util:.2f} GiB).", flush=True)
        return 1
    print(f"INFO fake vLLM policy server (gpu_memory_utilization={util})", flush=True)
    if scenario() == "stall":
        wait_forever()  # never ready: the orchestrator waits for it
    if os.environ.get("FAKE_INFERENCE_SERVE") == "1":
        name = cfg["model"]["name"]
        port = cfg.get("inference", {}).get("server", {}).get("port", 8000)
        serve_local(models()[name], name, "127.0.0.1", port)
    (out / ".fake" / "inference_ready").touch()
    wait_forever()
    return 0


def orchestrator(out: Path, cfg: dict[str, Any]) -> int:
    """Starts its env server the way prime-rl's ``Env._spawn`` does: a ``spawn`` child whose output goes to
    the env log, reporting back over a ``multiprocessing`` queue (which needs a writable ``/dev/shm``)."""
    env = cfg["orchestrator"]["train"]["env"][0]
    name = env.get("name", env["id"])
    env_log = out / "logs" / "envs" / "train" / f"{name}.log"
    env_log.parent.mkdir(parents=True, exist_ok=True)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    server = ctx.Process(target=env_server_entry, args=(str(out), str(env_log), queue), daemon=False)
    server.start()
    num_tasks = queue.get()   # like prime-rl's elastic pool: no end to the wait for a server that died
    # prime-rl v0.7.0 orchestrator.py: the train envs start (Env.start logs "Env <name> ready"), then it
    # waits for its policy inference pool
    say("INFO", f"Env {name} ready: num_tasks={num_tasks} group_scoring=False")
    say("SUCCESS", "Train environment(s) ready")
    say("INFO", "Waiting for policy inference pool to be ready")
    while not (out / ".fake" / "inference_ready").exists():
        time.sleep(0.1)
    say("SUCCESS", "Policy inference pool ready")
    batch, group = cfg["orchestrator"]["batch_size"], cfg["orchestrator"]["group_size"]
    if scenario() == "rollout_error":   # the first batch's rollouts run (one raises) before a step is made
        (out / ".fake" / "rollouts").touch()
        while not (out / ".fake" / "rollout_error_logged").exists():
            time.sleep(0.05)
        time.sleep(3.0)
    for step in range(1, cfg["max_steps"] + 1):
        if scenario() == "empty_batches":
            for k in range(1, 11):
                say("WARNING", f"Step {step}: empty train batch (0 of {batch} generated rollouts shipped — "
                               f"all errored or filtered out) (consecutive empty batches: {k}/10)")
            raise RuntimeError("10 consecutive empty train batches — check filter config "
                               "(pre_batch_filters / post_batch_filters) or task difficulty.")
        if step > 1:
            time.sleep(float(os.environ.get("FAKE_STEP_SECONDS", "0")))
        reward = math.nan if scenario() == "nan_reward" and step == 2 else 0.2 + 0.1 * step
        (out / ".fake" / f"batch_{step}").touch()
        say("SUCCESS", f"Step {step} | {'0.3s':>7} | Reward {reward:.4f} | Trainable {batch - group}/{batch} "
                       f"({(batch - group) / batch:.1%}) | Turns 2.0 | Branches 1.0 | Max Off-Policy 0 | "
                       "Error 0.0% | Truncation 6.2%")
        while not (out / ".fake" / f"trained_{step}").exists():
            time.sleep(0.05)
    server.terminate()
    server.join()
    return 0


def env_server_entry(out: str, log_file: str, queue: Any) -> None:
    """The spawned env server: output to ``log_file`` (prime-rl's ``_run_env_server``), then serve."""
    fh = open(log_file, "w", buffering=1)
    os.dup2(fh.fileno(), sys.stdout.fileno())
    os.dup2(fh.fileno(), sys.stderr.fileno())
    os.environ.pop("FAKE_ROLE", None)
    env_server(Path(out), json.loads((Path(out) / ".fake" / "config.json").read_text()), queue)


def env_server(out: Path, cfg: dict[str, Any], queue: Any) -> int:
    import logging

    logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import verifiers

    env_cfg = cfg["orchestrator"]["train"]["env"][0]
    env = verifiers.load_environment(env_cfg["id"], **env_cfg.get("args", {}))
    print(f"INFO EnvServer up: taskset={env_cfg['id']}", flush=True)
    queue.put(len(env.get_dataset()))
    if scenario() == "rollout_error":   # one rollout raises once rollouts run; prime-rl logs it and goes on
        while not (out / ".fake" / "rollouts").exists():
            time.sleep(0.05)
        print("ERROR verifiers.v1.serve: rollout 3 failed\nTraceback (most recent call last):\n"
              '  File "/app/environment.py", line 80, in correct_answer\n'
              "ZeroDivisionError: division by zero", flush=True)
        (out / ".fake" / "rollout_error_logged").touch()
    wait_forever()
    return 0


def trainer(out: Path, cfg: dict[str, Any]) -> int:
    """torchrun: the rank runs in its own session (torch elastic's SubprocessHandler)."""
    rank = subprocess.Popen([*SELF, "--fake-role", "trainer_rank", str(out)], start_new_session=True)

    def close(*_: Any) -> None:
        try:
            os.killpg(rank.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        os._exit(1)

    signal.signal(signal.SIGTERM, close)
    return rank.wait()


def trainer_rank(out: Path, cfg: dict[str, Any]) -> int:
    def say0(level: str, message: str) -> None:
        print("[trainer0]:" + logline(level, message), flush=True)

    if os.environ.get("FAKE_NCCL_DUPLICATE") == "1":
        print("[trainer0]:torch.distributed.DistBackendError: NCCL error: invalid usage\n"
              "[trainer0]:Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 0", flush=True)
        return 1
    steps = cfg["max_steps"]
    for step in range(1, steps + 1):
        while not (out / ".fake" / f"batch_{step}").exists():
            time.sleep(0.05)
        if scenario() == "oom" and step == 2:
            print("[trainer0]:Traceback (most recent call last):\n"
                  "[trainer0]:  File \"train.py\", line 480, in train\n"
                  "[trainer0]:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 "
                  "has a total capacity of 139.80 GiB of which 1.25 GiB is free.", flush=True)
            return 1
        loss = math.nan if scenario() == "nan_loss" and step == 2 else 0.01 * step
        say0("SUCCESS", f"Step {step} | {'1.2s':>7} | Loss {loss:.4f} | Entropy 0.6931 | Mismatch KL "
                        "0.0002 | Grad. Norm 0.1234 | LR 3.00e-06 | Throughput 1234 tokens/s | MFU 1.5% | "
                        "Peak Mem. 2.3 GiB")
        if scenario() == "hang" and step == 1:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            wait_forever()
        (out / ".fake" / f"trained_{step}").touch()
    say0("INFO", "Writing final weight checkpoint")
    save_perturbed(cfg["model"]["name"], out / "weights" / f"step_{steps}")
    say0("SUCCESS", "RL trainer finished!")
    return 0


def save_perturbed(model: str, dst: Path) -> None:
    """The base micro model with every weight moved a little: servable HF files + tokenizer + STABLE."""
    import torch

    from cpu.tiny_models.model import TinyLM
    from cpu.tiny_models.tokenizer import ChatTokenizer

    src = models()[model]
    m = TinyLM.load(src)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.02)
    m.save(dst)
    ChatTokenizer.load(src).save(dst, model_max_length=m.cfg.max_position_embeddings)
    (dst / "STABLE").touch()


ROLES = {"inference": inference, "orchestrator": orchestrator, "trainer": trainer, "trainer_rank": trainer_rank}


def main() -> int:
    """The ``rl`` console script of the installed fake (and the script's entry)."""
    if sys.argv[1:2] == ["--fake-role"]:
        out_dir = Path(sys.argv[3])
        return ROLES[sys.argv[2]](out_dir, json.loads((out_dir / ".fake" / "config.json").read_text()))
    return launcher(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
