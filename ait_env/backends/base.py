"""The backend protocol: what runs a validated job bundle and reports how the trained model scored.

A backend takes a :class:`JobBundle` (see :mod:`ait_env.jobs.bundle`), returns a :class:`JobHandle`
from :meth:`Backend.submit`, and :meth:`Backend.wait` returns a :class:`~ait_env.jobs.result.JobResult`
(the contracts a job crosses, its result and the settings it runs with, live in :mod:`ait_env.jobs`).
Backends also publish their model catalog (name + role) and the bounds they allow.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ait_env.conf import baselines_dir, default_runs_dir
from ait_env.hidden.baselines import BaselineEntry, BaselineStore
from ait_env.jobs.bundle import JobBundle
from ait_env.jobs.cache import JobCache, job_key
from ait_env.jobs.context import JobContext
from ait_env.jobs.result import JobResult
from ait_env.jobs.settings import BackendSettings, ModelInfo, TokenCounter

class JobHandle(BaseModel):
    job_id: str
    backend: str
    meta: dict[str, Any] = Field(default_factory=dict)


class NoOptions(BaseModel):
    """A backend without options: any key in ``options`` is an error."""

    model_config = ConfigDict(extra="forbid")


class BackendOptionsError(ValueError):
    """A backend's ``options`` do not validate; the message names the allowed keys."""


