"""GRPO on the local models: advantages, the token-level policy-gradient loss, optimizers and schedules
that honour a job's ``[prime_rl]`` surface.

- Advantages (``algo``): ``grpo`` = reward − group mean (no std normalisation, as prime-rl);
  ``max_rl`` = (reward − mean) / mean (0 when the group mean is 0).
- Loss (``loss``), token mean over every model-sampled token of the batch, with the importance ratio
  ``r = exp(logp − logp_behaviour)`` to the sampling policy:
  ``default``: ``−adv_tau·A·r`` on tokens whose ratio stays inside ``[1 − dppo_mask_low, 1 + dppo_mask_high]``
  (others are masked, DPPO-style) plus ``kl_tau·(log r)²``; ``ipo``: the same with a symmetric
  trust region ``|r − 1| ≤ ipo_threshold``.
- Optimizers: ``adamw`` (betas, weight decay), ``sgd``, ``sign_sgd`` (update = −lr·sign(grad)),
  ``muon`` (``torch.optim.Muon`` for 2-D weights, AdamW for the rest); gradient clipping at ``max_norm``.
- Schedules: ``constant``; ``linear`` (warmup from min_lr, hold, then linear decay to min_lr over the
  last ``decay_steps``); ``cosine`` (warmup, then cosine to min_lr at ``max_steps``).
- Learning-rate mapping: jobs are written at Qwen scale (lr ~1e-6..1e-5); a ~0.1–1M-parameter model
  needs a larger step. The trainer multiplies ``lr`` and ``min_lr`` by ``lr_scale`` (config, logged in
  the result) — a documented, monotone mapping, so a job's lr ranking is preserved.
- Training sequences (:func:`rollout_sequences`): a multi-turn rollout is one sequence when each turn's
  prompt + completion is a prefix of the next turn's prompt (the usual case), else one sequence per turn;
  only the sampled tokens are trained.

:func:`rl_step` is the one GRPO update every caller takes (the local trainer, and the in-process labs in
``research/``): scored rollouts and their advantages in, one optimizer step of the job's schedule out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from ait_env.jobs.schema import PrimeRL

#: A training sequence: (token ids, 0/1 mask of the tokens the policy sampled, behaviour logprobs aligned
#: with the ids).
TrainSeq = tuple[list[int], list[int], list[float]]


class Turn(Protocol):
    """One sampled turn of a rollout (the endpoint's record, or the in-process evaluator's turn)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]


def advantages(rewards: list[float], group_size: int, algo: str = "grpo") -> list[float]:
    """Per-rollout advantages; rollouts of one group are contiguous."""
    out: list[float] = []
    for g in range(0, len(rewards), group_size):
        grp = rewards[g:g + group_size]
        mean = sum(grp) / len(grp)
        for r in grp:
            if algo == "max_rl":
                out.append(0.0 if mean == 0 else (r - mean) / mean)
            else:
                out.append(r - mean)
    return out


@dataclass
class Batch:
    """Right-padded sequences with a mask of the tokens the policy sampled (the ones trained)."""

    input_ids: torch.Tensor      # [B, T]
    attention_mask: torch.Tensor  # [B, T] 1 for real tokens
    loss_mask: torch.Tensor      # [B, T] 1 where token t was sampled by the policy
    old_logprobs: torch.Tensor   # [B, T] behaviour logprobs at sampled positions
    advantages: torch.Tensor     # [B]


def rollout_sequences(turns: Sequence[Turn]) -> list[TrainSeq]:
    """Training sequences of one rollout from its turns (module docstring)."""
    if not turns:
        return []
    if all((b.prompt_ids[:len(a.prompt_ids) + len(a.completion_ids)] == a.prompt_ids + a.completion_ids)
           for a, b in zip(turns, turns[1:])):
        last = turns[-1]
        ids = last.prompt_ids + last.completion_ids
        mask, lps = [0] * len(ids), [0.0] * len(ids)
        for t in turns:
            s = len(t.prompt_ids)
            for j, lp in enumerate(t.logprobs):
                mask[s + j], lps[s + j] = 1, lp
        return [(ids, mask, lps)]
    return [(t.prompt_ids + t.completion_ids, [0] * len(t.prompt_ids) + [1] * len(t.completion_ids),
             [0.0] * len(t.prompt_ids) + list(t.logprobs)) for t in turns]


