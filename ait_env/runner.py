"""One job runner for every backend: a job bundle in, an atomic ``result.json`` out.

    python -m ait_env.runner runs/jobs/<job_id> [--backend local] [--measure-pre]

Phases: verify the bundle -> pre-eval (pinned baselines of the backend, or measured with
``--measure-pre``) -> training -> post-eval of the trained model with the hidden-eval harness
(:mod:`ait_env.evaluation`, in a child process, over the OpenAI-compatible endpoint that serves the
trained weights) ->
``result.json`` (scores, per-step curves, wall time, cost, status, log tail).

Status rules: a failure caused by the job's own code or settings (its environment crashes, its
rollouts fail) is ``job_failed``; anything else that goes wrong (our bug, a dead endpoint, a failed
eval) is ``infra_failed``. The agent's code never runs in this process: training rollouts run in
the probe's sandbox (:mod:`ait_env.probe.sandbox`), whose only network is the model endpoint's
Unix socket; this process only imports trusted code. The GPU worker reuses this module with prime-rl
as the training phase.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel

from ait_env.backends.base import BackendSettings, JobResult
from ait_env.baselines import BaselinesNotSeeded, BaselineStore
from ait_env.jobs.bundle import JobBundle
from task_families import get_family


class RunnerSettings(BaseModel):
    """Local-backend knobs (``conf/backend/local.yaml`` ``options``)."""

    lr_scale: float = 100.0         # job lr (Qwen scale) -> tiny-model lr; logged in the result
    eval_every: int = 10            # curve points: hidden-eval subset every N steps (0 = off)
    eval_subset: int = 100          # instances of the hidden set used for curve points
    eval_concurrency: int = 300     # the harness runs in its own process; the endpoint batches continuously
    torch_threads: int = 1          # intra-op threads of this process (1: measured 11 s vs 18 s per hidden eval
                                    # with 2 on 2 cores, where the sandboxed rollout worker needs the other core)
    #: where the model samples and trains: "cpu" (the default, the measured numbers), "cuda" / "cuda:N",
    #: or "auto" (a GPU when torch sees one). Sampling draws stay on the CPU either way (engine docstring).
    device: str = "cpu"
    seed: int = 0
    step_timeout_s: float = 600.0
    measure_pre: bool = False       # measure the base model instead of reading pinned baselines
    eval_max_tokens: int = 160      # per-turn cap of the hidden eval (tiny models stop at <|im_end|> anyway)
    eval_limit: int | None = None   # tests only: score the first N hidden instances instead of all
    max_model_len: int | None = None
    sandbox_memory_mb: int = 3072


class JobFailed(RuntimeError):
    """The job itself is at fault (its environment or rubric broke during training)."""


class _Tee:
    """Keeps the last lines printed to the job log."""

    def __init__(self, path: Path) -> None:
        self.f = open(path, "a", buffering=1)  # noqa: SIM115
        self.lines: list[str] = []

    def __call__(self, msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        self.f.write(line + "\n")
        self.lines = (self.lines + [line])[-60:]
        print(line, file=sys.stderr, flush=True)

    def tail(self) -> str:
        return "\n".join(self.lines)


def pinned_baselines(store: BaselineStore, family: str, models: list[str], built_hashes: dict[str, str],
                     log: Callable[[str], None]) -> dict[str, float]:
    """The pinned baseline of each model for ``family``, leaving out every pin that does not hold here
    (:meth:`BaselineEntry.stale`: measured on other weights than the ones built here, i.e. another corpus
    or another CPU's float path, or on another hidden set), so the runner measures those models instead
    (the job's own on its endpoint, the others on a temporary one) and the env's ``best_pre`` compares
    with what this machine's models really score. Each stale pin is logged with the fix."""
    out: dict[str, float] = {}
    for name in models:
        try:
            entry, reason = store.lookup(family, name, built_hashes.get(name, ""))
        except BaselinesNotSeeded:
            continue
        if reason:
            log(f"the pinned {family} baseline of {name} was {reason}; measuring it (to pin this build: "
                f"python scripts/seed_baselines.py backend=local pin=true)")
            continue
        out[name] = entry.score
    return out


def _load_model(name: str) -> Any:
    from ait_env.local.catalog import load_model

    return load_model(name)


def measure_base(name: str, family: str, opts: RunnerSettings, limit: int, device: Any = "cpu",
                 max_len: int | None = None) -> Any:
    """The hidden-eval result (first ``limit`` instances) of an untrained local base model, on its own
    endpoint; the harness runs in a child process, as in a job. Used for pins whose weights are not the
    ones built here and by ``LocalBackend.measure_baseline`` (seeding the pins)."""
    from ait_env.evaluation import evaluate_subprocess
    from ait_env.local.endpoint import LocalEndpoint

    fam = get_family(family)
    model, tok = _load_model(name)
    model.to(device)
    with LocalEndpoint(model, tok, name, seed=opts.seed, max_model_len=max_len) as ep:
        res = evaluate_subprocess(family, base_url=ep.base_url, model=name, limit=limit,
                                  concurrency=opts.eval_concurrency,
                                  max_tokens=min(fam.eval_max_tokens, opts.eval_max_tokens))
    res.raise_if_failed()
    return res


def run_local(bundle: JobBundle, backend: BackendSettings, log: Callable[[str], None],
              progress: bool = True) -> JobResult:
    """The local backend: tiny models, the local endpoint, sandboxed verifiers rollouts, GRPO."""
    from ait_env.evaluation import evaluate_subprocess
    from ait_env.local.catalog import weights_hash
    from ait_env.local.endpoint import LocalEndpoint, WorkerGone
    from ait_env.local.trainer import LocalGRPOTrainer, RolloutWorkerError, StepLog
    from ait_env.probe.sandbox import Sandbox, SandboxLimits, SandboxSettings, SandboxError
    from ait_env.secrets import hidden_set

    opts = RunnerSettings.model_validate(backend.options)
    job = bundle.job
    fam = get_family(bundle.manifest.family)
    model_name = job.job.base_model
    t_start = time.time()
    import torch

    torch.set_num_threads(max(1, opts.torch_threads))
    from ait_env.local.model import resolve_device

    device = resolve_device(opts.device)
    model, tok = _load_model(model_name)
    model.to(device)
    log(f"{model_name} on {device}" + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""))
    hidden = hidden_set(fam.name)[:opts.eval_limit] if opts.eval_limit else hidden_set(fam.name)
    baselines = pinned_baselines(BaselineStore("local"), fam.name, [m.name for m in backend.models],
                                 {m.name: weights_hash(m.name) for m in backend.models}, log)
    max_len = opts.max_model_len or min(job.prime_rl.seq_len, model.cfg.max_position_embeddings)
    wall_limit = backend.bounds.wall_clock_minutes * 60
    outside_root = None
    sandbox = Sandbox(SandboxSettings(limits=SandboxLimits(
        cpu_seconds=int(wall_limit * 2), memory_mb=opts.sandbox_memory_mb, wall_seconds=wall_limit,
        max_processes=64, file_size_mb=64)))
    try:
        outside_root, inside_root = sandbox.new_workdir()
        shutil.copytree(bundle.package_dir, outside_root / bundle.manifest.env_id,
                        ignore=shutil.ignore_patterns("__pycache__"))
        uds = outside_root / "endpoint.sock"
        ep = LocalEndpoint(model, tok, model_name, uds=uds, seed=opts.seed, max_model_len=max_len).start()
        sandbox.share_socket(uds)
        try:
            def hidden_eval(instances: list[Any]) -> Any:
                # the first len(instances) of the hidden set, scored by the harness in its own process
                res = evaluate_subprocess(fam.name, base_url=ep.base_url, model=model_name, limit=len(instances),
                                          concurrency=opts.eval_concurrency,
                                          max_tokens=min(fam.eval_max_tokens, opts.eval_max_tokens))
                if res.failed:
                    raise RuntimeError(f"hidden eval failed: {res.failure_reason}")
                return res

            timings: dict[str, float] = {"load_model": round(time.time() - t_start, 2),
                                         "on_gpu": float(device.type == "cuda")}
            if opts.measure_pre or model_name not in baselines:
                log(f"pre-eval of {model_name} on {len(hidden)} hidden {fam.name} instances")
                t_pre = time.time()
                baselines[model_name] = hidden_eval(hidden).score
                timings["pre_eval"] = round(time.time() - t_pre, 2)
            pre = baselines[model_name]
            for other in [m.name for m in backend.models]:
                if other not in baselines and weights_hash(other):  # built here, pin stale or missing
                    t_other = time.time()
                    baselines[other] = measure_base(other, fam.name, opts, len(hidden), device, max_len).score
                    timings[f"pre_eval_{other}"] = round(time.time() - t_other, 2)
                    log(f"measured {other}'s base: {baselines[other]:.3f}")
            log(f"baselines: {json.dumps(baselines)}")
            # Start the sandboxed rollout worker (the agent's code) in the background.
            req = {"job": "rollout_worker", "dir": inside_root, "package": bundle.manifest.env_id,
                   "args": job.env, "uds": f"{inside_root}/endpoint.sock"}
            worker_out: dict[str, Any] = {}

            def _worker() -> None:
                try:
                    worker_out["resp"] = sandbox.run(req, outside_root)
                except SandboxError as exc:
                    worker_out["infra"] = str(exc)
                except Exception as exc:  # noqa: BLE001 - never die silently in a thread
                    worker_out["infra"] = f"{type(exc).__name__}: {exc}"
                finally:
                    ep.channel.abort(f"the sandboxed rollout worker ended: {worker_out}")

            th = threading.Thread(target=_worker, name="ait-rollout-worker", daemon=True)
            th.start()
            try:
                hello = ep.channel.wait_results(-1, opts.step_timeout_s)
            except WorkerGone:
                raise JobFailed(f"the rollout worker did not start: {json.dumps(worker_out)[:1500]}") from None
            if "error" in hello:
                raise JobFailed(f"load_environment failed in the sandbox: {hello['error']}\n"
                                f"{hello.get('traceback', '')[-1200:]}")
            rows = int(hello.get("rows") or 0)
            if rows <= 0:
                raise JobFailed("the environment's dataset is empty")
            log(f"sandboxed rollout worker ready ({sandbox.mode}); dataset rows: {rows}; "
                f"lr {job.prime_rl.optim.lr:g} x lr_scale {opts.lr_scale:g} = {job.prime_rl.optim.lr * opts.lr_scale:g}")
            trainer = LocalGRPOTrainer(ep, job, rows, lr_scale=opts.lr_scale, seed=opts.seed,
                                       step_timeout_s=opts.step_timeout_s)
            subset = hidden[:opts.eval_subset]
            curve_eval: dict[int, float] = {0: pre}

            eval_seconds: list[float] = []

            def eval_fn(step: int) -> float | None:
                if opts.eval_every and (step % opts.eval_every == 0) and step < job.prime_rl.max_steps:
                    t_eval = time.time()
                    curve_eval[step] = hidden_eval(subset).score
                    eval_seconds.append(time.time() - t_eval)
                    return curve_eval[step]
                return None

            bar = None
            if progress:
                from tqdm import tqdm

                bar = tqdm(total=job.prime_rl.max_steps, desc=f"GRPO {fam.name}", unit="step", file=sys.stderr)

            def on_step(s: StepLog) -> None:
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(reward=f"{s.reward_mean:.2f}",
                                    **({"eval": f"{s.eval_score:.2f}"} if s.eval_score is not None else {}))

            t_train = time.time()
            try:
                logs = trainer.run(on_step=on_step, eval_fn=eval_fn)
            except RolloutWorkerError as exc:
                raise JobFailed(str(exc)) from None
            except WorkerGone:
                if "infra" in worker_out:
                    raise RuntimeError(f"the sandbox failed: {worker_out['infra']}") from None
                resp = worker_out.get("resp") or {}
                raise JobFailed(f"the rollout worker (your environment's code) stopped during training: "
                                f"{json.dumps(resp)[:1500]}") from None
            finally:
                if bar is not None:
                    bar.close()
            train_seconds = time.time() - t_train
            ep.channel.finish()
            th.join(timeout=30)
            log(f"training done in {train_seconds:.1f} s; post-eval on {len(hidden)} hidden instances")
            t_post = time.time()
            post = hidden_eval(hidden)
            timings["post_eval"] = round(time.time() - t_post, 2)
            timings["train"] = round(train_seconds, 2)
            timings["curve_evals"] = round(sum(eval_seconds), 2)
            timings["rollout"] = round(sum(s.rollout_seconds for s in logs), 2)
            timings["optimizer"] = round(sum(s.train_seconds for s in logs), 2)
            tokens = sum(s.loss_tokens for s in logs)
            timings["trained_tokens"] = float(tokens)
            timings["train_tokens_per_s"] = round(tokens / max(1e-9, train_seconds - sum(eval_seconds)), 1)
            weights = bundle.root / "outputs" / "weights" / f"step_{job.prime_rl.max_steps}"
            with ep.lock:
                model.save(weights)
            tok.save(weights, model_max_length=model.cfg.max_position_embeddings)
            log(f"post-eval {post.score:.3f} ± {post.ci95:.3f} (pre {pre:.3f}); weights in {weights}")
            curves = {"train_reward": [s.reward_mean for s in logs],
                      "eval_step": [float(k) for k in sorted(curve_eval)] + [float(job.prime_rl.max_steps)],
                      "eval_score": [curve_eval[k] for k in sorted(curve_eval)] + [post.score],
                      "lr": [s.lr for s in logs], "step_seconds": [s.seconds for s in logs],
                      "trained_tokens": [float(s.loss_tokens) for s in logs],
                      # the update's health: tokens outside the trust region, ratio to the sampler, gradient
                      **{k: [float(s.metrics.get(k, 0.0)) for s in logs]
                         for k in ("masked_frac", "ratio_mean", "grad_norm", "rollout_errors")}}
            return JobResult(job_id=bundle.job_id, backend="local", status="succeeded", post_score=post.score,
                             post_ci95=post.ci95, baselines=baselines, wall_seconds=time.time() - t_start,
                             train_seconds=train_seconds, cost_usd=0.0, curves=curves, timings=timings)
        finally:
            ep.stop()
    finally:
        sandbox.destroy()


def run(bundle_dir: Path, backend: BackendSettings, progress: bool = True) -> JobResult:
    bundle_dir = Path(bundle_dir)
    tee = _Tee(bundle_dir / "job.log")
    t0 = time.time()
    job_id = bundle_dir.name
    try:
        bundle = JobBundle.load(bundle_dir)
        bundle.verify()
        job_id = bundle.job_id
        if backend.name != "local":
            raise ValueError(f"the runner has no training phase for backend {backend.name!r} yet")
        result = run_local(bundle, backend, tee, progress=progress)
    except JobFailed as exc:
        tee(f"job failed: {exc}")
        result = JobResult(job_id=job_id, backend=backend.name, status="job_failed", error=str(exc)[:2000],
                           wall_seconds=time.time() - t0)
    except Exception as exc:  # noqa: BLE001 - anything else is ours
        tee(f"infrastructure failure: {type(exc).__name__}: {exc}\n{traceback.format_exc()[-2000:]}")
        result = JobResult(job_id=job_id, backend=backend.name, status="infra_failed",
                           error=f"{type(exc).__name__}: {exc}"[:2000], wall_seconds=time.time() - t0)
    result.log_tail = tee.tail()[-4000:]
    result.save(bundle_dir / "result.json")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--backend-settings", type=Path, help="JSON of BackendSettings (default: conf/backend/local.yaml)")
    ap.add_argument("--measure-pre", action="store_true")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args()
    if args.backend_settings:
        settings = BackendSettings.model_validate_json(args.backend_settings.read_text())
    else:
        from ait_env.config import load_group

        settings = BackendSettings.model_validate(load_group("backend", "local"))
    if args.measure_pre:
        settings.options["measure_pre"] = True
    result = run(args.bundle, settings, progress=not args.no_progress)
    print(json.dumps({k: v for k, v in result.model_dump().items() if k not in ("curves", "log_tail")}))
    sys.exit(0 if result.status == "succeeded" else 1)


if __name__ == "__main__":
    main()
