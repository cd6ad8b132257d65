"""The ``local`` backend's trainer executor: GRPO of the project's tiny models on this machine.

It implements :class:`ait_env.runner.TrainerExecutor` for the generic runner:

- the job's base model (a built catalog model; a missing one is :class:`~ait_env.runner.InfraFailed`
  naming ``python -m cpu.tiny_models.build``, never a build inside a job) is served by a
  :class:`~cpu.tiny_models.endpoint.LocalEndpoint` on loopback TCP (the hidden-eval harness's base URL,
  as vLLM's would be) and on a Unix socket inside a sandbox request folder;
- training: the agent's environment runs as the sandbox job ``rollout_worker``
  (:mod:`cpu.rollout_worker`: verifiers' own rollouts and rubric) whose only network is that
  socket; :class:`~cpu.trainer.LocalGRPOTrainer` learns from exactly the tokens sampled, and
  the endpoint serves every weight update at once, so eval points and the post eval score the model
  being trained;
- the final weights are saved as servable HF files in ``<bundle>/outputs/weights/step_N`` (prime-rl's
  layout);
- limits in work, not seconds (:mod:`cpu.budget`): each step's results are awaited by a
  :class:`~cpu.budget.StepWatch` over the endpoint's counters and the sandbox's CPU seconds
  (read from outside it); the sandbox's wall clock is the job's backstop (``wall_backstop_s``), whose stop is
  ours (``infra_failed``, ``slow_machine``), and its CPU rlimit the job's CPU budget.

Progress: a tqdm bar on a terminal; where stderr is a file or a pipe (``bash scripts/main.sh | tee log``)
one plain line (:func:`progress_line`) about every fifth of the steps, so a log holds no bar redraws.

The step channel (``/ait/work``, ``/ait/results``) and the sampling records are this executor's own:
nothing of the generic phases depends on them.
"""

from __future__ import annotations

import json
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import Field

from ait_env.jobs.settings import BackendSettings, RunnerSettings
from ait_env.jobs.bundle import JobBundle
from ait_env.runner import InfraFailed, JobFailed, Log, Served, Trained
from task_families import get_family

ROLLOUT_WORKER = Path(__file__).with_name("rollout_worker.py")


def worker_stopped(resp: Any, *, steps_done: int, max_steps: int, wall_s: float, cpu_s: float) -> Exception:
    """The failure of a job whose sandboxed rollout worker ended during training. The sandbox stops the
    worker at the job's backstop (``wall_s``; its answer ``{"status": "timeout"}``): on this backend a wall-clock
    stop measures the machine, not the job, whose work is bounded step by step (:mod:`cpu.budget`),
    so it is ours (``infra_failed``, ``slow_machine``). The kernel stops a worker process past its CPU rlimit
    (``cpu_s``, the job's CPU budget; SIGXCPU): the job's. Any other end is the environment's code."""
    from cpu.budget import SLOW_MACHINE, load_text

    if isinstance(resp, dict) and resp.get("status") == "timeout":
        return InfraFailed(f"the machine was too slow: the job was still training after {wall_s:.0f} s, at "
                           f"{steps_done} of {max_steps} steps ({load_text()}), within its work budget, so not "
                           "its fault. Run it on a less busy machine, or raise the local backend's "
                           "wall_backstop_s", code=SLOW_MACHINE)
    if isinstance(resp, dict) and resp.get("signal") == "SIGXCPU" and resp.get("status") == "crashed":
        return JobFailed(f"the rollout worker (your environment's code) was stopped by its CPU limit of "
                         f"{cpu_s:.0f} CPU seconds for the whole job (SIGXCPU) after {steps_done} of "
                         f"{max_steps} training steps: make the tools or the rubric cheaper")
    return JobFailed("the rollout worker (your environment's code) stopped during training: "
                     f"{json.dumps(resp or {}, default=str)[:1500]}")


