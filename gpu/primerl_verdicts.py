"""The verdicts of a prime-rl run (a part of :class:`gpu.primerl_executor.PrimeRLExecutor`): what ended it and
whose fault it is, from its logs and exit: a NaN or infinite loss or reward, an env server that failed to load,
did not get ready in time or died, a signal, the wall-clock deadline, an exit code (the rules and their
sources: :mod:`gpu.primerl_executor`)."""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING

from ait_env.runner import InfraFailed, JobFailed
from gpu.primerl_logs import Signal, StepLine, env_start_failure

if TYPE_CHECKING:
    from gpu.primerl_watch import _RunWatch

MAX_EMPTY_BATCHES = 10       # src/prime_rl/orchestrator/orchestrator.py MAX_CONSECUTIVE_EMPTY_BATCHES


class _Verdicts:
    """What ended a prime-rl run (see the module docstring)."""

    def non_finite_failure(self, step: StepLine, bad: dict[str, float]) -> JobFailed:
        p = self.job.prime_rl
        if step.source == "orchestrator":
            value = bad.get("train_reward", next(iter(bad.values())))
            return JobFailed(f"the mean reward was {value} at training step {step.step}: your rubric "
                             "returned NaN or infinity for some rollout. Make every reward function "
                             "return a finite float.")
        names = ", ".join(f"{k} = {v}" for k, v in bad.items())
        return JobFailed(f"training diverged at step {step.step} ({names}; prime-rl has no guard against "
                         "it): the rewards were not finite or the update blew up. Check that every reward "
                         f"function returns a finite float, and lower optim.lr (now {p.optim.lr:g}).")

    def env_failure(self, watch: _RunWatch) -> Exception:
        """An env server that failed before the first training step (:func:`gpu.primerl_logs.
        env_start_failure`): the job's fault with its traceback, or ours."""
        env_module = str(self.cfg["orchestrator"]["train"]["env"][0]["id"]).replace("-", "_").split("/")[-1]
        found = None
        for label, lines in watch.env_lines.items():
            found = env_start_failure(list(lines), env_module)
            if found is not None:
                break
        if found is None:   # "Failed to load environment" arrived, its traceback not yet
            text = "\n".join(line for lines in watch.env_lines.values() for line in lines)
            return JobFailed(f"your environment failed to load under prime-rl (load_environment raised):\n"
                             f"{text[-1500:]}")
        if found.blame == "infra":
            return InfraFailed(f"prime-rl's env server failed on our side before training started ({label}; "
                               f"the job's package {env_module} must import where prime-rl runs: "
                               f"PYTHONPATH and the training jail's binds):\n{found.text[-1500:]}")
        what = ("failed to import under prime-rl (an ImportError while importing your module or in "
                "load_environment)" if found.kind == "import"
                else "failed to load under prime-rl (load_environment raised)")
        return JobFailed(f"your environment {what}; the env server's log before the first training step:\n"
                         f"{found.text[-1500:]}")

    def env_ready_failure(self, watch: _RunWatch, name: str) -> Exception:
        """An env server not ready within ``env_ready_timeout_s``: its traceback's verdict when its log has
        one (:meth:`env_failure`: the job's, or ours), else the job's, with the end of its log."""
        if any(env_start_failure(list(lines), "") is not None for lines in watch.env_lines.values()):
            return self.env_failure(watch)
        lines = next((list(v) for k, v in watch.env_lines.items() if k.endswith(f"/{name}")), [])
        tail = "\n".join(lines[-20:]) or "(its log is empty)"
        return JobFailed(
            f"your environment's server did not become ready within {self.opts.env_ready_timeout_s:.0f} s of "
            "its start: prime-rl imports your package and calls load_environment in a process of its own, which "
            "exited, was killed, called sys.exit or os._exit, or is still importing or loading. Make "
            "load_environment return the environment within seconds, never exit the process, and do no slow "
            f"work at import. The end of the env server's log:\n{tail}")

    def signal_failure(self, sig: Signal, watch: _RunWatch) -> Exception:
        p = self.job.prime_rl
        if sig.kind == "env_load":
            return self.env_failure(watch)
        if sig.kind == "empty_batches":
            env_tail = "\n".join(x for lines in watch.env_lines.values() for x in list(lines)[-8:])[-1000:]
            return JobFailed(f"prime-rl stopped after {MAX_EMPTY_BATCHES} consecutive empty train "
                             f"batches: in every group of {p.group_size} rollouts all errored or got the "
                             "same reward, so there was nothing to learn from. Make rewards differ between "
                             "the rollouts of one example and check that your environment's rollouts do "
                             f"not raise.\n{env_tail}".rstrip())
        if sig.kind == "oom" and sig.blame == "job":
            done = max(watch.steps["trainer"], default=0)
            b = self.backend.bounds
            within = p.seq_len <= b.seq_len and p.batch_size <= b.batch_size and p.sampling.max_tokens <= b.max_tokens
            if self.plan.colocated and within:
                return InfraFailed(
                    f"the trainer ran out of GPU memory after {done} of {p.max_steps} steps in shared mode: "
                    f"vLLM held {self.plan.share:g} of GPU {self.plan.eval_gpu}'s memory and the trainer the "
                    f"rest. The job (seq_len = {p.seq_len}, batch_size = {p.batch_size}, sampling.max_tokens = "
                    f"{p.sampling.max_tokens}) is within this backend's bounds (seq_len <= {b.seq_len}, "
                    f"batch_size <= {b.batch_size}, max_tokens <= {b.max_tokens}), so the share is ours: give "
                    "the worker a second GPU, or set backend.options.colocated_gpu_memory_utilization.")
            shared = (f" (shared mode: vLLM held {self.plan.share:g} of the GPU)" if self.plan.colocated else "")
            return JobFailed(f"the trainer ran out of GPU memory (CUDA out of memory) after {done} of "
                             f"{p.max_steps} steps{shared}: seq_len = {p.seq_len} with batch_size = "
                             f"{p.batch_size} and sampling.max_tokens = {p.sampling.max_tokens} need more "
                             "memory than the GPU has. Lower seq_len, sampling.max_tokens or batch_size.")
        return InfraFailed(f"prime-rl failed on our side ({sig.kind} in the {sig.source} log): "
                           f"{sig.line[-800:]}")

    def deadline_failure(self, watch: _RunWatch) -> Exception:
        done = max(watch.steps["trainer"], default=0)
        limit = f"{self.wall_s / 60:g} min"
        job_signals = [s for s in watch.signals if s.blame == "job"]
        if job_signals:
            return self.signal_failure(job_signals[0], watch)
        p, b = self.job.prime_rl, self.backend.bounds
        within = p.seq_len <= b.seq_len and p.batch_size <= b.batch_size and p.sampling.max_tokens <= b.max_tokens
        if done and self.plan.colocated and within:
            # our sizing: vLLM shares the GPU with a KV cache for a few sequences, so sampling is slower than
            # on a GPU of its own; a job within the bounds is not told to shrink for it
            return InfraFailed(f"the job ran past its wall-clock limit of {limit} after {done} of {p.max_steps} "
                               f"steps in shared mode (vLLM held {self.plan.share:g} of GPU {self.plan.eval_gpu} "
                               "with a fixed KV cache, the trainer the rest). The job is within this backend's "
                               "bounds, so the limit is ours: give the worker a second GPU.")
        if done:
            return JobFailed(f"the job ran past its wall-clock limit of {limit} "
                             f"(bounds.wall_clock_minutes) after {done} of {self.job.prime_rl.max_steps} "
                             "training steps. Lower max_steps, batch_size or sampling.max_tokens so that it "
                             "fits.")
        return InfraFailed(f"prime-rl made no training step within the wall-clock limit of {limit} and no "
                           "log names a fault of the job (model download, vLLM start-up, a hung "
                           "process?):\n" + "\n".join(watch.recent)[-1500:])

    def exit_failure(self, rc: int | None, watch: _RunWatch) -> Exception:
        job_signals = [s for s in watch.signals if s.blame == "job"]
        if job_signals:
            return self.signal_failure(job_signals[0], watch)
        tail = "\n".join(watch.recent)[-1500:]
        if rc is not None and rc < 0:
            try:
                name = signal.Signals(-rc).name
            except ValueError:
                name = f"signal {-rc}"
            return InfraFailed(f"prime-rl's launcher was killed by {name} (host out of memory, or stopped "
                               f"from outside); the job is not at fault:\n{tail}")
        infra = [s for s in watch.signals if s.blame == "infra"]
        why = f" ({infra[0].kind} in the {infra[0].source} log)" if infra else ""
        return InfraFailed(f"prime-rl exited with code {rc}{why} and no log names a fault of the job; the "
                           f"end of its logs (all in {self.out / 'logs'}):\n{tail}")
