"""The ``gpu`` backend's trainer executor: the bundle's ``rl.toml`` trained by prime-rl v0.7.0, scored
by vLLM.

It implements :class:`ait_env.runner.TrainerExecutor` (the runner owns the phases). Every prime-rl fact
below was read at tag v0.7.0 (commit d334ea52940b47f426293a7d146239e3fbf91caa); paths are in that
repository.

- **Command**: ``<primerl_cmd> @ <bundle>/rl.toml --output-dir <bundle>/outputs [flags]``; ``primerl_cmd``
  defaults to ``rl``, the console script ``rl = prime_rl.entrypoints.rl:main`` (``pyproject.toml``
  ``[project.scripts]``), e.g. ``uv run --no-sync rl`` in a prime-rl checkout. The ``@`` takes a space
  before the file, later CLI flags win, kebab-case on the CLI (``docs/configuration.md``). The launcher
  starts ``inference``, ``orchestrator`` and ``torchrun`` **by name** (``src/prime_rl/entrypoints/rl.py``),
  so the folder of a ``primerl_cmd`` given as a path goes first on ``PATH``.
- **Dry run first**: the same command with ``--dry-run`` validates the config and writes the resolved
  ``<output_dir>/configs/{trainer,orchestrator,inference}.toml`` and launches nothing (``rl.py``
  ``rl_local``); it runs when the executor is built, before any vLLM starts. A refusal is
  ``InfraFailed``: the job passed our own rules (:mod:`ait_env.jobs.primerl`), so the gap is ours.
- **GPUs** (``rl.py`` ``rl_local``): the launcher reads ``CUDA_VISIBLE_DEVICES`` as a list of integers,
  gives inference the first ``deployment.num_infer_gpus`` entries and the trainer the next
  ``num_train_gpus`` (default 1 + 1: ``packages/prime-rl-configs/src/prime_rl/configs/rl.py``
  ``SingleNodeDeploymentConfig``), and passes each child only its own entries. Two GPUs: we set
  ``CUDA_VISIBLE_DEVICES=<g0>,<g1>``. **One GPU** (the 1 + 1 default, "shared" mode):
  ``CUDA_VISIBLE_DEVICES=<g>,<g>``, so both children run on that GPU, and
  ``--inference.gpu-memory-utilization <share>`` (:mod:`gpu.gpu_share`: model size x GPU memory, unmeasured)
  so vLLM leaves the rest to the trainer. Always ``--weight-broadcast.type filesystem``: NCCL, the default
  with an inference server (``RLConfig.auto_setup_weight_broadcast``), needs two devices and v0.7.0's own
  CI turns it off on two ("crashes the trainer on CI GPU runners":
  ``configs/ci/integration/reverse_text/start.toml``); and ``--inference.model.max-model-len <seq_len>``
  (unset, vLLM takes the model's own 40,960 tokens for Qwen3 and may not fit its share).
  The hidden-eval vLLM runs on the inference GPU and is stopped before training starts.
- **The job's environment**: prime-rl imports it by its env id (verifiers 0.2.0's ``load_environment``,
  ``verifiers/utils/env_utils.py``), so ``<bundle>/src`` is the children's ``PYTHONPATH``. Children get a
  scrubbed environment: :data:`PASS_ENV` from ours, ``options.env``, and nothing else (no API keys,
  no ``AIT_SECRETS_FILE``); ``WANDB_MODE=disabled`` (the rl.toml has no ``[wandb]``).
- **Logs**: prime-rl writes ``<output_dir>/logs/{orchestrator,trainer,inference}.log`` and
  ``logs/envs/{train,eval}/<name>.log`` (``rl.py``, ``src/prime_rl/utils/pathing.py`` ``get_log_dir``,
  ``src/prime_rl/orchestrator/envs.py``); the launcher's own output goes to ``<bundle>/logs/
  rl-launcher.log``. All of them stream into the runner's log (and so ``log_tail``), ANSI codes removed;
  vLLM's info lines stay in ``inference.log`` and the launcher's copy of the orchestrator log is skipped.
- **Curves**: per step, from the orchestrator's and trainer's step lines (:mod:`gpu.primerl_logs`).
- **No eval points during training**: the only server of the policy while prime-rl runs is its own
  inference server, which runs in the training jail next to the orchestrator that imports the agent's
  environment (and, in a ``bwrap`` jail, in a network namespace the runner cannot reach). A hidden
  question sent there would enter the training tree, so the runner's ``eval_point`` is never called; the
  curves are prime-rl's own per-step lines, and the hidden eval scores the base and the final weights
  only, each from a vLLM started outside the jail (before training, and after the worker's guard has
  killed everything training left: ``gpu/worker.py``).
- **The training jail** (:class:`gpu.isolation.TrainingJail`, the worker's choice in
  ``$AIT_TRAINING_JAIL``, else the strongest this machine allows): the dry run and the run start inside
  it, reading the bundle, prime-rl's venv, the model folders and ``options.readable``; writing
  ``<bundle>/outputs`` and ``<bundle>/home`` (``HOME``, caches) only. The models must be on disk
  (``HF_HUB_CACHE`` / ``model_paths``): a ``bwrap`` jail has no network.
- **Final weights**: HF safetensors + config + tokenizer in ``<output_dir>/weights/step_<max_steps>/``
  with a ``STABLE`` file once complete (``src/prime_rl/trainer/ckpt.py`` ``WeightCheckpointManager``;
  :func:`ait_env.jobs.primerl.final_weights_dir`); the post eval serves that folder with vLLM.
- **Wall clock**: ``bounds.wall_clock_minutes`` from the launch of the training run; past it the run is
  stopped: ``JobFailed`` when training had made steps (too slow for its bounds), ``InfraFailed`` when
  it made none and no log names a fault of the job.
- **Failures**: the job's own (``JobFailed``, in the agent's terms): its environment fails to import or
  load (any traceback in an env server's log before the first training step: the orchestrator would wait
  for that server without end, ``src/prime_rl/orchestrator/envs.py`` ``Env.start``; the run is stopped
  within seconds, :func:`gpu.primerl_logs.env_start_failure`), a non-finite loss or mean reward, the
  trainer's CUDA OOM on a GPU of its own, no trainable rollout for 10 steps in a row, too slow for the wall
  clock. A trainer OOM in shared mode on a job within the backend's bounds is ours (the share was). Everything else (no GPU, prime-rl or vLLM missing or refusing, a crash with
  no job cause, a killed process, no weights) is ``InfraFailed`` with what to fix.
- **Processes**: every command runs as a :class:`ait_env.processes.ProcessTree` (own session, tagged
  environment), killed on every exit path, including the torchrun ranks that leave the session.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import Field

from ait_env.jobs.settings import BackendSettings
from ait_env.jobs.bundle import JobBundle
from ait_env.jobs.primerl import PRIME_RL_TAG, final_weights_dir
from ait_env.runner import InfraFailed, Log, Served, Trained
from ait_env.jobs.settings import RunnerSettings
from gpu.gpu_plan import plan_gpus, visible_gpus
from gpu.gpu_share import colocated_kv_cache_bytes, colocated_share, gpu_memory_gib
from gpu.isolation import TrainingJail
from gpu.primerl_verdicts import _Verdicts
from gpu.primerl_watch import _RunWatch
from gpu.primerl_logs import clean
from ait_env.processes import TAG_VAR, ProcessTree
from gpu.selfcheck import prime_rl_dir
from gpu.venv_paths import program_paths
from gpu.vllm_server import VllmServer, tool_call_parser_for

#: variables passed from the worker's environment to prime-rl and vLLM (nothing else is: no keys)
PASS_ENV = ("PATH", "HOME", "USER", "LANG", "LC_ALL", "TZ", "TMPDIR", "HF_HOME", "HF_HUB_CACHE",
            "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "XDG_CACHE_HOME",
            "TRITON_CACHE_DIR", "CUDA_HOME", "LD_LIBRARY_PATH", "NVIDIA_VISIBLE_DEVICES",
            "NVIDIA_DRIVER_CAPABILITIES", "UV_CACHE_DIR", "UV_PYTHON_INSTALL_DIR")

#: prime-rl v0.7.0 defaults used when the dry run's resolved configs are unavailable
COLOCATED_FALLBACK = 0.3      # vLLM's share of a shared GPU when gpu.gpu_share has no rule for the case


class GpuOptions(RunnerSettings):
    """``options`` of the ``gpu`` backends' executor (and the runner's own knobs); unknown keys are
    refused."""

    #: prime-rl's launcher: default its venv's ``rl`` ($AIT_PRIME_RL_DIR, /opt/prime-rl on the image), else
    #: ``rl`` on PATH; e.g. ["uv", "run", "--no-sync", "rl"] with primerl_dir
    primerl_cmd: list[str] = Field(default_factory=lambda: _venv_program("rl"))
    primerl_dir: str | None = None          # working folder of primerl_cmd (a prime-rl checkout for uv run)
    vllm_cmd: list[str] = Field(default_factory=lambda: _venv_program("vllm"))  # prime-rl's locked vLLM
    #: more folders the training jail may read (a prime-rl checkout outside its venv, a model volume)
    readable: list[str] = Field(default_factory=list)
    gpus: list[int] | None = None           # physical GPU ids; None: CUDA_VISIBLE_DEVICES, else nvidia-smi's
    model_paths: dict[str, str] = Field(default_factory=dict)  # model id -> local HF folder (eval vLLM)
    env: dict[str, str] = Field(default_factory=dict)          # extra variables for prime-rl and vLLM
    dry_run: bool = True                    # prime-rl's own --dry-run before anything starts
    #: one GPU: vLLM's share of it while the trainer runs next to it; None: by gpu.gpu_share's rule (model
    #: size x GPU memory), else COLOCATED_FALLBACK when the model or the GPU memory is unknown
    colocated_gpu_memory_utilization: float | None = Field(None, gt=0, lt=1)
    eval_gpu_memory_utilization: float = Field(0.85, gt=0, le=1)
    eval_max_model_len: int = 8192
    eval_enforce_eager: bool = False
    vllm_startup_timeout_s: float = 900.0
    dry_run_timeout_s: float = 600.0
    #: an env server that prime-rl started (its log under logs/envs/) and that the orchestrator does not
    #: report ready (``Env <name> ready``) within this many seconds ended the job ``job_failed``: it exited,
    #: was killed, called sys.exit / os._exit or hangs at import or in load_environment (prime-rl waits
    #: 600 s for it, then without end)
    env_ready_timeout_s: float = Field(90.0, gt=0)
    #: prime-rl's policy server port (default 8000): set it when jobs share a network (no bwrap jail)
    policy_port: int | None = None
    kill_grace_s: float = 20.0              # SIGTERM -> SIGKILL
    poll_s: float = 0.5
    wall_clock_s: float | None = None       # tests only: overrides bounds.wall_clock_minutes


def _venv_program(name: str) -> list[str]:
    """``name`` from prime-rl's venv when one is installed (the image's), else ``name`` on PATH."""
    path = prime_rl_dir() / ".venv" / "bin" / name
    return [str(path)] if path.exists() else [name]


def program_roots(program: str, path: str) -> list[str]:
    """The folders a jailed ``program`` (a name on ``path`` or a file) needs to start: its venv or prefix,
    the prefix of the Python the venv points to, and the venv's editable installs (prime-rl's lock
    installs prime-rl, its configs package, verifiers, renderers and pydantic-config editable:
    :func:`gpu.venv_paths.program_paths`)."""
    return program_paths(program, path=path)


# ----------------------------------------------------------------------------- weights identity

_HASHES: dict[tuple[str, tuple[tuple[str, int, int], ...]], str] = {}


def dir_hash(path: Path) -> str:
    """sha256 (16 hex) of a weights folder's files, names and bytes (``STABLE`` and logs left out)."""
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.name != "STABLE" and p.suffix != ".log")
    key = (str(path), tuple((p.relative_to(path).as_posix(), p.stat().st_size, p.stat().st_mtime_ns)
                            for p in files))
    if key not in _HASHES:
        h = hashlib.sha256()
        for p in files:
            h.update(p.relative_to(path).as_posix().encode() + b"\0")
            with open(p, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 22), b""):
                    h.update(chunk)
        _HASHES[key] = h.hexdigest()[:16]
    return _HASHES[key]


