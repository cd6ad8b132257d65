"""Per-episode metrics and LLM-token accounting shared by every outer loop (the Tinker trainer, the LLM
agent runner); no trainer library is imported here.

Contract:

- :func:`episode_metrics` turns a finished episode (the env's final ``info`` plus the submitted job, if
  any) into flat numeric metrics named ``ait/...``. The cookbook averages each key over the
  trajectories that carry it, so a key that exists only for some episodes (``ait/post`` only for
  scored ones, ``ait/model/*`` only for validated ones) is a mean over exactly those episodes:

  ``ait/reward``, ``ait/V``, ``ait/Q``, ``ait/S`` (every kept episode); ``ait/post``, ``ait/uplift``,
  ``ait/best_pre`` (scored); ``ait/validated`` (validation rate); ``ait/attempts``, ``ait/turns``;
  ``ait/status/<scored|job_failed|invalid|unparsable|aborted>`` (one-hot: the job status mix;
  ``aborted`` = the outer loop ended the episode: unparsable turn, turn over ``max_tokens``, context
  overflow, an endpoint that kept failing); ``ait/model/<name>`` (one-hot base model of validated jobs: the base-model share);
  ``ait/surface/adopted``, ``ait/surface/beyond_template``, ``ait/surface/n_changed`` and
  ``ait/surface/changed/<group>`` (validated jobs; see :func:`surface_changes`); ``ait/jobs`` (jobs that
  ran; a job lost on our side did not). In an episode of several jobs the job-quality keys (``ait/post``, ``ait/uplift``, ``ait/V``,
  ``ait/Q``, ``ait/S``, the model and surface keys) are the best job's, the one the reward counts; a
  research episode (``research=True``: ``env.max_jobs_per_episode > 1``) adds ``ait/charge`` (the
  research charge), ``ait/end/<job_limit|budget|finish|turn_limit|attempts|aborted|infra_failed>`` (one-hot: how it
  ended; ``infra_failed``: our side lost a later job, the jobs that ran scored it)
  and, with two jobs or more, ``ait/later_job_best`` (a later job beat the first), ``ait/post_gain``
  (the best job's post score minus the first's, when both scored) and ``ait/best_vs_first`` (the best
  job's own reward minus the first's); with a job, ``ait/batch_share`` (the share of the episode's
  dispatches that ran several jobs at once, ``submit_jobs``), ``ait/cache_hits`` (jobs served from the
  cache) and ``ait/job_usd`` (what the episode's jobs cost).
- :func:`surface_changes` compares a job's ``[prime_rl]`` table with the family template's, both
  completed with the schema defaults, and lists the dotted fields that differ. *Adopted* means at
  least one field differs; *beyond_template* means at least one differing field is one the template
  file does not set (the part of the exposed surface the agent had to discover itself).
- :class:`Prices` (USD per million tokens, dated) prices one LLM call: prefill (prompt), cached
  prefill (prefix-cache hits), sampled tokens, and (Tinker) trained tokens (datums sent to
  ``forward_backward``). The ledger records are estimates: the cache hit is assumed for the longest
  common prefix with the previous turn's prompt + response, and train tokens are counted when a
  group finishes (a group the async loop later discards as stale was still billed for sampling).
"""

from __future__ import annotations

import math

import tomllib
from collections import Counter
from dataclasses import dataclass
from functools import cache
from typing import Any

from ait_env.jobs.schema import Job, PrimeRL

STATUSES = ("scored", "job_failed", "invalid", "unparsable", "aborted")
ENDS = ("job_limit", "budget", "finish", "turn_limit", "attempts", "aborted", "infra_failed")  # kept episodes only
SURFACE_GROUPS = ("max_steps", "seq_len", "batch_size", "group_size", "sampling", "optim", "scheduler", "loss",
                  "algo")


@dataclass(frozen=True)
class Prices:
    """USD per million tokens of the policy model, with the date and source they were read from."""

    prefill: float = 0.0
    cached_prefill: float = 0.0
    sample: float = 0.0
    train: float = 0.0
    as_of: str = ""
    source: str = ""

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> Prices:
        d = dict(d or {})
        known = {k: d[k] for k in ("prefill", "cached_prefill", "sample", "train", "as_of", "source") if k in d}
        for k in ("prefill", "cached_prefill", "sample", "train"):
            if k in known:
                known[k] = float(known[k] or 0.0)
        return cls(**known)

    def call_usd(self, prompt_tokens: int, cached_tokens: int, sampled_tokens: int) -> float:
        uncached = max(0, prompt_tokens - cached_tokens)
        return (uncached * self.prefill + cached_tokens * self.cached_prefill + sampled_tokens * self.sample) / 1e6

    def train_usd(self, trained_tokens: int) -> float:
        return trained_tokens * self.train / 1e6


