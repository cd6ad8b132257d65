"""The episode reward: ``R = w_v·V + w_q·Q + w_s·S`` (weights in ``conf/reward/default.yaml``).

- ``V`` validation: ``validation_decay ** (attempt - 1)`` for the attempt that validated; 0 if the
  episode never validated.
- ``Q`` job quality: ``q_post·post + q_uplift·U``. ``post`` is the trained model's hidden-eval score
  in [0, 1]; ``U`` maps the signed uplift ``d = post - best_pre`` (``best_pre`` = best untrained
  baseline among the allowed models) to [0, 1], normalised by the headroom on each side:
  ``U = 0.5 + 0.5·d/(1 - best_pre)`` for gains, ``U = 0.5 + 0.5·d/best_pre`` for losses
  (0.5 = no change, 1.0 = perfect score, 0.0 = dropped to zero). A job that died because of the
  job itself has ``Q = 0``.
- ``S`` train speed, for scored jobs that improved the model (``post > best_pre``), else 0: on GPU backends
  ``max(0, 1 - train_seconds / wall_clock_limit)``; on the local CPU backend, whose wall time depends on the
  machine and its load, ``1 - (steps x batch_size) / (max_steps x max_batch_size)`` (:func:`training_share`:
  the rollouts the job trains on over the bounds', the same on every machine; ``Backend.speed_measure``). Speed only breaks ties between *successful* jobs: a job that
  changes nothing (constant reward, lr 0) finishes fastest, and must not outrank a slower real job
  that also failed to lift the model.

Statuses (``info["reward"]["status"]``):

- ``scored``: validated, trained and evaluated; the formula above.
- ``job_failed``: validated but died at run time because of the job: ``R = w_v·V`` (Q = S = 0). A job
  stopped for a fault that voids its validation (:data:`FORFEITING_FAULTS`: it trained on hidden-eval
  data, or handed the model tools other than the family's, which the probe would have refused had it
  seen them) is scored as a refused submission: ``V = 0``, ``R = 0``.
- ``invalid``: a parsable job was submitted but never validated: ``R = 0``.
- ``unparsable``: no parsable submission at all (never submitted, or job.toml / Python did not
  parse): ``R = unparsable_reward`` (−0.1).
- ``infra_failed``: the infrastructure failed (pod lost, out of stock, our bug, budget refusal).
  **Missing is not zero**: ``total`` is ``None``; the gym ``step`` returns 0.0 and
  ``info["reward"]["drop"]`` is True. Trainers must drop such episodes, not learn from them.

Research episodes (``env.max_jobs_per_episode > 1``): the agent may run several jobs. :func:`episode_reward`
scores each job as if it were the episode's only job (``R_k``: its own ``V`` from the attempts that job
took, its ``Q`` and ``S``); :func:`combine` keeps the best and charges the research::

    R = max_k R_k - charge
    charge = research.per_extra_job * (trained jobs after the first trained one) + research.per_usd * (their USD)

over the ``n`` jobs that ran, in the order they were dispatched (ties: the earlier job). A batch
(``submit_jobs``) of k jobs is k jobs, charged as if submitted one after another; only the wall clock differs
(the longest job of the batch, not the sum). A job the backend served from its result cache (an identical job
ran before: ``cache_hit``) costs nothing and is not charged the per-job term. A one-job episode is charged nothing, so its
reward is the single-job formula whatever the limit. The episode's breakdown is the best job's (``V``,
``Q``, ``S``, ``post``, ...) with ``total`` less the charge, ``jobs`` (every job's own breakdown),
``best_job`` (its index in ``jobs``), ``charge`` and ``end`` (why the episode ended). Its status is
``scored`` when the best job scored, ``job_failed`` when every job that ran died.

**No voiding**: an episode's reward is decided by the jobs that *ran* (``scored`` or ``job_failed``). A job
that failed on our side (``infra_failed``) is dropped alone: it stays in ``jobs`` with its status, is never
the best job and is never charged, and the jobs that ran keep their scores. Only an episode in which no job
ran and one was lost on our side is ``infra_failed`` (dropped). Otherwise an agent expecting a low reward
could erase it with a later job that makes our side fail (:func:`ran`).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, Field

#: ``JobResult.fault`` codes that void the job's validation: the probe refuses such a job when it sees it, so
#: one that hid it until training must not score more than a refused submission (0)
FORFEITING_FAULTS = frozenset({"eval_leak", "foreign_tools"})

Status = Literal["scored", "job_failed", "invalid", "unparsable", "infra_failed"]
#: why an episode ended: its last allowed job ran, the budget was spent, the agent called ``finish``, the
#: turn limit, the submit_job attempts ran out, an infrastructure failure, the outer loop stopped it (a turn its
#: parser could not read, after jobs ran: :meth:`ait_env.env.JobWritingEnv.end_episode`)
End = Literal["", "job_limit", "budget", "finish", "turn_limit", "attempts", "infra_failed", "aborted"]


class RewardWeights(BaseModel):
    validation: float = 0.35
    quality: float = 0.60
    speed: float = 0.05


class QualityWeights(BaseModel):
    post: float = 0.25
    uplift: float = 0.75


class ResearchCharge(BaseModel):
    """What an episode of several jobs pays for the jobs after its first (reward units)."""

    per_extra_job: float = Field(0.02, ge=0.0)
    per_usd: float = Field(0.05, ge=0.0)


class RewardSettings(BaseModel):
    weights: RewardWeights = Field(default_factory=RewardWeights)
    quality: QualityWeights = Field(default_factory=QualityWeights)
    research: ResearchCharge = Field(default_factory=ResearchCharge)
    validation_decay: float = Field(0.5, ge=0.0, le=1.0)
    unparsable_reward: float = -0.1


class RewardBreakdown(BaseModel):
    status: Status
    total: float | None          # None only for infra_failed
    V: float = 0.0
    Q: float = 0.0
    S: float = 0.0
    post: float | None = None
    best_pre: float | None = None
    uplift: float | None = None  # post - best_pre
    U: float | None = None
    attempts: int = 0            # submit_job calls made
    validated_attempt: int | None = None
    drop: bool = False           # True: trainers must drop this episode (infra_failed)
    reason: str = ""
    job_id: str | None = None    # a job's own breakdown: its id
    cost_usd: float = 0.0        # a job's own breakdown: what it cost
    jobs: list[RewardBreakdown] = Field(default_factory=list)  # every job that ran, each scored alone
    best_job: int | None = None  # the index in ``jobs`` of the job the reward counts
    charge: float = 0.0          # research charge subtracted from the best job's reward
    end: End = ""
    cache_hit: bool = False      # a job's own breakdown: served from the backend's result cache (not charged)
    batch: int | None = None     # a job's own breakdown: which dispatch ran it (0, 1, ...; a batch shares one)

    @property
    def gym_reward(self) -> float:
        return 0.0 if self.total is None else self.total


def uplift_score(post: float, best_pre: float) -> float:
    """Map the signed uplift over ``best_pre`` to [0, 1] (0.5 = no change)."""
    post = min(1.0, max(0.0, post))
    best_pre = min(1.0, max(0.0, best_pre))
    d = post - best_pre
    if d >= 0:
        head = 1.0 - best_pre
        return 0.5 if head <= 0 else 0.5 + 0.5 * d / head
    return 0.5 + 0.5 * d / best_pre  # best_pre > 0 here since d < 0


def validation_score(validated_attempt: int | None, s: RewardSettings) -> float:
    if validated_attempt is None:
        return 0.0
    return s.validation_decay ** (validated_attempt - 1)


def episode_reward(status: Status, s: RewardSettings, *, attempts: int, validated_attempt: int | None = None,
                   post: float | None = None, best_pre: float | None = None, train_seconds: float | None = None,
                   wall_clock_limit_s: float | None = None, train_fraction: float | None = None,
                   reason: str = "", fault: str = "") -> RewardBreakdown:
    """Compute the reward and its breakdown for a finished episode (``fault``: a failed job's
    ``JobResult.fault``). ``S`` is ``1 - train_fraction`` when it is given (the share of the bounds' training
    cost the job used: :func:`training_share`), else ``1 - train_seconds / wall_clock_limit_s``."""
    w = s.weights
    if status == "infra_failed":
        return RewardBreakdown(status=status, total=None, attempts=attempts, drop=True,
                               validated_attempt=validated_attempt, reason=reason,
                               V=validation_score(validated_attempt, s))
    if status == "unparsable":
        return RewardBreakdown(status=status, total=s.unparsable_reward, attempts=attempts, reason=reason)
    if status == "invalid":
        return RewardBreakdown(status=status, total=0.0, attempts=attempts, reason=reason)
    V = validation_score(validated_attempt, s)
    if status == "job_failed" and fault in FORFEITING_FAULTS:
        return RewardBreakdown(status=status, total=0.0, V=0.0, attempts=attempts, validated_attempt=validated_attempt,
                               best_pre=best_pre, reason=reason or fault)
    if status == "job_failed":
        return RewardBreakdown(status=status, total=w.validation * V, V=V, attempts=attempts,
                               validated_attempt=validated_attempt, best_pre=best_pre, reason=reason)
    if post is None or best_pre is None or not math.isfinite(post) or not math.isfinite(best_pre):
        raise ValueError("a scored episode needs finite post and best_pre scores")
    U = uplift_score(post, best_pre)
    Q = s.quality.post * post + s.quality.uplift * U
    S = 0.0
    if post > best_pre:
        if train_fraction is not None:
            S = max(0.0, min(1.0, 1.0 - train_fraction))
        elif train_seconds is not None and wall_clock_limit_s:
            S = max(0.0, min(1.0, 1.0 - train_seconds / wall_clock_limit_s))
    total = w.validation * V + w.quality * Q + w.speed * S
    return RewardBreakdown(status=status, total=total, V=V, Q=Q, S=S, post=post, best_pre=best_pre,
                           uplift=post - best_pre, U=U, attempts=attempts,
                           validated_attempt=validated_attempt, reason=reason)


def training_share(steps: int, batch_size: int, max_steps: int, max_batch_size: int) -> float:
    """The share of the bounds' training cost a job used, independent of the machine and its load: the
    rollouts it trains on (``steps x batch_size``) over the most the bounds allow. The speed term of a
    backend whose wall time measures the machine more than the job (the local CPU backend) uses it."""
    return min(1.0, (steps * batch_size) / max(1, max_steps * max_batch_size))


def ran(job: RewardBreakdown) -> bool:
    """Whether a job counts toward its episode's reward: it ran (``scored`` or ``job_failed``). A job lost on
    our side (``infra_failed``) does not: it is dropped alone, never the episode's jobs that ran."""
    return job.status != "infra_failed"


