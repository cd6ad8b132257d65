"""The settings a job runs with, the contract between whoever sends a job and whoever runs it.

:class:`BackendSettings` (name, model catalog, bounds, options) is what a backend is built from and, cut
down by :func:`worker_settings`, what the runner in a worker gets; :class:`RunnerSettings` are the
runner's own knobs, part of every executing backend's ``options``; :class:`WorkerOptions` adds the
worker's trainer executor and its options (the ``gpu-local`` and ``runpod`` backends both send jobs to
the GPU worker). :data:`TokenCounter` is how validation counts prompt tokens with a backend's tokenizers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

#: the GPU worker's training uid (its jail, ``gpu/isolation.py``): dedicated (the image creates ``ait-train``
#: with it); no other process may use it. Workers sharing one machine need one each (``$AIT_TRAINING_UID``,
#: set by whoever starts them): a worker kills every process of its uid before and after a request, so two
#: workers on one uid would kill each other's training
DEFAULT_TRAINING_UID = 61000
TRAINING_UID_ENV = "AIT_TRAINING_UID"
#: seconds a worker allows a job beyond its wall-clock bound for the pre and post hidden evals (and a
#: baseline request in all): the worker kills the job after it, and a fleet bounds an attempt by it
EVAL_ALLOWANCE_S = 1800.0


class ModelInfo(BaseModel):
    name: str
    role: str = ""          # e.g. "small", "larger"
    params: str = ""


class BackendBounds(BaseModel):
    max_steps: int = 200
    batch_size: int = 512
    group_size: int = 32
    seq_len: int = 8192
    max_tokens: int = 2048
    wall_clock_minutes: int = 60


class BackendSettings(BaseModel):
    name: str
    surrogate: bool = False
    models: list[ModelInfo] = Field(default_factory=list)
    bounds: BackendBounds = Field(default_factory=BackendBounds)
    cost_usd_per_job: float = 0.0
    options: dict[str, Any] = Field(default_factory=dict)
    #: serve identical jobs from the run's job result cache (<runs_dir>/job_cache.sqlite) instead of
    #: training them again (:mod:`ait_env.jobs.cache`)
    job_cache: bool = False


#: prompt tokens of (model, messages, tool schemas), or None when the backend has no tokenizer for it
TokenCounter = Callable[[str, list[Any], list[Any]], "int | None"]


class RunnerSettings(BaseModel):
    """The generic phases' knobs (part of every executing backend's ``options``)."""

    model_config = ConfigDict(extra="forbid")

    eval_every: int = 10            # eval points: hidden-eval subset every N steps (0 = off)
    eval_subset: int = 100          # instances of the hidden set used for eval points
    eval_concurrency: int = 300     # the harness runs in its own process; the server batches continuously
    eval_max_tokens: int = 160      # per-turn cap of the hidden eval (tiny models stop at <|im_end|> anyway)
    eval_limit: int | None = None   # tests only: score the first N hidden instances instead of all
    #: fresh questions the trained model is also scored on (the outcome check, ait_env/hidden/outcome.py: a
    #: model far better on the hidden set than on these was trained on it); at most as many as the hidden
    #: instances scored; 0 turns the check off
    outcome_fresh: int = Field(150, ge=0)
    measure_pre: bool = False       # measure the job's base model even when a pin holds

    @classmethod
    def of(cls, options: dict[str, Any]) -> "RunnerSettings":
        """The generic phases' knobs out of a backend's ``options`` (the executor's and the backend's own keys
        are left to them)."""
        return cls.model_validate({k: v for k, v in options.items() if k in cls.model_fields})


class WorkerOptions(RunnerSettings):
    """The options of a backend whose jobs the GPU worker runs: the runner's, plus the worker's trainer
    executor and that executor's own options (passed to it unchanged)."""

    #: the worker's trainer executor: "gpu" (prime-rl), "local" (the tiny CPU models: tests)
    executor: str = "gpu"
    #: the executor's own options, passed to it unchanged
    executor_options: dict[str, Any] = Field(default_factory=dict)


def worker_settings(settings: BackendSettings) -> BackendSettings:
    """What the worker's runner gets from a backend's settings: its name, models and bounds, and as
    ``options`` the runner's own (defaults filled in) plus ``executor_options``; the orchestrator's keys
    stay with the orchestrator, and a worker never serves from a job cache."""
    runner = RunnerSettings.of(settings.options).model_dump()
    extra = dict(settings.options.get("executor_options") or {})
    return settings.model_copy(update={"options": {**runner, **extra}, "job_cache": False})
