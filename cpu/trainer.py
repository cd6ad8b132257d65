"""The local GRPO trainer: the job's own environment (run by verifiers inside the sandbox) produces
rollouts against the local endpoint; this process learns from exactly the tokens that were sampled.

Per step: pick ``batch_size / group_size`` dataset rows (seeded), publish them on the endpoint's step
channel, wait for the sandboxed rollout worker's results (rewards from the agent's rubric and the
response ids of every turn), look the sampled tokens and behaviour logprobs up in the endpoint's
records, compute group advantages, and take one optimizer step with :mod:`cpu.grpo`
(holding the endpoint's lock, so sampling always sees whole weight updates).

The update is :func:`cpu.grpo.rl_step`: a multi-turn rollout is trained as one sequence when
each turn's prompt + completion is a prefix of the next turn's prompt (the usual case), otherwise each
turn is its own sequence; sequences longer than ``seq_len`` are truncated, like prime-rl.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, ValidationError

from ait_env.jobs import guard
from ait_env.jobs.schema import Job
from cpu import grpo
from cpu.tiny_models.endpoint import LocalEndpoint


class RolloutWorkerError(RuntimeError):
    """The sandboxed rollout worker failed because of the job's code (its error is the job's fault)."""


class _Rollout(BaseModel):
    """One scored rollout as the worker reports it (:func:`ait_env.integrations.verifiers_v0.run_groups`)."""

    model_config = ConfigDict(extra="ignore")
    reward: float | None
    reward_raw: str | None = None
    response_ids: list[str]
    error: str | None = None


class _StepResults(BaseModel):
    model_config = ConfigDict(extra="ignore")
    step: int
    groups: list[list[_Rollout]]
    #: each group's dataset row ``info`` (the training audit replays a stateful family's tool calls on it)
    infos: list[Any] | None = None


def step_results(res: Any, step: int, groups: int, group_size: int) -> list[list[dict[str, Any]]]:
    """The rollout worker's results for ``step`` as plain rollouts, checked against what was asked.

    The worker runs the agent's code in its own process, so whatever it posts is untrusted input: a
    malformed answer, the wrong number of groups or of rollouts per group, or an error it reports is the
    job's fault (:class:`RolloutWorkerError`), never a crash of the trainer."""
    if not isinstance(res, dict):
        raise RolloutWorkerError(f"the rollout worker posted {type(res).__name__} for step {step}, not results")
    try:   # within the guard's bounds: str() and the checks below cannot raise on any value it accepts
        guard.check(res, what=f"the rollout worker's results for step {step}")
    except guard.Refused as exc:
        raise RolloutWorkerError(f"{exc} (your environment's code runs in that process)") from None
    if "error" in res:
        raise RolloutWorkerError(f"rollouts failed at step {step}: {str(res['error'])[:1500]}\n"
                                 f"{str(res.get('traceback', ''))[-1500:]}")
    try:
        parsed = _StepResults.model_validate(res)
    except ValidationError as exc:
        raise RolloutWorkerError(f"the rollout worker's results for step {step} are malformed (your "
                                 f"environment's code runs in that process): {str(exc)[:800]}") from None
    sizes = [len(g) for g in parsed.groups]
    if len(sizes) != groups or any(n != group_size for n in sizes):
        raise RolloutWorkerError(f"step {step} asked for {groups} groups of {group_size} rollouts; the rollout "
                                 f"worker returned groups of sizes {sizes[:20]}")
    out = [[r.model_dump() for r in g] for g in parsed.groups]
    infos = parsed.infos if parsed.infos is not None and len(parsed.infos) == groups else [None] * groups
    for group, info in zip(out, infos):
        for r in group:
            r["info"] = info
    check_rewards(out, step + 1)
    return out


def check_finite_weights(model: Any, step: int) -> None:
    """Refuse weights that a step made NaN or infinite (a learning rate or reward scale the model cannot
    take): serving them would make every later sample, and the hidden eval, fail on our side."""
    import torch

    with torch.no_grad():
        bad = [name for name, p in model.named_parameters() if not bool(torch.isfinite(p).all())]
    if bad:
        raise RolloutWorkerError(f"training diverged at step {step}: the update made {len(bad)} weight tensors "
                                 f"NaN or infinite (e.g. {bad[0]}); lower the learning rate, or keep rewards "
                                 "and advantages in a normal range (e.g. 0..1)")


def check_rewards(groups: list[list[dict[str, Any]]], step: int) -> None:
    """Refuse a step whose rubric returned a non-number, NaN, infinity or a number past
    ±:data:`ait_env.jobs.guard.MAX_MAGNITUDE` for any rollout: advantages and the loss would be NaN (and
    the step's statistics overflow) and every weight with them. The job fails (the agent's rubric is at
    fault) with a message in the agent's terms; nothing is dropped silently."""
    bad = [r for g in groups for r in g if guard.number(r.get("reward")) is None]
    if bad:
        total = sum(len(g) for g in groups)
        shown = bad[0].get("reward_raw") or repr(bad[0].get("reward"))
        raise RolloutWorkerError(f"your rubric returned {shown} at training step {step} (for {len(bad)} of "
                                 f"{total} rollouts); reward functions must return finite numbers within "
                                 f"±{guard.MAX_MAGNITUDE:g} (e.g. 0..1) for every completion the model can produce")


