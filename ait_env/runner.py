"""One job runner for every backend: a job bundle in, an atomic ``result.json`` out.

    python -m ait_env.runner runs/jobs/<job_id> --backend-settings backend.json [--baselines-dir DIR]

Generic phases (this module), the same whatever trains the model:

1. **verify** the bundle (its files' hashes);
2. **pre scores**: the baselines policy (:meth:`ait_env.hidden.baselines.BaselineStore.for_job`) says which
   untrained scores hold for the weights built here; the job's own model is otherwise scored on the
   hidden set while the executor serves it, other models by the executor's ``measure_base``; a
   full-set measurement is recorded in the user store (pinned for this build from then on);
3. **train** with the executor; every ``eval_every`` steps an **eval point** scores the served
   model on the first ``eval_subset`` hidden questions;
4. **post eval** of the trained model on the whole hidden set, then the **outcome check**
   (:func:`outcome_check`): the trained model on as many fresh questions of the family's generator (at most
   ``outcome_fresh``, default 150); a model that knows the hidden questions far better than fresh ones was
   trained on them, and the job fails with the fault ``eval_leak`` (forfeited, the agent's fault);
5. **result.json**, written atomically (:meth:`JobResult.save`), with curves, timings, a log tail and which
   hidden-eval seeds scored it (``hidden_seeds``: this process's choice, :mod:`ait_env.hidden.secrets`).

The hidden-eval harness (:mod:`ait_env.hidden.evaluation`) runs in a child process against an
OpenAI-compatible base URL (vLLM on a GPU, the local endpoint here): nothing in these phases depends
on how the model is served or trained. That is the **trainer executor**'s part
(:class:`TrainerExecutor`): the local tiny-model GRPO (:mod:`cpu.executor`) today, prime-rl
on GPUs next. Executors are looked up by backend name in :data:`EXECUTORS`.

Status rules: a failure caused by the job's own code or settings (:class:`JobFailed`: its environment
crashes, its rubric returns NaN) is ``job_failed``; a model that is not built or any other failure
(our bug, a dead endpoint, a failed eval) is ``infra_failed``, with the fix where there is one. The
agent's code never runs in this process.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


from ait_env.jobs.settings import BackendSettings, RunnerSettings
from ait_env.jobs.result import JobResult
from ait_env.hidden.baselines import BaselineEntry, BaselineStore
from ait_env.jobs.bundle import JobBundle
from ait_env.jobs.failures import InfraFailed, JobFailed
from task_families import get_family

Log = Callable[[str], None]

__all__ = ["InfraFailed", "JobFailed", "Served", "Trained", "TrainerExecutor", "run"]


@dataclass
class Served:
    """A model behind an OpenAI-compatible chat endpoint."""

    base_url: str
    model: str


@dataclass
class Trained:
    """What an executor's training phase reports."""

    train_seconds: float
    #: per-step curves (``train_reward``, ``lr``, ...; eval points are added by the runner)
    curves: dict[str, list[float]] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    weights: Path | None = None


class TrainerExecutor(Protocol):
    """What trains a job's model and serves it for the generic phases. Built per job by its backend's
    factory in :data:`EXECUTORS` (``factory(bundle, settings, log, progress)``), closed by the runner."""

    def weights_hash(self, model: str) -> str:
        """The hash of the weights this executor would load for ``model`` ("" when unknown)."""

    def serve_base(self) -> Served:
        """Start serving the job's untrained base model (the pre-eval scores it)."""

    def measure_base(self, model: str, evaluate: Callable[[Served], Any]) -> Any:
        """Serve another untrained ``model`` for the duration of ``evaluate`` and return its result
        (raise ``InfraFailed`` where the executor cannot)."""

    def train(self, eval_point: Callable[[int], float | None]) -> Trained:
        """Train the job; the served model follows the weights. Call ``eval_point(step)`` after each step
        (it scores the served model when an eval point is due). Raise :class:`JobFailed` for the job's
        own faults."""

    def serve_trained(self) -> Served:
        """The trained model, served (the post eval scores it)."""

    def close(self) -> None:
        """Stop every server and process the executor started."""