def make_batch(seqs: list[TrainSeq], advs: list[float], pad_id: int, max_len: int) -> Batch:
    """``seqs``: (token ids, 0/1 sampled mask, logprobs aligned with ids); truncated to ``max_len``."""
    T = min(max_len, max(len(s[0]) for s in seqs))
    B = len(seqs)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    att = torch.zeros(B, T, dtype=torch.long)
    lm = torch.zeros(B, T)
    olp = torch.zeros(B, T)
    for i, (tok, m, lp) in enumerate(seqs):
        n = min(T, len(tok))
        ids[i, :n] = torch.tensor(tok[:n])
        att[i, :n] = 1
        lm[i, :n] = torch.tensor(m[:n], dtype=torch.float32)
        olp[i, :n] = torch.tensor(lp[:n], dtype=torch.float32)
    return Batch(ids, att, lm, olp, torch.tensor(advs, dtype=torch.float32))


def policy_loss(logp: torch.Tensor, batch: Batch, loss_cfg: Any) -> tuple[torch.Tensor, dict[str, float]]:
    """``logp [B, T-1]``: current logprobs of tokens 1..T-1. Returns (loss, metrics)."""
    mask = batch.loss_mask[:, 1:]
    old = batch.old_logprobs[:, 1:]
    adv = batch.advantages[:, None]
    log_ratio = (logp - old) * mask
    ratio = torch.exp(log_ratio)
    if getattr(loss_cfg, "type", "default") == "ipo":
        keep = (ratio - 1).abs() <= loss_cfg.ipo_threshold
    else:
        keep = (ratio >= 1 - loss_cfg.dppo_mask_low) & (ratio <= 1 + loss_cfg.dppo_mask_high)
    keep = keep.float() * mask
    n = mask.sum().clamp(min=1.0)
    pg = -(loss_cfg.adv_tau * adv * ratio * keep).sum() / n
    kl = (loss_cfg.kl_tau * log_ratio.pow(2) * mask).sum() / n
    keep_d, ratio_d = keep.detach(), ratio.detach()
    metrics = {"masked_frac": float(1 - keep_d.sum() / n), "kl": float(kl.detach()),
               "ratio_mean": float((ratio_d * mask).sum() / n), "tokens": float(n)}
    return pg + kl, metrics


class SignSGD(torch.optim.Optimizer):
    def __init__(self, params: Any, lr: float, weight_decay: float = 0.0) -> None:
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # noqa: ARG002
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is None:
                    continue
                if g["weight_decay"]:
                    p.mul_(1 - g["lr"] * g["weight_decay"])
                p.add_(torch.sign(p.grad), alpha=-g["lr"])


class _Combined:
    """Muon for matrices + AdamW for the rest, stepped together."""

    def __init__(self, opts: list[torch.optim.Optimizer]) -> None:
        self.opts = opts
        self.param_groups = [g for o in opts for g in o.param_groups]

    def step(self) -> None:
        for o in self.opts:
            o.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.opts:
            o.zero_grad(set_to_none=set_to_none)


def make_optimizer(model: torch.nn.Module, p: PrimeRL, lr_scale: float) -> Any:
    o = p.optim
    lr = o.lr * lr_scale
    params = [x for x in model.parameters() if x.requires_grad]
    if o.type == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=(o.betas1, o.betas2), weight_decay=o.weight_decay)
    if o.type == "sgd":
        return torch.optim.SGD(params, lr=lr, weight_decay=o.weight_decay)
    if o.type == "sign_sgd":
        return SignSGD(params, lr=lr, weight_decay=o.weight_decay)
    if o.type == "muon":
        mats = [x for x in params if x.ndim == 2 and x.shape[0] != getattr(model.cfg, "vocab_size", -1)]
        rest = [x for x in params if all(x is not m for m in mats)]
        muon_cls = getattr(torch.optim, "Muon", None)
        opts: list[torch.optim.Optimizer] = []
        if muon_cls is not None and mats:
            opts.append(muon_cls(mats, lr=lr, momentum=o.mu, weight_decay=o.weight_decay))
        else:
            rest = params
        betas2 = o.betas2 if "betas2" in o.model_fields_set else 0.95
        opts.append(torch.optim.AdamW(rest, lr=lr, betas=(o.betas1, betas2), weight_decay=o.weight_decay))
        return _Combined(opts)
    raise ValueError(f"unknown optimizer {o.type!r}")


def lr_at(step: int, p: PrimeRL, lr_scale: float) -> float:
    """Learning rate for optimizer step ``step`` (0-based) under the job's schedule."""
    base = p.optim.lr * lr_scale
    s = p.scheduler
    if s.type == "constant":
        return base
    lo = s.min_lr * lr_scale
    warm = s.warmup_steps
    if step < warm:
        return lo + (base - lo) * (step + 1) / warm
    if s.type == "linear":
        decay_start = p.max_steps - s.decay_steps
        if step < decay_start or s.decay_steps == 0:
            return base
        frac = (step - decay_start + 1) / s.decay_steps
        return base + (lo - base) * min(1.0, frac)
    total = max(1, p.max_steps - warm)
    frac = min(1.0, (step - warm) / total)
    return lo + (base - lo) * 0.5 * (1 + math.cos(math.pi * frac))