def common_prefix_len(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def trained_tokens(turns: list[tuple[list[int], list[int]]]) -> int:
    """Tokens the cookbook's ``trajectory_to_data`` sends for one trajectory of (prompt, action) turns:
    a turn whose prompt extends the previous prompt + action adds only the new tokens, otherwise it
    starts a new datum (the whole prompt again)."""
    total, prev = 0, None
    for ob, ac in turns:
        if prev is not None and len(prev) <= len(ob) and ob[:len(prev)] == prev:
            total += len(ob) - len(prev) + len(ac)
        else:
            total += len(ob) + len(ac)
        prev = ob + ac
    return total


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


@cache
def _template(family: str) -> tuple[dict[str, Any], frozenset[str]]:
    """(effective [prime_rl] of the family's template as flat dotted keys, keys the template file sets)."""
    from task_families import get_family

    raw = tomllib.loads((get_family(family).template_dir / "job.toml").read_text(encoding="utf-8"))
    table = raw.get("prime_rl", {})
    effective = PrimeRL.model_validate(table).model_dump()
    return _flatten(effective), frozenset(_flatten(table))


def surface_changes(job: Job, family: str) -> tuple[list[str], list[str]]:
    """(fields of ``job``'s ``[prime_rl]`` that differ from the template, those among them that the
    template file does not set). Both sides include the schema defaults."""
    mine = _flatten(job.prime_rl.model_dump())
    tmpl, explicit = _template(family)
    changed = sorted(k for k in set(mine) | set(tmpl) if mine.get(k) != tmpl.get(k))
    beyond = [k for k in changed if k not in explicit]
    return changed, beyond


def model_key(name: str) -> str:
    """Metric-safe short name of a base model ("Qwen/Qwen3-1.7B" -> "Qwen3-1.7B")."""
    return name.rsplit("/", 1)[-1].replace(" ", "_")


def episode_metrics(reward: dict[str, Any] | None, job: Job | None, family: str, turns: int,
                    total_reward: float, aborted: bool = False, research: bool = False) -> dict[str, float]:
    """Metrics of one kept (not dropped) episode. ``reward`` is the env's ``info["reward"]`` (None when
    the adapter aborted the episode); ``total_reward`` is what the trainer learns from (the env's
    reward, or the adapter's parse-error / overflow reward for an aborted episode); ``job``: the job the
    reward counts; ``research``: the episode allowed several jobs (``"jobs_left" in info``)."""
    m: dict[str, float] = {"ait/turns": float(turns), "ait/reward": float(total_reward)}
    status = "aborted" if aborted or reward is None else str(reward["status"])
    for s in STATUSES:
        m[f"ait/status/{s}"] = 1.0 if s == status else 0.0
    if reward is None:
        m.update({"ait/V": 0.0, "ait/Q": 0.0, "ait/S": 0.0, "ait/validated": 0.0})
        return m
    for k in ("V", "Q", "S"):
        m[f"ait/{k}"] = float(reward.get(k) or 0.0)
    m["ait/attempts"] = float(reward.get("attempts") or 0)
    m["ait/validated"] = 1.0 if reward.get("validated_attempt") is not None else 0.0
    if status == "scored":
        for k in ("post", "uplift", "best_pre"):
            if reward.get(k) is not None:
                m[f"ait/{k}"] = float(reward[k])
    jobs = reward.get("jobs") or []
    ran = [i for i, j in enumerate(jobs) if j.get("status") != "infra_failed"]   # a lost job did not run
    m["ait/jobs"] = float(len(ran))
    if research:
        m["ait/charge"] = float(reward.get("charge") or 0.0)
        for e in ENDS:
            m[f"ait/end/{e}"] = 1.0 if reward.get("end") == e else 0.0
        best = reward.get("best_job")
        if len(ran) >= 2 and best is not None:
            m["ait/later_job_best"] = 1.0 if best > ran[0] else 0.0
            first, top = jobs[ran[0]].get("post"), jobs[best].get("post")
            if first is not None and top is not None:
                m["ait/post_gain"] = float(top) - float(first)
            m["ait/best_vs_first"] = (float(jobs[best].get("total") or 0.0)
                                      - float(jobs[ran[0]].get("total") or 0.0))
        if jobs:
            sizes = Counter(j.get("batch") for j in jobs)
            m["ait/batch_share"] = sum(1 for n in sizes.values() if n > 1) / len(sizes)
            m["ait/cache_hits"] = float(sum(1 for j in jobs if j.get("cache_hit")))
            m["ait/job_usd"] = float(sum(j.get("cost_usd") or 0.0 for j in jobs))
    if job is not None and m["ait/validated"]:
        m[f"ait/model/{model_key(job.job.base_model)}"] = 1.0
        changed, beyond = surface_changes(job, family)
        m["ait/surface/adopted"] = 1.0 if changed else 0.0
        m["ait/surface/beyond_template"] = 1.0 if beyond else 0.0
        m["ait/surface/n_changed"] = float(len(changed))
        tops = {c.split(".", 1)[0] for c in changed}
        for g in SURFACE_GROUPS:
            m[f"ait/surface/changed/{g}"] = 1.0 if g in tops else 0.0
    return m


def fill_model_share(metrics: list[dict[str, float]], catalog: list[str]) -> None:
    """Give every validated episode a 0 for the catalog models it did not pick, so that the mean of
    ``ait/model/<name>`` is the share of validated jobs that chose that model."""
    keys = [f"ait/model/{model_key(n)}" for n in catalog]
    for m in metrics:
        if m.get("ait/validated"):
            for k in keys:
                m.setdefault(k, 0.0)


def mean_ci(values: list[float], z: float = 1.96) -> tuple[float | None, float | None]:
    """Mean and the half-width of its normal-approximation 95% interval (None without values)."""
    n = len(values)
    if n == 0:
        return None, None
    mean = sum(values) / n
    if n == 1:
        return mean, None
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, z * sd / math.sqrt(n)