class LocalExecutorOptions(RunnerSettings):
    """The local executor's options (the runner's generic ones and these): part of the ``local`` backend's
    ``options`` (:class:`ait_env.backends.local.LocalOptions` adds the backend's own)."""

    lr_scale: float = 100.0         # job lr (Qwen scale) -> tiny-model lr; logged in the result
    torch_threads: int = 1          # intra-op threads of the runner (1: measured 11 s vs 18 s per hidden eval
                                    # with 2 on 2 cores, where the sandboxed rollout worker needs the other core)
    #: where the model samples and trains: "cpu" (the default, the measured numbers), "cuda" / "cuda:N",
    #: or "auto" (a GPU when torch sees one). Sampling draws stay on the CPU either way (engine docstring).
    device: str = "cpu"
    seed: int = 0
    #: seconds of a step without results after which :class:`cpu.budget.StepWatch` looks at who
    #: used them: an idle endpoint and an idle sandbox fail the job (its code waits on itself); else it waits on
    step_timeout_s: float = 600.0
    max_model_len: int | None = None
    sandbox_memory_mb: int = 3072
    #: the agent's code's CPU budget (the sandbox's CPU seconds, whatever the load): per rollout, and to load
    #: the environment (:class:`cpu.budget.WorkBudget`)
    cpu_s_per_rollout: float = Field(1.0, gt=0)
    load_cpu_s: float = Field(300.0, gt=0)
    #: a job still training this many seconds after it started is stopped as the machine's fault
    #: (``infra_failed``, ``slow_machine``): on this backend the wall clock is a backstop, not the job's limit.
    #: None: 4 x ``bounds.wall_clock_minutes``
    wall_backstop_s: float | None = Field(None, gt=0)