def set_lr(opt: Any, lr: float) -> None:
    for g in opt.param_groups:
        g["lr"] = lr


def train_step(model: Any, opt: Any, batch: Batch, p: PrimeRL, lr: float, micro_batch: int = 32,
               micro_tokens: int = 8192) -> dict[str, float]:
    """One optimizer step over ``batch`` (gradient accumulated over micro-batches).

    The loss is the token mean over *every* sampled token of the batch. Sequences whose advantage is 0
    contribute only the ``kl_tau·(log r)²`` term, whose gradient is 0 at the sampling policy (one update
    per batch: the weights have not moved since sampling, so ``log r`` is 0 up to float noise); they are
    skipped. The others are sorted by length and cut into micro-batches of at most ``micro_batch`` rows
    and ``micro_tokens`` padded tokens, each trimmed to its longest row (less padding, same math)."""
    model.train()
    dev = next(model.parameters()).device   # the batch is built on the CPU; each micro-batch moves there
    set_lr(opt, lr)
    opt.zero_grad(set_to_none=True)
    total_tokens = float(batch.loss_mask[:, 1:].sum().clamp(min=1.0))
    agg: dict[str, float] = {"masked_frac": 0.0, "kl": 0.0, "ratio_mean": 0.0}
    lengths = batch.attention_mask.sum(dim=1).tolist()
    live = sorted((i for i in range(batch.input_ids.shape[0]) if float(batch.advantages[i]) != 0.0),
                  key=lambda i: lengths[i])
    temp = p.sampling.temperature if p.sampling.temperature > 0 else 1.0
    live_tokens = 0.0   # the metrics are means over the tokens of the rows trained (advantage != 0)
    j = 0
    while j < len(live):
        k = j + 1
        while (k < len(live) and k - j < micro_batch
               and (k - j + 1) * max(1, int(lengths[live[k]])) <= micro_tokens):
            k += 1
        rows = torch.tensor(live[j:k])
        j = k
        T = max(2, int(max(lengths[i] for i in rows.tolist())))
        mb = Batch(*(x.to(dev) for x in (batch.input_ids[rows, :T], batch.attention_mask[rows, :T],
                                          batch.loss_mask[rows, :T], batch.old_logprobs[rows, :T],
                                          batch.advantages[rows])))
        if float(mb.loss_mask[:, 1:].sum()) == 0:
            continue
        logp = model.sequence_logprobs(mb.input_ids, mb.attention_mask, temp, only=mb.loss_mask[:, 1:] > 0)
        loss, m = policy_loss(logp, mb, p.loss)
        weight = m["tokens"] / total_tokens
        (loss * weight).backward()
        live_tokens += m["tokens"]
        for key in ("masked_frac", "kl", "ratio_mean"):
            agg[key] += m[key] * m["tokens"]
    for key in ("masked_frac", "kl", "ratio_mean"):
        agg[key] = agg[key] / live_tokens if live_tokens else (1.0 if key == "ratio_mean" else 0.0)
    gnorm = 0.0
    if p.optim.max_norm is not None:
        gnorm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), p.optim.max_norm))
    opt.step()
    agg.update({"grad_norm": gnorm, "lr": lr, "tokens": total_tokens, "live_seqs": float(len(live))})
    return agg


def rl_step(model: Any, opt: Any, rollouts: list[list[TrainSeq]], advs: list[float], p: PrimeRL, step: int,
            lr_scale: float, pad_id: int, micro_batch: int = 32) -> tuple[float, dict[str, float]]:
    """One GRPO update: ``rollouts[i]`` (the training sequences of rollout ``i``, :func:`rollout_sequences`)
    trained with advantage ``advs[i]`` (:func:`advantages`) at step ``step`` of the job's schedule
    (:func:`lr_at`), sequences truncated to the job's ``seq_len``. Returns (learning rate,
    :func:`train_step`'s metrics); when every advantage is 0 no step is taken and the metrics are empty.
    The model is left in eval mode, ready to sample."""
    lr = lr_at(step, p, lr_scale)
    pairs = [(s, a) for r, a in zip(rollouts, advs, strict=True) for s in r]
    if not any(a != 0 for _, a in pairs):
        return lr, {}
    seqs, seq_advs = [s for s, _ in pairs], [a for _, a in pairs]
    metrics = train_step(model, opt, make_batch(seqs, seq_advs, pad_id, p.seq_len), p, lr, micro_batch)
    model.eval()
    return lr, metrics