class Backend(abc.ABC):
    """Base class of every backend. Subclasses implement :meth:`submit` and :meth:`wait`.

    Lifecycle: one backend per run, shared by every episode of it. Whoever builds a backend closes it
    (:meth:`close`, or use it as a context manager); an env closes the backend it built from a name and
    never one it was given. ``options`` are validated against :attr:`Options` (a pydantic model; an
    unknown key is an error naming the allowed ones). :attr:`baselines` is the store every reader of
    untrained scores uses (the shipped pins, then the per-user ``$AIT_DATA_DIR/baselines/<name>.json``)."""

    #: the typed ``options`` of this backend
    Options: ClassVar[type[BaseModel]] = NoOptions
    #: what the reward's speed term measures on this backend: "wall_time" (training seconds over the wall
    #: clock bound) or "rollouts" (the rollouts trained on over the bounds': machine-independent, for
    #: backends whose wall time measures the machine's load more than the job)
    speed_measure: ClassVar[str] = "wall_time"

    def __init__(self, settings: BackendSettings, runs_dir: Path | str | None = None) -> None:
        self.settings = settings
        self.runs_dir = Path(runs_dir) if runs_dir is not None else default_runs_dir()
        try:
            self.options = self.Options.model_validate(settings.options)
        except ValidationError as exc:
            allowed = ", ".join(self.Options.model_fields) or "none"
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'options'}: "
                                 f"{'unknown option' if e['type'] == 'extra_forbidden' else e['msg']}"
                                 for e in exc.errors())
            raise BackendOptionsError(f"backend {settings.name!r}: {problems}. Allowed options: {allowed} "
                                      f"(conf/backend/{settings.name}.yaml, or backend.options.<key>=...)") from None
        #: measured baselines: the per-user store (``$AIT_DATA_DIR/baselines``), whatever the run dir
        self.baselines_dir = baselines_dir()
        self.baselines = BaselineStore(settings.name, user_dir=self.baselines_dir)
        self.job_cache = JobCache(self.runs_dir / "job_cache.sqlite") if settings.job_cache else None
        self.closed = False

    @property
    def name(self) -> str:
        return self.settings.name

    @property
    def surrogate(self) -> bool:
        return self.settings.surrogate

    def catalog(self) -> list[ModelInfo]:
        return list(self.settings.models)

    def built_weights_hash(self, model: str) -> str:  # noqa: ARG002
        """The hash of the weights this machine would train for ``model`` ("" when unknown): a pinned
        baseline recorded on other weights is then flagged to the agent (the job re-measures it)."""
        return ""

    def job_context(self, family: str, models: Sequence[str] | None = None) -> JobContext:
        """The orchestrator's :class:`~ait_env.jobs.context.JobContext` of a job of ``family``: this process's
        hidden set and seeds, ``models`` (default: the backend's base models) and the weights this machine
        would build for each (:meth:`built_weights_hash`)."""
        from ait_env.hidden.secrets import job_context

        models = [m.name for m in self.settings.models] if models is None else list(models)
        weights = {m: self.built_weights_hash(m) for m in models}
        return job_context(family, models, weights)

    @property
    def executor(self) -> str | None:
        """The trainer executor this backend's jobs run on (``options.executor`` where the backend has one;
        None: it trains nothing itself, e.g. the stub)."""
        return getattr(self.options, "executor", None)

    def model_renderers(self) -> dict[str, str]:
        """Chat renderers for models prime-rl's renderer map does not know (model -> renderer name): those
        of the executor the backend runs (:func:`ait_env.runner.executor_renderers`), so what validation
        accepts is what will train."""
        from ait_env.runner import executor_renderers

        return executor_renderers(self.executor, [m.name for m in self.catalog()])

    def token_counter(self) -> TokenCounter | None:
        """Counts prompt tokens with the models' own tokenizers (None: the probe estimates them)."""
        return None

    def estimate_cost_usd(self, bundle: JobBundle) -> float:  # noqa: ARG002
        return self.settings.cost_usd_per_job

    def charge_run_costs(self, ledger: Any) -> Any:  # noqa: ARG002
        """Append to the cost ``ledger`` what the run cost beyond its jobs' own bills and was not charged
        before (a fleet's idle and always-on workers); the env calls it after every job. Default: nothing."""
        return None

    @abc.abstractmethod
    def submit(self, bundle: JobBundle) -> JobHandle:
        """Start (or enqueue) the job; must return quickly."""

    @abc.abstractmethod
    def wait(self, handle: JobHandle, timeout: float | None = None) -> JobResult:
        """Block until the job finished (or ``timeout`` seconds passed: raise TimeoutError)."""

    def measure_baseline(self, family: str, model: str) -> "BaselineEntry":
        """Score the untrained ``model`` on ``family``'s hidden set (used by scripts/seed_baselines.py)."""
        raise NotImplementedError(f"backend {self.name!r} cannot measure baselines")

    def run(self, bundle: JobBundle, timeout: float | None = None) -> JobResult:
        """Submit and wait; with ``job_cache`` on, an identical job's result is served instead (free,
        ``cache_hit``), and identical jobs running at once are trained once. A result scored on other hidden
        sets than this process's is ours (:meth:`check_hidden_seeds`)."""
        return self.check_hidden_seeds(self._run(bundle, timeout))

    def check_hidden_seeds(self, result: JobResult) -> JobResult:
        """``result``, or ``infra_failed`` when it was scored with other hidden-eval seeds than this process
        uses (a GPU worker not given the private seeds scores with the published ones): never the agent's
        fault, never scored against another run's baselines."""
        if result.status != "succeeded" or not result.hidden_seeds:
            return result
        from ait_env.hidden.secrets import FILE_ENV, WORKER_ENV, hidden_seeds_label, private_path

        mine = hidden_seeds_label()
        if result.hidden_seeds == mine:
            return result
        return result.model_copy(update={"status": "infra_failed", "error": (
            f"the job was scored with the {result.hidden_seeds} hidden-eval seeds, but this run uses {mine}: "
            f"the worker must get this installation's seeds as {WORKER_ENV} (the content of {private_path()}, "
            f"or of ${FILE_ENV}; on Runpod the endpoint secret ait_seeds, gpu/README.md), or run with "
            "AIT_HIDDEN_SEEDS=published to reproduce the pinned figures")})

    def _run(self, bundle: JobBundle, timeout: float | None) -> JobResult:
        if self.job_cache is None:
            return self.wait(self.submit(bundle), timeout=timeout)
        model = bundle.job.job.base_model
        job = self.job_context(bundle.manifest.family, [model])
        key = job_key(bundle, self.settings.model_dump(exclude={"job_cache"}), job.weights_hash(model),
                      job.hidden_set_hash)
        data, hit = self.job_cache.get_or_run(
            key, lambda: self.wait(self.submit(bundle), timeout=timeout).model_dump(), bundle.manifest.family)
        result = JobResult.model_validate(data)
        if hit:
            result = result.model_copy(update={"job_id": bundle.job_id, "cache_hit": True, "cost_usd": 0.0,
                                               "cached_from": data["job_id"]})
        return result

    def run_batch(self, bundles: list[JobBundle], timeout: float | None = None) -> list[JobResult]:
        """Run several jobs at once (a research episode's ``submit_jobs``): each is submitted and waited for
        in its own thread (:meth:`run`, so the job cache applies to each, and a backend that bounds how many
        jobs train at once, e.g. the local backend's ``max_parallel_jobs``, makes the others wait in
        :meth:`submit`); the results come back in the bundles' order once all finished. A job whose run
        raises is an ``infra_failed`` result naming the exception; this method never raises for a job."""
        import time
        from concurrent.futures import ThreadPoolExecutor

        def one(bundle: JobBundle) -> JobResult:
            t0 = time.time()
            try:
                return self.run(bundle, timeout=timeout)
            except Exception as exc:  # noqa: BLE001 - any backend crash is an infrastructure failure
                return JobResult(job_id=bundle.job_id, backend=self.name, status="infra_failed",
                                 error=f"{type(exc).__name__}: {exc}", wall_seconds=time.time() - t0)

        if len(bundles) <= 1:
            return [one(b) for b in bundles]
        with ThreadPoolExecutor(max_workers=len(bundles), thread_name_prefix="ait-batch") as pool:
            return list(pool.map(one, bundles))

    def close(self) -> None:
        """Release what the backend holds (running jobs, servers, pods); idempotent."""
        self.closed = True

    def __enter__(self) -> "Backend":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