#: backend name -> "module:factory" of its trainer executor
EXECUTORS: dict[str, str] = {"local": "cpu.executor:LocalExecutor",
                             "gpu": "gpu.primerl_executor:PrimeRLExecutor"}


def executor_renderers(executor: str | None, models: list[str]) -> dict[str, str]:
    """The chat renderer each of ``models`` gets from the trainer ``executor`` (model -> renderer name) where
    prime-rl's own map (:func:`ait_env.jobs.primerl.renderer_for`) does not decide: the local executor serves
    every model with its tokenizer's own chat template ("default"); prime-rl (``gpu``) uses its map alone.
    Validation takes the map of the executor the backend will run (:meth:`ait_env.backends.base.Backend.
    model_renderers`), so a job is judged by what will train it."""
    if executor == "local":
        return {m: "default" for m in models}
    return {}


def executor_factory(backend: str) -> Callable[..., TrainerExecutor]:
    if backend not in EXECUTORS:
        raise ValueError(f"the runner has no trainer executor for backend {backend!r} (known: {', '.join(EXECUTORS)})")
    module, _, attr = EXECUTORS[backend].partition(":")
    return getattr(importlib.import_module(module), attr)


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


def hidden_evaluator(family: str, settings: RunnerSettings) -> Callable[[Served, int], Any]:
    """``evaluate(served, n)``: the first ``n`` hidden instances of ``family`` scored by the harness in its
    own process (raises when the eval itself failed)."""
    from ait_env.hidden.evaluation import evaluate_subprocess

    fam = get_family(family)
    max_tokens = min(fam.eval_max_tokens, settings.eval_max_tokens)

    def evaluate(served: Served, n: int) -> Any:
        res = evaluate_subprocess(fam.name, base_url=served.base_url, model=served.model, limit=n,
                                  concurrency=settings.eval_concurrency, max_tokens=max_tokens)
        res.raise_if_failed()
        return res

    return evaluate


def outcome_check(family: Any, hidden: list[Any], hidden_score: float, settings: RunnerSettings, served: Served,
                  log: Log) -> None:
    """The outcome check of a trained model (:mod:`ait_env.hidden.outcome`): its post-eval score on the
    ``hidden`` instances against its score on as many fresh ones (at most ``settings.outcome_fresh``), scored by
    the same harness; raises :class:`JobFailed` (``eval_leak``) when it knows the hidden set far better."""
    import secrets

    from ait_env.hidden import outcome
    from ait_env.hidden.evaluation import evaluate_subprocess

    n = min(settings.outcome_fresh, len(hidden))
    if n < outcome.MIN_FRESH:
        log(f"outcome check skipped: {n} instances would say nothing (it needs {outcome.MIN_FRESH}; eval_limit "
            "or outcome_fresh is set lower)")
        return
    fresh = outcome.fresh_instances(family, hidden, n, secrets.randbits(63))
    res = evaluate_subprocess(family.name, base_url=served.base_url, model=served.model, instances=fresh,
                              concurrency=settings.eval_concurrency,
                              max_tokens=min(family.eval_max_tokens, settings.eval_max_tokens))
    res.raise_if_failed()
    v = outcome.verdict(hidden_score, len(hidden), res.score, res.n)
    log(v.summary())
    if v.forfeit:
        raise JobFailed(v.failure(), code="eval_leak")


