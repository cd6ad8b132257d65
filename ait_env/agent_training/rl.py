"""GRPO on a real LLM agent through ``AIT/JobWriting-v0``: verifiers plays the episodes, the project's GRPO
update learns from exactly the tokens that were sampled.

Per step (:meth:`AgentGRPO.step`):

1. ``groups`` task instances (rows of the verifiers environment ``ait-job-writing``, in text tool mode: the
   env's whole system prompt, the model writes ``<tool_call>`` blocks, observations come back as user
   messages), each rolled out ``group_size`` times by **verifiers' own rollout code**
   (:func:`ait_env.integrations.verifiers_v0.run_groups`: ``Environment._run_group_states``) against the agent's
   endpoint (:class:`ait_env.agent_models.serve.AgentEndpoint`), which records every sampled turn's prompt ids,
   sampled ids and behaviour logprobs (``ait_record``). The jobs the episodes submit run on the run's backend
   (``local``: really trained on this machine).
2. Rewards are the env's. An ``infra_failed`` episode (verifiers records it as the rollout's error, its reward
   NaN) is **dropped**: it gets no advantage and no gradient, and a group with fewer than two kept rollouts is
   left out; nothing is ever scored 0 for our failure.
3. Advantages are reward − group mean (``grpo``), the sequences are each rollout's turns
   (:func:`cpu.grpo.rollout_sequences`: one sequence when each turn's prompt extends the last),
   and one optimizer step of :func:`cpu.grpo.rl_step` (the inner jobs' update: DPPO-masked
   importance ratio, token mean, gradient clipping) is taken holding the endpoint's lock, so sampling always
   sees whole updates (``train_layers``: only the top layers learn, as in behaviour cloning). A learning rate
   of 0 takes no step at all (the control run: the policy is exactly the
   one it started from, and its wall clock is not spent on a zero update).

:class:`StepRecord` is what one step logs: the batch's rewards (kept), the dropped count, status mix,
validation share, seconds in rollouts and in training, and the update's metrics.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ait_env.agent_models.load import AgentModel
from ait_env.agent_models.serve import AgentEndpoint
from ait_env.agent_models.sft import trainable_parameters
from ait_env.backends import Backend
from cpu import grpo
from ait_env.integrations import verifiers_v0
from ait_env.integrations.verifiers_env import load_environment
from ait_env.jobs.schema import PrimeRL


@dataclass
class RLSettings:
    steps: int = 24
    groups: int = 2               # task instances per step
    group_size: int = 4           # episodes per instance
    lr: float = 2e-6
    temperature: float = 0.7
    max_tokens: int = 3072        # per model turn
    max_norm: float = 1.0
    families: str = "train"
    seed: int = 0
    rows: int = 256               # task instances the run draws from
    train_layers: int = 0         # 0: every layer; k: the top k layers (as behaviour cloning)


@dataclass
class StepRecord:
    step: int
    rewards: list[float]
    dropped: int
    statuses: dict[str, int]
    validated: float
    families: list[str]
    rollout_seconds: float
    train_seconds: float
    lr: float
    metrics: dict[str, float] = field(default_factory=dict)
    rollouts: list[dict[str, Any]] = field(default_factory=list)

    @property
    def mean(self) -> float | None:
        return sum(self.rewards) / len(self.rewards) if self.rewards else None


def prime_rl(s: RLSettings) -> PrimeRL:
    """The update's settings in the job schema's terms (what :func:`cpu.grpo.rl_step` reads)."""
    return PrimeRL.model_validate({
        "max_steps": max(1, s.steps), "seq_len": 8192, "batch_size": s.groups * s.group_size,
        "group_size": s.group_size, "sampling": {"temperature": s.temperature, "max_tokens": s.max_tokens},
        "optim": {"type": "adamw", "lr": s.lr, "weight_decay": 0.0, "max_norm": s.max_norm},
        "scheduler": {"type": "constant"}, "loss": {"type": "default"}, "algo": {"type": "grpo"}})


class AgentGRPO:
    """GRPO on ``agent`` through the env (module docstring). Use as a context manager."""

    def __init__(self, agent: AgentModel, backend: Backend, settings: RLSettings,
                 overrides: dict[str, Any] | None = None, optimizer_state: dict[str, Any] | None = None) -> None:
        self.agent = agent
        self.s = settings
        self.p = prime_rl(settings)
        self.rng = random.Random(settings.seed)
        self.endpoint = AgentEndpoint(agent, seed=settings.seed)
        self.vf_env = load_environment(backend=backend, families=settings.families, eval_families="heldout",
                                       num_examples=settings.rows, num_eval_examples=0, seed=settings.seed,
                                       overrides=overrides, tool_format="text", env_threads=16)
        trainable_parameters(agent.model, settings.train_layers)   # the optimizer takes what requires grad
        self.opt = grpo.make_optimizer(agent.model, self.p, 1.0) if settings.lr > 0 else None
        if optimizer_state and self.opt is not None:
            self.opt.load_state_dict(optimizer_state)
        self._client: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __enter__(self) -> "AgentGRPO":
        self.endpoint.start()
        # one event loop for the client's whole life, as the rollout worker (cpu/rollout_worker.py): the
        # client's pooled connections belong to the loop they were opened in, and a step run in a fresh loop
        # (asyncio.run) lost its first rollout to "Event loop is closed" on every step after the first
        self._loop = asyncio.new_event_loop()
        self._client = verifiers_v0.make_client(base_url=self.endpoint.base_url, timeout=7200.0)
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            if self._loop is not None and self._client is not None:
                self._loop.run_until_complete(self._client.close())
        finally:
            if self._loop is not None:
                self._loop.close()
            self._loop, self._client = None, None
            self.endpoint.stop()

    def pick(self, step: int) -> list[int]:
        """The dataset rows of ``step`` (a seeded draw without replacement within a step)."""
        rng = random.Random(f"{self.s.seed}:{step}")
        return rng.sample(range(len(self.vf_env.get_dataset())), self.s.groups)

    def step(self, step: int) -> StepRecord:
        t0 = time.perf_counter()
        rows = self.pick(step)
        groups = verifiers_v0.rollout_inputs(self.vf_env, rows, self.s.group_size)
        sampling = {"temperature": self.s.temperature, "max_tokens": self.s.max_tokens,
                    "extra_body": {"ait_record": True}}
        assert self._loop is not None, "AgentGRPO.step runs inside `with AgentGRPO(...)`"
        results = self._loop.run_until_complete(
            verifiers_v0.run_groups(self.vf_env, self._client, self.endpoint.model_name, groups, sampling))
        t1 = time.perf_counter()
        rewards: list[float] = []
        advs: list[float] = []
        seqs: list[list[grpo.TrainSeq]] = []
        statuses: Counter[str] = Counter()
        dropped, validated, kept_n = 0, 0.0, 0
        families = [g[0]["info"]["family"] for g in groups]
        rollouts: list[dict[str, Any]] = []
        for group, res in zip(groups, results):
            kept = []
            for r in res:
                records = [t for t in self.endpoint.pop_records(r["response_ids"]) if t is not None]
                reward = r.get("reward")
                m = r.get("metrics") or {}
                status = "infra_failed" if m.get("ait_infra_failed") else ("scored" if m.get("ait_scored") else None)
                ok = r.get("error") is None and reward is not None and math.isfinite(float(reward))
                rollouts.append({"family": group[0]["info"]["family"], "instance": group[0]["info"]["instance"],
                                 "reward": float(reward) if ok else None, "error": r.get("error"),
                                 "turns": r.get("turns"), "validated": m.get("ait_validated"),
                                 "scored": m.get("ait_scored"), "tokens": sum(len(t.completion_ids) for t in records)})
                if not ok:
                    dropped += 1
                    statuses["dropped"] += 1
                    continue
                statuses[status or ("validated" if m.get("ait_validated") else "not_validated")] += 1
                validated += float(m.get("ait_validated") or 0.0)
                kept.append((float(reward), grpo.rollout_sequences(records)))
            kept_n += len(kept)
            if len(kept) < 2:
                rewards += [k[0] for k in kept]
                continue
            group_advs = grpo.advantages([k[0] for k in kept], len(kept), "grpo")
            for (reward, seq), a in zip(kept, group_advs):
                rewards.append(reward)
                advs.append(a)
                seqs.append(seq)
        self.endpoint.clear_records()
        metrics: dict[str, float] = {}
        lr = self.s.lr
        if self.opt is not None and seqs:
            with self.endpoint.lock:   # sampling sees whole weight updates
                lr, metrics = grpo.rl_step(self.agent.model, self.opt, seqs, advs, self.p, step, 1.0,
                                           self.agent.tok.pad_id, micro_batch=4)
                if metrics:
                    self.endpoint.weights_updated()
        t2 = time.perf_counter()
        return StepRecord(step=step, rewards=rewards, dropped=dropped, statuses=dict(statuses),
                          validated=validated / max(1, kept_n), families=families, rollout_seconds=t1 - t0,
                          train_seconds=t2 - t1, lr=lr, metrics=metrics, rollouts=rollouts)