@dataclass
class StepLog:
    step: int
    reward_mean: float
    reward_std: float
    lr: float
    loss_tokens: int
    seconds: float
    rollout_seconds: float
    train_seconds: float
    metrics: dict[str, float] = field(default_factory=dict)
    eval_score: float | None = None


class LocalGRPOTrainer:
    def __init__(self, endpoint: LocalEndpoint, job: Job, dataset_size: int, *, lr_scale: float, seed: int = 0,
                 step_timeout_s: float = 600.0, micro_batch: int = 32, audit: Any = None, watch: Any = None) -> None:
        """``audit``: a :class:`ait_env.probe.training_audit.TrainingAudit` that reviews every recorded turn before
        it is trained on (it raises the job's failure). ``watch``: a :class:`cpu.budget.StepWatch`
        that waits for each step's results under the job's work budget (None: ``step_timeout_s`` of wall clock)."""
        self.audit = audit
        self.watch = watch
        self.ep = endpoint
        self.job = job
        self.p = job.prime_rl
        self.n_rows = max(1, dataset_size)
        self.lr_scale = lr_scale
        self.rng = random.Random(seed)
        self.step_timeout_s = step_timeout_s
        self.micro_batch = micro_batch
        self.opt = grpo.make_optimizer(endpoint.model, self.p, lr_scale)
        self.logs: list[StepLog] = []

    def sampling_args(self) -> dict[str, Any]:
        s = self.p.sampling
        return {"temperature": s.temperature, "max_tokens": s.max_tokens, "extra_body": {"ait_record": True}}

    def run(self, on_step: Callable[[StepLog], None] | None = None,
            eval_fn: Callable[[int], float | None] | None = None) -> list[StepLog]:
        prompts_per_step = max(1, self.p.batch_size // self.p.group_size)
        for step in range(self.p.max_steps):
            t0 = time.perf_counter()
            indices = [self.rng.randrange(self.n_rows) for _ in range(prompts_per_step)]
            self.ep.channel.publish({"step": step, "indices": indices, "group_size": self.p.group_size,
                                     "sampling_args": self.sampling_args(), "model": self.ep.model_name})
            usage = self.watch.usage() if self.watch is not None else None
            try:
                res = (self.watch.wait(step) if self.watch is not None
                       else self.ep.channel.wait_results(step, self.step_timeout_s))
            except TimeoutError:
                raise RolloutWorkerError(f"your environment's rollouts for step {step + 1} did not finish within "
                                         f"{self.step_timeout_s:.0f} s (a hang, or far too slow tools or "
                                         "rubric)") from None
            t1 = time.perf_counter()
            groups = step_results(res, step, prompts_per_step, self.p.group_size)
            rewards: list[float] = []
            rollouts: list[list[grpo.TrainSeq]] = []
            errors = 0
            for group in groups:
                for r in group:
                    rewards.append(float(r["reward"]))
                    records = [t for t in self.ep.pop_records(r["response_ids"]) if t is not None]
                    if self.audit is not None:
                        self.audit.review((t.messages, t.tools, r.get("info")) for t in records)
                    rollouts.append(grpo.rollout_sequences(records))
                    errors += r.get("error") is not None
            advs = grpo.advantages(rewards, self.p.group_size, self.p.algo.type)
            metrics: dict[str, float] = {"rollout_errors": float(errors)}
            if usage is not None and self.watch is not None:   # the step's work: the agent's CPU, the endpoint's
                used = self.watch.usage().minus(usage)
                metrics.update(agent_cpu_s=round(used.cpu_s, 2), endpoint_busy_s=round(used.busy_s, 2))
            with self.ep.lock:   # sampling sees whole weight updates
                lr, trained = grpo.rl_step(self.ep.model, self.opt, rollouts, advs, self.p, step,
                                           self.lr_scale, self.ep.tok.pad_id, self.micro_batch)
                if trained:
                    check_finite_weights(self.ep.model, step + 1)
                    self.ep.weights_updated()
            metrics.update(trained)
            self.ep.clear_records()
            t2 = time.perf_counter()
            mean = sum(rewards) / max(1, len(rewards))
            std = (sum((r - mean) ** 2 for r in rewards) / max(1, len(rewards))) ** 0.5
            log = StepLog(step=step + 1, reward_mean=mean, reward_std=std, lr=lr,
                          loss_tokens=int(metrics.get("tokens", 0)), seconds=t2 - t0, rollout_seconds=t1 - t0,
                          train_seconds=t2 - t1, metrics=metrics)
            if eval_fn is not None:
                log.eval_score = eval_fn(step + 1)
            self.logs.append(log)
            if on_step:
                on_step(log)
        self.ep.channel.finish()
        return self.logs
