"""The Tinker side of an episode group: tinker-cookbook's ``EnvGroupBuilder`` of one task instance
(:class:`JobWritingGroupBuilder`: ``group_size`` metered envs on one run backend, rewards centred by the
cookbook's own GRPO), the RL datasets that draw instances per batch (:class:`JobWritingDataset`; held-out
:class:`EvalDataset`; :class:`JobWritingDatasetBuilder`, the chz config a recipe names), and what a group
does when its infrastructure fails (:func:`drop_infra_strategy`). The message-level env they build is
:mod:`ait_env.integrations.tinker`'s."""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Sequence
from typing import Any

import chz
from tinker_cookbook.rl import types
from tinker_cookbook.rl.rollout_strategy import MinViableGroup

from ait_env.config import split_families
from ait_env.integrations.tinker import AdapterConfig, JobWritingMessageEnv, MeteredEnv, _in_thread, get_renderer
from ait_env.observe.ledger import CostRecord
from ait_env.observe.metrics import Prices, episode_metrics, fill_model_share, trained_tokens
from task_families import FAMILY_NAMES

logger = logging.getLogger(__name__)


class JobWritingGroupBuilder(types.EnvGroupBuilder):
    """``group_size`` episodes of the same (family, instance); picklable (envs are built lazily)."""

    def __init__(self, cfg: AdapterConfig, family: str, instance: int, group_size: int, split: str,
                 tags: Sequence[str]) -> None:
        self.cfg = cfg
        self.family = family
        self.instance = instance
        self.group_size = group_size
        self.split = split
        self.tags = list(tags)
        self._made: list[MeteredEnv] = []

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_made"] = []
        return state

    async def make_envs(self) -> Sequence[types.Env]:
        renderer = get_renderer(self.cfg.renderer_name, self.cfg.model_name)
        envs = [MeteredEnv(renderer, JobWritingMessageEnv(self.cfg, self.family, self.instance, self.split),
                           failed_parse_reward=self.cfg.failed_parse_reward, terminate_on_parse_error=True,
                           max_trajectory_tokens=self.cfg.max_trajectory_tokens,
                           max_generation_tokens=self.cfg.max_tokens,
                           context_overflow_reward=self.cfg.context_overflow_reward)
                for _ in range(self.group_size)]
        self._made.extend(envs)
        return envs

    async def compute_group_rewards(self, trajectory_group: list[types.Trajectory],
                                    env_group: Sequence[types.Env]) -> list[tuple[float, types.Metrics]]:
        started = [e for e in self._made if e.message_env.env is not None]
        n_drop = sum(1 for e in started if e.message_env.dropped)
        drop_frac = n_drop / max(1, len(started))
        out: list[dict[str, float]] = []
        prices = Prices.from_dict(self.cfg.prices)
        for traj, env in zip(trajectory_group, env_group, strict=True):
            assert isinstance(env, MeteredEnv)
            me = env.message_env
            total = sum(t.reward for t in traj.transitions)
            m = episode_metrics(me.info.get("reward") if me.finished else None, me.job() if me.finished else None,
                                self.family, me.turns, total, aborted=not me.finished,
                                research="jobs_left" in me.info)
            m.update({"ait/infra_dropped_frac": drop_frac, "ait/llm_usd": me.llm_usd,
                      "ait/llm_tokens_in": float(me.tokens_in), "ait/llm_tokens_out": float(me.tokens_out)})
            n_train = trained_tokens(env.turns)
            m["ait/train_tokens"] = float(n_train)
            if me.env is not None and self.split == "train":
                await _in_thread(self.cfg, me.env.unwrapped.ledger.append, CostRecord(
                    kind="llm_train", episode_id=me.episode_id, tokens_in=n_train, usd=prices.train_usd(n_train),
                    meta={"model": self.cfg.model_name, "run": self.cfg.run_id, "prices_as_of": prices.as_of,
                          "billing": "estimate"}))
            out.append(m)
        catalog = []
        if started and started[0].message_env.info:
            catalog = [b["name"] for b in started[0].message_env.info.get("base_models", [])]
        fill_model_share(out, catalog)
        return [(0.0, m) for m in out]

    async def cleanup(self) -> None:
        for env in self._made:
            try:
                await _in_thread(self.cfg, env.message_env.close)
            except Exception as exc:  # noqa: BLE001 - cleanup must not mask rollout errors
                logger.warning("closing an env failed: %s", exc)
        self._made = []

    def logging_tags(self) -> list[str]:
        return self.tags


def instance_seed(seed: int, stream: str, k: int) -> int:
    """Deterministic instance id for item ``k`` of a stream (resume-safe, no RNG state)."""
    return int(hashlib.sha256(f"{seed}:{stream}:{k}".encode()).hexdigest()[:8], 16)