def best_job(jobs: list[RewardBreakdown]) -> int:
    """The index of the job that ran with the highest reward of its own (ties: the earlier); jobs lost on our
    side are never the best (:func:`ran`). ``jobs`` must hold at least one job that ran."""
    counted = [i for i in range(len(jobs)) if ran(jobs[i])]
    if not counted:
        raise ValueError("best_job needs a job that ran; an episode whose jobs were all lost is infra_failed")
    return max(counted, key=lambda i: (jobs[i].gym_reward, -i))


def research_charge(jobs: list[RewardBreakdown], s: RewardSettings) -> float:
    """``per_extra_job·(trained jobs after the first trained one) + per_usd·(their USD)``: a job served from the
    cache is free wherever it stands, so the charge does not depend on which of two identical jobs of one batch
    happened to train and which was served (a race between their threads); a job lost on our side is not
    charged either (:func:`ran`)."""
    trained = [j for j in jobs if ran(j) and not j.cache_hit]
    later = trained[1:]
    return (s.research.per_extra_job * len(later)
            + s.research.per_usd * sum(j.cost_usd for j in later))


def combine(jobs: list[RewardBreakdown], s: RewardSettings, *, attempts: int, end: End,
            reason: str = "") -> RewardBreakdown:
    """The episode's breakdown from its jobs' own (:func:`episode_reward` of each, ``status`` scored, job_failed or
    infra_failed): the best job that ran, less :func:`research_charge`. Jobs lost on our side are dropped alone
    (kept in ``jobs``, never best, never charged); only when no job ran is the episode ``infra_failed``."""
    if not jobs:
        raise ValueError("combine needs at least one job; an episode without a job is composed directly")
    if not any(ran(j) for j in jobs):
        failed = jobs[-1]
        return failed.model_copy(update={"attempts": attempts, "jobs": list(jobs), "end": "infra_failed",
                                         "reason": reason or failed.reason})
    best = best_job(jobs)
    charge = research_charge(jobs, s)
    b = jobs[best]
    assert b.total is not None
    return b.model_copy(update={"total": b.total - charge if charge else b.total, "attempts": attempts,
                                "jobs": list(jobs), "best_job": best, "charge": charge, "end": end,
                                "reason": reason or b.reason, "job_id": b.job_id,
                                "cost_usd": sum(j.cost_usd for j in jobs)})