def _is_terminal(stream: Any) -> bool:
    """Whether ``stream`` is a terminal (a bar's carriage returns make sense only there)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def progress_line(family: str, s: Any, total: int) -> str:
    """One plain progress line of a training step (a :class:`~cpu.trainer.StepLog`)."""
    ev = f", eval {s.eval_score:.2f}" if s.eval_score is not None else ""
    return f"GRPO {family}: step {s.step}/{total}, reward {s.reward_mean:.2f}{ev} ({s.seconds:.1f} s/step)"



def load_base_model(name: str) -> tuple[Any, Any]:
    """(TinyLM, ChatTokenizer) of a built catalog model; never builds (:class:`InfraFailed` naming the build
    command instead)."""
    from cpu.tiny_models import catalog

    try:
        return catalog.load_model(name)
    except catalog.NotBuilt as exc:
        raise InfraFailed(str(exc)) from None


def work_budget(job: Any, backend: BackendSettings, opts: LocalExecutorOptions) -> Any:
    """The :class:`~cpu.budget.WorkBudget` of ``job`` on this backend: its rollouts per step and
    ``seq_len``, the options' CPU budget and idle window, and the backstop (``wall_backstop_s``, by default 4 x
    ``bounds.wall_clock_minutes``)."""
    from cpu.budget import WorkBudget

    return WorkBudget(rollouts=job.prime_rl.batch_size, seq_len=job.prime_rl.seq_len,
                      cpu_s_per_rollout=opts.cpu_s_per_rollout, load_cpu_s=opts.load_cpu_s,
                      window_s=opts.step_timeout_s,
                      backstop_s=opts.wall_backstop_s or 4 * backend.bounds.wall_clock_minutes * 60)


class LocalExecutor:
    """See the module docstring. Built by the runner per job; :meth:`close` stops everything it started."""

    def __init__(self, bundle: JobBundle, backend: BackendSettings, log: Log, progress: bool = True) -> None:
        import torch

        from cpu.tiny_models.model import resolve_device
        from ait_env.sandbox import Sandbox, SandboxLimits, SandboxSettings

        self.bundle = bundle
        self.backend = backend
        self.opts = LocalExecutorOptions.of(backend.options)
        self.log = log
        self.progress = progress
        self.job = bundle.job
        self.family = get_family(bundle.manifest.family)
        self.model_name = self.job.job.base_model
        torch.set_num_threads(max(1, self.opts.torch_threads))
        self.device = resolve_device(self.opts.device)
        self.model, self.tok = load_base_model(self.model_name)
        self.model.to(self.device)
        gpu = f" ({torch.cuda.get_device_name(self.device)})" if self.device.type == "cuda" else ""
        log(f"{self.model_name} on {self.device}{gpu}")
        self.max_len = self.opts.max_model_len or min(self.job.prime_rl.seq_len,
                                                      self.model.cfg.max_position_embeddings)
        self.budget = work_budget(self.job, backend, self.opts)
        self.sandbox = Sandbox(SandboxSettings(limits=SandboxLimits(
            cpu_seconds=int(self.budget.job_cpu_s(self.job.prime_rl.max_steps)),
            memory_mb=self.opts.sandbox_memory_mb, wall_seconds=self.budget.backstop_s + 60,
            max_processes=64, file_size_mb=64)), jobs={"rollout_worker": ROLLOUT_WORKER})
        self._started = time.monotonic()
        self.ep: Any = None
        self._workdir: tuple[Path, str] | None = None

    # ------------------------------------------------------------------ TrainerExecutor
    def weights_hash(self, model: str) -> str:
        from cpu.tiny_models.catalog import weights_hash

        return weights_hash(model)

    def serve_base(self) -> Served:
        from cpu.tiny_models.endpoint import LocalEndpoint

        outside, inside = self.sandbox.new_workdir()
        self._workdir = (outside, inside)
        shutil.copytree(self.bundle.package_dir, outside / self.bundle.manifest.env_id,
                        ignore=shutil.ignore_patterns("__pycache__"))
        uds = outside / "endpoint.sock"
        self.ep = LocalEndpoint(self.model, self.tok, self.model_name, uds=uds, seed=self.opts.seed,
                                max_model_len=self.max_len).start()
        self.sandbox.share_socket(uds)
        return Served(self.ep.base_url, self.model_name)

    def measure_base(self, model: str, evaluate: Callable[[Served], Any]) -> Any:
        from cpu.tiny_models.endpoint import LocalEndpoint

        other, tok = load_base_model(model)
        other.to(self.device)
        with LocalEndpoint(other, tok, model, seed=self.opts.seed, max_model_len=self.max_len) as ep:
            return evaluate(Served(ep.base_url, model))

    def serve_trained(self) -> Served:
        assert self.ep is not None, "serve_base first"
        return Served(self.ep.base_url, self.model_name)

    def train(self, eval_point: Callable[[int], float | None]) -> Trained:
        from cpu.tiny_models.endpoint import WorkerGone
        from cpu.trainer import LocalGRPOTrainer, RolloutWorkerError, StepLog
        from ait_env.sandbox import SandboxError

        assert self.ep is not None and self._workdir is not None, "serve_base first"
        ep, (outside, inside) = self.ep, self._workdir
        job, opts = self.job, self.opts
        req = {"job": "rollout_worker", "dir": inside, "package": self.bundle.manifest.env_id, "args": job.env,
               "uds": f"{inside}/endpoint.sock"}
        worker_out: dict[str, Any] = {}

        def _worker() -> None:
            try:
                worker_out["resp"] = self.sandbox.run(req, outside)
            except SandboxError as exc:
                worker_out["infra"] = str(exc)
            except Exception as exc:  # noqa: BLE001 - never die silently in a thread
                worker_out["infra"] = f"{type(exc).__name__}: {exc}"
            finally:
                ep.channel.abort(f"the sandboxed rollout worker ended: {worker_out}")

        thread = threading.Thread(target=_worker, name="ait-rollout-worker", daemon=True)
        watch = self._watch()
        thread.start()
        try:
            hello = watch.wait(-1)
        except WorkerGone:
            if "infra" in worker_out:
                raise RuntimeError(f"the sandbox failed: {worker_out['infra']}") from None
            if isinstance(worker_out.get("resp"), dict) and worker_out["resp"].get("status") == "timeout":
                raise self._stopped(worker_out.get("resp"), 0) from None
            raise JobFailed(_worker_ended_at_start(worker_out)) from None
        # the worker's process runs the agent's code: what it posts is untrusted input
        if not isinstance(hello, dict):
            raise JobFailed("the rollout worker's first message is not a JSON object")
        if "error" in hello:
            raise JobFailed("your environment failed in the rollout worker before training: "
                            f"{str(hello['error'])[:1500]}\n{str(hello.get('traceback', ''))[-1200:]}")
        rows = hello.get("rows")
        if not isinstance(rows, int) or isinstance(rows, bool) or rows <= 0:
            raise JobFailed(f"the environment's dataset is empty or unreadable (rows: {str(rows)[:80]})")
        self.log(f"sandboxed rollout worker ready ({self.sandbox.mode}); dataset rows: {rows}; "
                 f"lr {job.prime_rl.optim.lr:g} x lr_scale {opts.lr_scale:g} = {job.prime_rl.optim.lr * opts.lr_scale:g}")
        trainer = LocalGRPOTrainer(ep, job, rows, lr_scale=opts.lr_scale, seed=opts.seed,
                                   step_timeout_s=opts.step_timeout_s, audit=self._audit(), watch=watch)
        bar = None
        plain_every = 0  # progress as plain lines: stderr is a file or a pipe (a tee'd log), no tqdm redraws
        if self.progress and _is_terminal(sys.stderr):
            from tqdm import tqdm

            bar = tqdm(total=job.prime_rl.max_steps, desc=f"GRPO {self.family.name}", unit="step", file=sys.stderr)
        elif self.progress:
            plain_every = max(1, job.prime_rl.max_steps // 5)
        eval_seconds: list[float] = []

        def timed_eval_point(step: int) -> float | None:
            t0 = time.time()
            score = eval_point(step)
            if score is not None:
                eval_seconds.append(time.time() - t0)
            return score

        done = [0]  # training steps finished, for the message of a job stopped at its wall clock

        def on_step(s: StepLog) -> None:
            done[0] = s.step
            if bar is not None:
                bar.update(1)
                bar.set_postfix(reward=f"{s.reward_mean:.2f}",
                                **({"eval": f"{s.eval_score:.2f}"} if s.eval_score is not None else {}))
            elif plain_every and (s.step % plain_every == 0 or s.step == job.prime_rl.max_steps):
                print(progress_line(self.family.name, s, job.prime_rl.max_steps), file=sys.stderr, flush=True)

        t_train = time.time()
        try:
            logs = trainer.run(on_step=on_step, eval_fn=timed_eval_point)
        except RolloutWorkerError as exc:
            raise JobFailed(str(exc)) from None
        except WorkerGone:
            if "infra" in worker_out:
                raise RuntimeError(f"the sandbox failed: {worker_out['infra']}") from None
            raise self._stopped(worker_out.get("resp"), done[0]) from None
        finally:
            if bar is not None:
                bar.close()
        train_seconds = time.time() - t_train
        ep.channel.finish()
        thread.join(timeout=30)
        weights = self.bundle.root / "outputs" / "weights" / f"step_{job.prime_rl.max_steps}"
        with ep.lock:
            self.model.save(weights)
        self.tok.save(weights, model_max_length=self.model.cfg.max_position_embeddings)
        tokens = sum(s.loss_tokens for s in logs)
        timings = {"on_gpu": float(self.device.type == "cuda"),
                   "rollout": round(sum(s.rollout_seconds for s in logs), 2),
                   "optimizer": round(sum(s.train_seconds for s in logs), 2), "trained_tokens": float(tokens),
                   "train_tokens_per_s": round(tokens / max(1e-9, train_seconds - sum(eval_seconds)), 1)}
        curves = {"train_reward": [s.reward_mean for s in logs], "lr": [s.lr for s in logs],
                  "step_seconds": [s.seconds for s in logs], "trained_tokens": [float(s.loss_tokens) for s in logs],
                  # the update's health: tokens outside the trust region, ratio to the sampler, gradient
                  **{k: [float(s.metrics.get(k, 0.0)) for s in logs]
                     for k in ("masked_frac", "ratio_mean", "grad_norm", "rollout_errors", "agent_cpu_s",
                               "endpoint_busy_s")}}
        return Trained(train_seconds=train_seconds, curves=curves, timings=timings, weights=weights)

    def _watch(self) -> Any:
        """The job's :class:`~cpu.budget.StepWatch`: the step channel, the endpoint's counters
        and the sandbox's CPU seconds (read from outside it), under :attr:`budget`."""
        from cpu.budget import StepWatch
        from ait_env.processes import tree_cpu_seconds

        ep, sandbox = self.ep, self.sandbox
        stats = ep.stats

        def cpu() -> float:
            pid = sandbox.pid
            return tree_cpu_seconds(pid) if pid is not None else 0.0

        return StepWatch(self.budget, ep.channel.wait_results,
                         lambda: (float(stats["gen_seconds"]), int(stats["generated_tokens"]), int(stats["requests"])),
                         cpu, started=self._started)

    def _stopped(self, resp: Any, steps_done: int) -> Exception:
        return worker_stopped(resp, steps_done=steps_done, max_steps=self.job.prime_rl.max_steps,
                              wall_s=self.budget.backstop_s, cpu_s=self.budget.job_cpu_s(self.job.prime_rl.max_steps))

    def _audit(self) -> Any:
        """The training audit of this job: the hidden set's questions stay in this process (outside the
        sandbox); the audit reads what the rollout worker sent the model (:mod:`ait_env.probe.training_audit`)."""
        from ait_env.probe.training_audit import TrainingAudit
        from ait_env.hidden.secrets import hidden_questions

        return TrainingAudit(self.family, hidden_questions(self.family.name))

    def close(self) -> None:
        try:
            if self.ep is not None:
                self.ep.stop()
        finally:
            self.sandbox.destroy()