class JobWritingDataset(types.RLDataset):
    """Batches of ``groups_per_batch`` groups over the training families (round-robin, fresh instances)."""

    def __init__(self, cfg: AdapterConfig, families: Sequence[str], groups_per_batch: int, group_size: int,
                 n_batches: int, seed: int = 0) -> None:
        if not families:
            raise ValueError("no training families: every family is marked held_out in conf/family/")
        self.cfg = cfg
        self.families = list(families)
        self.groups_per_batch = groups_per_batch
        self.group_size = group_size
        self.n_batches = n_batches
        self.seed = seed

    def get_batch(self, index: int) -> Sequence[types.EnvGroupBuilder]:
        out = []
        for j in range(self.groups_per_batch):
            k = index * self.groups_per_batch + j
            fam = self.families[k % len(self.families)]
            out.append(JobWritingGroupBuilder(self.cfg, fam, instance_seed(self.seed, "train", k), self.group_size,
                                              "train", tags=["train", fam]))
        return out

    def __len__(self) -> int:
        return self.n_batches


class EvalDataset(types.RLDataset):
    """One batch: ``heldout_groups`` groups per held-out family (tag ``heldout``) and ``train_groups`` per
    training family (tag ``train``), on fixed instances disjoint from the training stream."""

    def __init__(self, cfg: AdapterConfig, heldout: Sequence[str], train: Sequence[str], heldout_groups: int,
                 train_groups: int, group_size: int, seed: int = 0) -> None:
        self.builders: list[types.EnvGroupBuilder] = []
        for arm, fams, n in (("heldout", heldout, heldout_groups), ("train", train, train_groups)):
            for fam in fams:
                for k in range(n):
                    self.builders.append(JobWritingGroupBuilder(
                        cfg, fam, instance_seed(seed, f"eval:{fam}", k), group_size, "eval", tags=[arm, fam]))

    def get_batch(self, index: int) -> Sequence[types.EnvGroupBuilder]:
        return self.builders if index == 0 else []

    def __len__(self) -> int:
        return 1 if self.builders else 0


@chz.chz
class JobWritingDatasetBuilder(types.RLDatasetBuilder):
    """chz builder the cookbook's ``train.Config`` takes; its fields are JSON-friendly (``config.json``)."""

    model_name: str
    renderer_name: str
    group_size: int
    groups_per_batch: int
    n_batches: int
    seed: int = 0
    backend: str = "stub"
    env_overrides_json: str = "{}"
    max_tokens: int = 4096
    max_trajectory_tokens: int | None = None
    eval_heldout_groups: int = 1
    eval_train_groups: int = 0
    eval_group_size: int = 4
    prices_json: str = "{}"
    run_budget_usd: float | None = None
    run_id: str = ""
    backend_factory: str | None = None
    env_threads: int = 64

    def adapter_config(self) -> AdapterConfig:
        return AdapterConfig(model_name=self.model_name, renderer_name=self.renderer_name, backend=self.backend,
                             env_overrides=json.loads(self.env_overrides_json), max_tokens=self.max_tokens,
                             max_trajectory_tokens=self.max_trajectory_tokens, prices=json.loads(self.prices_json),
                             run_budget_usd=self.run_budget_usd, run_id=self.run_id, backend_factory=self.backend_factory,
                             env_threads=self.env_threads)

    def datasets(self) -> tuple[JobWritingDataset, EvalDataset | None]:
        cfg = self.adapter_config()
        train, heldout = split_families(FAMILY_NAMES)
        train_ds = JobWritingDataset(cfg, train, self.groups_per_batch, self.group_size, self.n_batches, self.seed)
        eval_ds = EvalDataset(cfg, heldout, train, self.eval_heldout_groups, self.eval_train_groups,
                              self.eval_group_size, self.seed)
        return train_ds, (eval_ds if len(eval_ds) else None)

    async def __call__(self) -> tuple[types.RLDataset, types.RLDataset | None]:
        get_renderer(self.renderer_name, self.model_name)  # fail early on a missing tokenizer / renderer
        return self.datasets()


def drop_infra_strategy(group_size: int, min_group: int | None = None, max_retries: int = 1,
                        timeout_s: float | None = None) -> MinViableGroup:
    """The cookbook's ``MinViableGroup``: failed episodes (``infra_failed`` raises) leave the group,
    are re-run on a fresh env of the same instance while fewer than ``min_group`` succeeded and
    retries remain, and a group below ``min_group`` is dropped whole (no advantage from too few)."""
    floor = min_group if min_group is not None else max(2, math.ceil(group_size / 2))
    return MinViableGroup(min_successful=min(floor, group_size), max_retries=max_retries,
                          per_rollout_timeout=timeout_s)


__all__ = ["EvalDataset", "JobWritingDataset", "JobWritingDatasetBuilder", "JobWritingGroupBuilder", "drop_infra_strategy",
           "instance_seed"]