def _phases(bundle: JobBundle, backend: BackendSettings, store: BaselineStore, record: bool, log: Log,
            progress: bool, factory: Callable[..., TrainerExecutor], known: dict[str, float],
            hidden_seeds: str) -> JobResult:
    """The phases; ``known`` receives the base scores as soon as they are known (a job that fails in
    training still reports what it was compared with)."""
    from ait_env.hidden.secrets import hidden_set, job_context

    log(f"hidden-eval seeds: {hidden_seeds}")
    settings = RunnerSettings.of(backend.options)
    job = bundle.job
    fam = get_family(bundle.manifest.family)
    model_name = job.job.base_model
    t_start = time.time()
    hidden = hidden_set(fam.name)[:settings.eval_limit] if settings.eval_limit else hidden_set(fam.name)
    full_set = settings.eval_limit is None
    evaluate = hidden_evaluator(fam.name, settings)

    executor = factory(bundle, backend, log, progress)
    try:
        models = [m.name for m in backend.models]
        # the job's context in the process that scores it: derived once, read by every phase below
        ctx = job_context(fam.name, models, {m: executor.weights_hash(m) for m in models})
        baselines, missing = store.for_job(ctx)
        for name, why in missing.items():
            log(f"the {fam.name} baseline of {name} is {why}; measuring it")

        def pin(name: str, res: Any) -> None:
            if record and full_set and ctx.weights_hash(name):
                store.record_measured(BaselineEntry(
                    backend=backend.name, family=ctx.family, model=name, score=res.score, ci95=res.ci95, n=res.n,
                    hidden_set_hash=ctx.hidden_set_hash, model_hash=ctx.weights_hash(name),
                    command="measured by a job (python -m ait_env.runner)"))
                log(f"pinned {name}'s {ctx.family} baseline {res.score:.3f} for weights {ctx.weights_hash(name)}")

        timings: dict[str, float] = {"setup": round(time.time() - t_start, 2)}
        served = executor.serve_base()
        if settings.measure_pre or model_name not in baselines:
            log(f"pre-eval of {model_name} on {len(hidden)} hidden {fam.name} instances")
            t0 = time.time()
            res = evaluate(served, len(hidden))
            baselines[model_name] = res.score
            timings["pre_eval"] = round(time.time() - t0, 2)
            pin(model_name, res)
        pre = baselines[model_name]
        for other in models:
            if other not in baselines and ctx.weights_hash(other):  # built here, pin stale or missing
                t0 = time.time()
                res = executor.measure_base(other, lambda s: evaluate(s, len(hidden)))
                baselines[other] = res.score
                timings[f"pre_eval_{other}"] = round(time.time() - t0, 2)
                log(f"measured {other}'s base: {res.score:.3f}")
                pin(other, res)
        log(f"baselines: {json.dumps(baselines)}")
        known.update(baselines)

        points: dict[int, float] = {0: pre}
        point_seconds: list[float] = []

        def eval_point(step: int) -> float | None:
            if settings.eval_every and step % settings.eval_every == 0 and step < job.prime_rl.max_steps:
                t0 = time.time()
                points[step] = evaluate(executor.serve_trained(), min(settings.eval_subset, len(hidden))).score
                point_seconds.append(time.time() - t0)
                return points[step]
            return None

        trained = executor.train(eval_point)
        log(f"training done in {trained.train_seconds:.1f} s; post-eval on {len(hidden)} hidden instances")
        t0 = time.time()
        post = evaluate(executor.serve_trained(), len(hidden))
        timings.update(trained.timings)
        timings.update(post_eval=round(time.time() - t0, 2), train=round(trained.train_seconds, 2),
                       curve_evals=round(sum(point_seconds), 2))
        log(f"post-eval {post.score:.3f} ± {post.ci95:.3f} (pre {pre:.3f})"
            + (f"; weights in {trained.weights}" if trained.weights else ""))
        if settings.outcome_fresh:
            t0 = time.time()
            outcome_check(fam, hidden, post.score, settings, executor.serve_trained(), log)
            timings["outcome_check"] = round(time.time() - t0, 2)
        curves = {"train_reward": trained.curves.get("train_reward", []),
                  "eval_step": [float(k) for k in sorted(points)] + [float(job.prime_rl.max_steps)],
                  "eval_score": [points[k] for k in sorted(points)] + [post.score],
                  **{k: v for k, v in trained.curves.items() if k != "train_reward"}}
        return JobResult(job_id=bundle.job_id, backend=backend.name, status="succeeded", post_score=post.score,
                         post_ci95=post.ci95, baselines=baselines, wall_seconds=time.time() - t_start,
                         train_seconds=trained.train_seconds, cost_usd=0.0, curves=curves, timings=timings,
                         hidden_seeds=hidden_seeds)
    finally:
        executor.close()