def measure_untrained(name: str, family: str, opts: LocalExecutorOptions, limit: int) -> Any:
    """The hidden-eval result (first ``limit`` instances) of an untrained local model on its own endpoint,
    outside any job (``scripts/seed_baselines.py``): the harness in a child process, as in a job."""
    from ait_env.hidden.evaluation import evaluate_subprocess
    from cpu.tiny_models.endpoint import LocalEndpoint

    fam = get_family(family)
    model, tok = load_base_model(name)
    with LocalEndpoint(model, tok, name, seed=opts.seed) as ep:
        res = evaluate_subprocess(family, base_url=ep.base_url, model=name, limit=limit,
                                  concurrency=opts.eval_concurrency,
                                  max_tokens=min(fam.eval_max_tokens, opts.eval_max_tokens))
    res.raise_if_failed()
    return res


def _worker_ended_at_start(worker_out: dict[str, Any]) -> str:
    """What the agent reads when the sandboxed rollout worker ended before its hello: where (the stage it
    had reached), how (its exit code or signal) and what it printed, and what to fix."""
    resp = worker_out.get("resp") if isinstance(worker_out.get("resp"), dict) else {}
    stage, code = str(resp.get("stage") or "")[:80], resp.get("exit_code")
    if not (isinstance(code, int) and abs(code) < 2**31):
        code = None
    how = (f"was killed by signal {-int(code)}" if isinstance(code, int) and code < 0 else
           f"exited with code {code}" if code is not None else "ended")
    said = str(resp.get("stderr") or resp.get("output") or resp.get("error") or "").strip()[-1200:]
    where = "in load_environment" if stage == "load_environment" else f"at {stage or 'start-up'}"
    return (f"your environment's rollout worker {how} {where}, before it was ready (no traceback: os._exit, "
            "sys.exit or a crash ends the process). load_environment must return the environment and never "
            "exit the process." + (f" What it printed:\n{said}" if said else
                                   f" ({json.dumps(resp, default=str)[:600]})"))
