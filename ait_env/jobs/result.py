"""The result of one job, the contract every backend, the runner and the GPU worker write and read.

``status``: ``succeeded`` | ``job_failed`` (the job itself broke: bad code, divergence, OOM from its own
settings) | ``infra_failed`` (not the job's fault: pod lost, out of stock, our bug). ``post_score`` is the
hidden-eval score of the trained model, ``baselines`` the per-model untrained scores; then wall and
training seconds, USD cost, per-step curves and a log tail. It crosses process boundaries as
``result.json`` (:meth:`JobResult.save`) and as the Runpod handler's output.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

JobStatus = Literal["succeeded", "job_failed", "infra_failed"]


class JobResult(BaseModel):
    job_id: str
    backend: str
    status: JobStatus
    surrogate: bool = False           # True: the score is a formula, not training (stub backend)
    post_score: float | None = None
    post_ci95: float | None = None
    baselines: dict[str, float] = Field(default_factory=dict)
    wall_seconds: float = 0.0
    train_seconds: float = 0.0
    cost_usd: float = 0.0
    curves: dict[str, list[float]] = Field(default_factory=dict)
    #: seconds per phase (e.g. pre_eval, train, post_eval) and throughput figures (train_tokens_per_s)
    timings: dict[str, float] = Field(default_factory=dict)
    error: str = ""
    #: the class of a ``job_failed`` the reward treats apart (``ait_env.episode.reward.FORFEITING_FAULTS``, e.g.
    #: ``"eval_leak"``: the job trained on hidden-eval data), or of an ``infra_failed`` a backend treats apart
    #: (``"slow_machine"``: retried by the local backend); empty otherwise
    fault: str = ""
    log_tail: str = ""
    #: served from the job result cache: nothing was trained or paid for this job; ``cached_from`` is the
    #: job id the result was measured under
    cache_hit: bool = False
    cached_from: str = ""
    #: which hidden-eval seeds scored it: ``published`` or ``private:<8 hex>`` (:mod:`ait_env.hidden.secrets`);
    #: empty where no hidden set was used (the stub's formula)
    hidden_seeds: str = ""
    #: the worker that ran the job (GPU worker only, ``gpu/worker.py``): its image revision, versions, GPUs,
    #: model files and the isolation of the training tree (``gpu.selfcheck.SelfCheck.summary``)
    worker: dict[str, Any] = Field(default_factory=dict)

    def save(self, path: Path) -> None:
        """Write this result to ``path`` atomically (a reader sees the old file or the whole new one)."""
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(self.model_dump_json(indent=1))
        os.replace(tmp, path)