def run(bundle_dir: Path, backend: BackendSettings, progress: bool = True,
        baselines_dir: Path | None = None,
        executor: Callable[..., TrainerExecutor] | None = None) -> JobResult:
    """Run the bundle in ``bundle_dir`` with the executor of ``backend`` and write its ``result.json``.
    ``baselines_dir``: the user baseline store (read first, and where measured base scores are pinned);
    None reads the shipped pins only and records nothing. ``executor``: the executor factory, default
    ``executor_factory(backend.name)`` (the GPU worker passes one that guards the training tree)."""
    bundle_dir = Path(bundle_dir)
    tee = _Tee(bundle_dir / "job.log")
    t0 = time.time()
    job_id = bundle_dir.name
    known: dict[str, float] = {}
    seeds = ""
    try:
        from ait_env.hidden.secrets import hidden_seeds_label

        seeds = hidden_seeds_label()   # which hidden sets score this job (every result says so)
        bundle = JobBundle.load(bundle_dir)
        bundle.verify()
        job_id = bundle.job_id
        store = BaselineStore(backend.name, user_dir=baselines_dir)
        factory = executor or executor_factory(backend.name)
        result = _phases(bundle, backend, store, baselines_dir is not None, tee, progress, factory, known, seeds)
    except JobFailed as exc:
        tee(f"job failed: {exc}")
        result = JobResult(job_id=job_id, backend=backend.name, status="job_failed", error=str(exc)[:2000],
                           fault=exc.code, baselines=known, wall_seconds=time.time() - t0)
    except InfraFailed as exc:
        tee(f"cannot run the job: {exc}")
        result = JobResult(job_id=job_id, backend=backend.name, status="infra_failed", error=str(exc)[:2000],
                           fault=getattr(exc, "code", ""), baselines=known, wall_seconds=time.time() - t0)
    except Exception as exc:  # noqa: BLE001 - anything else is ours
        tee(f"infrastructure failure: {type(exc).__name__}: {exc}\n{traceback.format_exc()[-2000:]}")
        result = JobResult(job_id=job_id, backend=backend.name, status="infra_failed",
                           error=f"{type(exc).__name__}: {exc}"[:2000], wall_seconds=time.time() - t0)
    result.log_tail = tee.tail()[-4000:]
    result.hidden_seeds = seeds
    result.save(bundle_dir / "result.json")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--backend-settings", type=Path, help="JSON of BackendSettings (default: conf/backend/local.yaml)")
    ap.add_argument("--baselines-dir", type=Path, help="the user baseline store (<runs_dir>/baselines)")
    ap.add_argument("--measure-pre", action="store_true")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args()
    if args.backend_settings:
        settings = BackendSettings.model_validate_json(args.backend_settings.read_text())
    else:
        from ait_env.conf import load_group

        settings = BackendSettings.model_validate(load_group("backend", "local"))
    if args.measure_pre:
        settings.options["measure_pre"] = True
    result = run(args.bundle, settings, progress=not args.no_progress, baselines_dir=args.baselines_dir)
    print(json.dumps({k: v for k, v in result.model_dump().items() if k not in ("curves", "log_tail")}))
    sys.exit(0 if result.status == "succeeded" else 1)


if __name__ == "__main__":
    # the canonical module's main, not this __main__ copy's: one class object per exception and type
    from ait_env.extras import missing_extras_exit

    with missing_extras_exit("python -m ait_env.runner"):  # a missing extra: one line, exit 3
        from ait_env.runner import main as _main

        raise SystemExit(_main())