def hf_revision(model: str, env: dict[str, str]) -> str:
    """``hf:<commit>`` of a hub model in the Hugging Face cache (``refs/main``), or "" when not cached."""
    hub = env.get("HF_HUB_CACHE") or (str(Path(env["HF_HOME"]) / "hub") if env.get("HF_HOME") else "")
    root = Path(hub) if hub else Path(env.get("HOME", str(Path.home()))) / ".cache" / "huggingface" / "hub"
    ref = root / f"models--{model.replace('/', '--')}" / "refs" / "main"
    try:
        return "hf:" + ref.read_text().strip()
    except OSError:
        return ""


# ----------------------------------------------------------------------------- the executor

class PrimeRLExecutor(_Verdicts):
    """See the module docstring. Built by the runner per job; :meth:`close` stops everything it started."""

    def __init__(self, bundle: JobBundle, backend: BackendSettings, log: Log, progress: bool = True) -> None:
        self.bundle = bundle
        self.backend = backend
        self.opts = GpuOptions.model_validate(backend.options)
        self.log = log
        self.progress = progress
        self.job = bundle.job
        self.model_name = self.job.job.base_model
        self.rl_toml = bundle.root.resolve() / "rl.toml"
        if not self.rl_toml.is_file():
            why = bundle.manifest.extra.get("rl_toml", "missing")
            raise InfraFailed(f"the bundle has no rendered rl.toml ({why})")
        self.cfg = tomllib.loads(self.rl_toml.read_text(encoding="utf-8"))
        self.out = bundle.root.resolve() / "outputs"
        self.logs = bundle.root.resolve() / "logs"
        self.logs.mkdir(exist_ok=True)
        self.home = bundle.root.resolve() / "home"     # the training tree's HOME and caches
        self.jail = TrainingJail.from_env()
        if self.out.exists():  # an earlier attempt's; prime-rl refuses a folder with checkpoints (pathing.py)
            shutil.rmtree(self.out)
            log(f"removed {self.out} of an earlier attempt")
        dep = self.cfg.get("deployment") or {}
        self.num_infer = int(dep.get("num_infer_gpus", 1)) if "inference" in self.cfg else 0
        gpus = visible_gpus(self.opts.gpus)
        self.plan = plan_gpus(gpus, self.num_infer, int(dep.get("num_train_gpus", 1)),
                              self.colocated_share(gpus[0] if gpus else None),
                              colocated_kv_cache_bytes(self.model_name, self.job.prime_rl.seq_len))
        self.flags = ["--output-dir", str(self.out), *self.plan.flags]
        if self.num_infer:
            self.flags += ["--inference.model.max-model-len", str(self.job.prime_rl.seq_len)]
        if self.opts.policy_port:
            port = self.opts.policy_port
            self.flags += ["--inference.server.port", str(port),
                           "--orchestrator.model.client.base-url", f"http://localhost:{port}/v1"]
        self.eval_server: VllmServer | None = None
        self.eval_label = ""
        self.run_tree: ProcessTree | None = None
        self.wall_s = 0.0
        self.weights: Path | None = None
        self.timings: dict[str, float] = {"on_gpu": 1.0, "colocated": float(self.plan.colocated),
                                          "gpus": float(len(set(self.plan.visible.split(","))))}
        log(f"prime-rl {PRIME_RL_TAG} on {self.plan.describe()}; {self.jail.config.describe()}")
        if self.opts.dry_run:
            self._dry_run()

    def colocated_share(self, gpu: int | None) -> float:
        """vLLM's share of a GPU it shares with the trainer: the option, else :mod:`gpu.gpu_share`'s rule,
        else :data:`COLOCATED_FALLBACK`."""
        if self.opts.colocated_gpu_memory_utilization is not None:
            return self.opts.colocated_gpu_memory_utilization
        gib = gpu_memory_gib(gpu) if gpu is not None else None
        share = colocated_share(self.model_name, self.job.prime_rl.seq_len, gib)
        return COLOCATED_FALLBACK if share is None else share

    # ------------------------------------------------------------------ environment and commands
    def child_env(self, **extra: str) -> dict[str, str]:
        """The scrubbed environment of prime-rl's and vLLM's processes (module docstring)."""
        env = {k: os.environ[k] for k in PASS_ENV if k in os.environ}
        env.update(WANDB_MODE="disabled", PYTHONUNBUFFERED="1",
                   PYTHONPATH=str(self.bundle.root.resolve() / "src"))
        env.update(self.opts.env)
        env.update(extra)
        bins = [str(Path(cmd[0]).resolve().parent) for cmd in (self.opts.primerl_cmd, self.opts.vllm_cmd)
                if "/" in cmd[0]]
        env["PATH"] = os.pathsep.join([*bins, env.get("PATH", os.defpath)])
        return env

    def primerl_command(self, *extra: str) -> list[str]:
        return [*self.opts.primerl_cmd, "@", str(self.rl_toml), *self.flags, *extra]

    def jail_paths(self, env: dict[str, str]) -> tuple[list[str], list[str]]:
        """(readable, writable) folders of the training tree (module docstring)."""
        root = self.bundle.root.resolve()
        cache = [env[k] for k in ("HF_HUB_CACHE", "HF_HOME") if env.get(k)]
        readable = [str(root), *program_roots(self.opts.primerl_cmd[0], env["PATH"]),
                    *[a for a in self.opts.primerl_cmd[1:] if a.startswith("/")],
                    *([self.opts.primerl_dir] if self.opts.primerl_dir else []),
                    *self.opts.model_paths.values(), *cache, *self.opts.readable]
        return list(dict.fromkeys(readable)), [str(self.out)]

    def _start_primerl(self, cmd: list[str], log_path: Path) -> ProcessTree:
        """Start ``cmd`` (prime-rl's launcher) in the training jail, its output appended to ``log_path``."""
        tree = ProcessTree(grace_s=self.opts.kill_grace_s)
        env = {**self.child_env(CUDA_VISIBLE_DEVICES=self.plan.visible), **self.jail.env(self.home, base={}),
               TAG_VAR: tree.tag}   # the tag travels inside the jail (bwrap clears the environment)
        found = Path(cmd[0]).exists() if "/" in cmd[0] else shutil.which(cmd[0], path=env["PATH"]) is not None
        if not found:
            raise InfraFailed(f"prime-rl's command {cmd[0]!r} was not found: install prime-rl "
                              f"{PRIME_RL_TAG} (gpu/README.md), set AIT_PRIME_RL_DIR to its checkout, or "
                              "set backend.options.primerl_cmd (e.g. uv run --no-sync rl, with primerl_dir)")
        readable, writable = self.jail_paths(env)
        cwd = self.opts.primerl_dir or str(self.bundle.root.resolve())
        try:
            self.jail.prepare(writable, self.home, readable)
        except RuntimeError as exc:
            raise InfraFailed(f"the training jail cannot be set up: {exc}") from None
        argv = self.jail.command(cmd, writable=[*writable, str(self.home)], readable=readable, cwd=cwd,
                                 env=env)
        with open(log_path, "ab") as f:
            try:
                tree.start(argv, env=env, cwd=cwd, stdout=f)
            except FileNotFoundError as exc:
                raise InfraFailed(f"{exc.filename or argv[0]!r} was not found: install it or set "
                                  "backend.options.primerl_cmd") from None
        return tree

    def _dry_run(self) -> None:
        cmd = self.primerl_command("--dry-run")
        log_path = self.logs / "rl-dry-run.log"
        self.log(f"prime-rl dry run: {shlex.join(cmd)}")
        t0 = time.time()
        tree = self._start_primerl(cmd, log_path)
        try:
            assert tree.proc is not None
            rc = tree.proc.wait(timeout=self.opts.dry_run_timeout_s)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            tree.kill()
        self.timings["primerl_dry_run"] = round(time.time() - t0, 2)
        tail = "\n".join(clean(x) for x in log_path.read_text(errors="replace").splitlines()[-25:])
        if rc != 0:
            why = (f"exited with code {rc}" if rc is not None
                   else f"took over {self.opts.dry_run_timeout_s:.0f} s")
            raise InfraFailed(f"prime-rl {PRIME_RL_TAG}'s --dry-run {why} on the rendered rl.toml, "
                              "which passed our own rules (ait_env/jobs/primerl.py: a rule is missing "
                              f"there, or prime-rl is not installed as pinned):\n{tail}")
        self.log(f"prime-rl dry run passed ({self.timings['primerl_dry_run']:.0f} s)")

    # ------------------------------------------------------------------ serving for the hidden eval
    def _vllm(self, model: str, label: str, weights: Path | None = None) -> VllmServer:
        """An eval vLLM serving ``model`` (from ``weights``, else its ``model_paths`` folder, else the hub)
        on the inference GPU, with the job's thinking mode when its rl.toml sets one (the training
        renderer's)."""
        renderer = (self.cfg.get("orchestrator") or {}).get("renderer") or {}
        thinking = {"enable_thinking": renderer["enable_thinking"]} if "enable_thinking" in renderer else None
        server = VllmServer(
            weights or self.opts.model_paths.get(model, model), served_model_name=model,
            env=self.child_env(CUDA_VISIBLE_DEVICES=str(self.plan.eval_gpu)),
            log_path=self.logs / f"vllm-{label}.log", max_model_len=self.opts.eval_max_model_len,
            gpu_memory_utilization=self.opts.eval_gpu_memory_utilization,
            tool_call_parser=tool_call_parser_for(model), chat_template_kwargs=thinking,
            enforce_eager=self.opts.eval_enforce_eager, vllm_cmd=self.opts.vllm_cmd,
            startup_timeout_s=self.opts.vllm_startup_timeout_s, kill_grace_s=self.opts.kill_grace_s)
        self.log(f"vLLM ({label}): {shlex.join(server.command)}")
        return server

    def _serve(self, server: VllmServer, label: str) -> Served:
        """Keep one eval vLLM at a time: vLLM takes its share of the whole GPU (module docstring)."""
        self._stop_eval_server()
        t0 = time.time()
        self.eval_server, self.eval_label = server, label
        served = server.start()
        self.timings[f"vllm_start_{label}"] = round(time.time() - t0, 2)
        return served

    def _stop_eval_server(self) -> None:
        server, self.eval_server, self.eval_label = self.eval_server, None, ""
        if server is not None:
            server.stop()

    # ------------------------------------------------------------------ TrainerExecutor
    def weights_hash(self, model: str) -> str:
        path = self.opts.model_paths.get(model)
        if path:
            return dir_hash(Path(path))
        return hf_revision(model, {**os.environ, **self.opts.env})

    def serve_base(self) -> Served:
        if self.eval_label == "base" and self.eval_server is not None:
            return self.eval_server.served
        return self._serve(self._vllm(self.model_name, "base"), "base")

    def measure_base(self, model: str, evaluate: Callable[[Served], Any]) -> Any:
        label = "base-" + model.replace("/", "--")
        try:
            return evaluate(self._serve(self._vllm(model, label), label))
        finally:
            self._stop_eval_server()

    def serve_trained(self) -> Served:
        if self.weights is None:
            raise InfraFailed("serve_trained before a successful train()")
        if self.eval_label == "trained" and self.eval_server is not None:
            return self.eval_server.served
        return self._serve(self._vllm(self.model_name, "trained", self.weights), "trained")

    def train(self, eval_point: Callable[[int], float | None]) -> Trained:
        self._stop_eval_server()   # vLLM refuses to start on a GPU another vLLM holds (module docstring)
        job = self.job.prime_rl
        wall = self.opts.wall_clock_s or self.backend.bounds.wall_clock_minutes * 60.0
        cmd = self.primerl_command()
        launcher_log = self.logs / "rl-launcher.log"
        self.log(f"prime-rl: {shlex.join(cmd)} (CUDA_VISIBLE_DEVICES={self.plan.visible}; "
                 f"wall clock {wall:.0f} s)")
        t0, m0 = time.time(), time.monotonic()
        self.wall_s = wall
        tree = self.run_tree = self._start_primerl(cmd, launcher_log)
        watch = _RunWatch(self, tree, launcher_log, m0 + wall)
        if self.opts.eval_every:
            self.log("no eval points during training on the gpu executor: the policy server runs in the "
                     "training jail, and hidden questions never enter it (the hidden eval scores the base "
                     "and the final weights)")
        watch.start()
        try:
            watch.finished.wait()
        finally:
            watch.join()
            tree.kill()
        train_seconds = time.time() - t0
        if watch.first_step_at is not None:
            self.timings["primerl_first_step"] = round(watch.first_step_at - m0, 2)
        if watch.verdict is not None:
            raise watch.verdict
        rc = tree.poll()
        if rc != 0:
            raise self.exit_failure(rc, watch)
        weights = final_weights_dir(self.job, self.out)
        if not (weights / "STABLE").is_file():
            raise InfraFailed(f"prime-rl finished but wrote no complete weights at {weights} (no STABLE "
                              "file): is [ckpt] on in the rendered rl.toml?")
        # what the model was given in training, outside the jail: hidden questions, the family's tools
        from gpu.primerl_traces import audit_traces

        audit_traces(self.out, self.bundle.manifest.family, self.log)
        self.weights = weights
        curves = watch.curves(job.max_steps)
        tps = curves.get("train_tokens_per_s") or []
        if tps:
            self.timings["train_tokens_per_s"] = round(sum(tps) / len(tps), 1)
        return Trained(train_seconds=train_seconds, curves=curves, timings=dict(self.timings),
                       weights=weights)

    def close(self) -> None:
        try:
            self._stop_eval_server()
        finally:
            if self.run_tree is not None:
                self.run_tree.kill()
            self.jail.cleanup()

    # ------------------------------------------------------------------ failures, in the agent's terms






