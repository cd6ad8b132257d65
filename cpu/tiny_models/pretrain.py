"""Deterministic pretraining of a local tiny model on the flawed-teacher corpus (:mod:`cpu.tiny_models.corpus`).

- Data: encoded transcripts (token ids + 0/1 mask of assistant tokens, :func:`corpus.encode_corpus`),
  one pass in a seeded order. Batches are cut from windows of the permutation: examples of one family
  (same opening tokens) sorted by length and cut into chunks of 2 rows; chunks are packed into batches
  of 8 (several families per batch: one-family batches made training unstable), the batch order is
  shuffled with the same seed.
- Speed (CPU, one thread per model): :func:`shared_prefix_loss_fn` computes the prefix the rows of a
  chunk share (system prompt + tool list + user header, ~30% of the tokens) once, uses plain causal
  attention (right padding never needs a mask) and the LM head only on assistant tokens; together
  ~35% faster than :func:`loss_fn` through :meth:`TinyLM.forward`, with the same loss and gradients
  (tested).
- Copy warm-up: a tiny model does not discover copying (induction heads) from the transcripts within a
  few minutes of CPU (a 1000-step run left digit copies at chance, loss 2.3/token, and every family
  at 0). So training starts with ``drill_steps`` steps of *copy drills* (:func:`make_drills`: random
  windows of real transcript tokens, each repeated once, loss on the repeat), which forms the copy
  mechanism in ~200 steps of short sequences; ``drill_mix`` of the transcript phase's examples stay
  drills. The transcripts then teach what to copy where.
- Loss: next-token cross entropy on assistant tokens only (content, tool calls, ``<|im_end|>``), mean
  over those tokens in the batch.
- Optimizer: AdamW (betas 0.9/0.95, weight decay on matrices only), linear warmup then cosine decay to
  ``min_lr_frac`` of the peak; gradient clipping at 1.0.
- Determinism: ``torch.manual_seed``, ``torch.use_deterministic_algorithms(True)`` and a fixed thread
  count (set by the caller; the build uses 1 thread per model process): two runs with the same corpus,
  config and thread count give bitwise-identical weights.
- Output (:func:`save_model_dir`): ``config.json``, ``model.safetensors``, ``generation_config.json``,
  ``tokenizer.json``, ``tokenizer_config.json`` (with the chat template), ``special_tokens_map.json`` and
  ``ait_model.json`` (name, role, params, build seed, corpus hash, pretraining config and time, measured
  base scores).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from cpu.tiny_models.model import Attention, TinyConfig, TinyLM
from cpu.tiny_models.tokenizer import ChatTokenizer


@dataclass
class PretrainConfig:
    steps: int = 600
    batch_size: int = 24
    lr: float = 3e-3
    min_lr_frac: float = 0.1
    warmup_frac: float = 0.05
    weight_decay: float = 0.05
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    seed: int = 0
    seq_len: int = 1536
    sort_window: int = 16    # batches per length-sorted window
    drill_steps: int = 400   # copy-drill warm-up steps (part of the lr schedule)
    drill_batch: int = 32
    drill_mix: float = 0.1   # share of drills among the transcript phase's examples
    group_rows: int = 2      # rows of one family next to each other in a batch (share the prompt)


Example = tuple[list[int], list[int]]  # (ids, loss mask)


def make_drills(examples: list[Example], n: int, seed: int, start_id: int, end_id: int,
                repeats: int = 3, span: tuple[int, int] = (6, 24)) -> list[Example]:
    """``n`` copy drills: each is ``repeats`` x (``<|im_start|>`` w ``<|im_end|>`` w ``<|im_end|>``) for a random
    window ``w`` of a random transcript; the loss is on the second copy of each window."""
    rng = random.Random(f"drills:{seed}")
    out: list[Example] = []
    for _ in range(n):
        ids, msk = [], []
        for _ in range(repeats):
            src = examples[rng.randrange(len(examples))][0]
            k = rng.randint(*span)
            a = rng.randrange(0, max(1, len(src) - k))
            w = src[a:a + k]
            ids += [start_id] + w + [end_id] + w + [end_id]
            msk += [0] * (len(w) + 2) + [1] * (len(w) + 1)
        out.append((ids, msk))
    return out


def lr_at(step: int, cfg: PretrainConfig) -> float:
    """Warmup then cosine over drill_steps + steps (one schedule for both phases)."""
    total = cfg.steps + cfg.drill_steps
    warm = max(1, int(cfg.warmup_frac * total))
    if step < warm:
        return cfg.lr * (step + 1) / warm
    frac = (step - warm) / max(1, total - warm)
    lo = cfg.lr * cfg.min_lr_frac
    return lo + (cfg.lr - lo) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))


def _group_key(ex: Example, n: int = 24) -> tuple[int, ...]:
    return tuple(ex[0][:n])


def batch_plan(examples: list[Example], cfg: PretrainConfig) -> list[list[int]]:
    """Indices of each step's batch. A seeded permutation is cut into windows; inside a window the
    examples of each family (same opening tokens) are sorted by length and cut into chunks of
    ``group_rows``; the chunks are shuffled and packed into batches, so a batch mixes several families
    (batches of one family made training unstable at lr 6e-3: 2 of 6 runs diverged) while the rows of a
    chunk share their family's prompt (:func:`shared_prefix_loss_fn`) and have similar lengths. The
    batch order is shuffled with the same seed. Cycles through the data if needed."""
    rng = random.Random(f"pretrain-order:{cfg.seed}")
    need = cfg.steps * cfg.batch_size
    order: list[int] = []
    while len(order) < need:
        perm = list(range(len(examples)))
        rng.shuffle(perm)
        order += perm
    order = order[:need]
    win = cfg.batch_size * cfg.sort_window
    g = max(1, min(cfg.group_rows, cfg.batch_size))
    batches: list[list[int]] = []
    for w in range(0, need, win):
        groups: dict[tuple[int, ...], list[int]] = {}
        for i in order[w:w + win]:
            groups.setdefault(_group_key(examples[i]), []).append(i)
        chunks: list[list[int]] = []
        for key in sorted(groups):
            members = sorted(groups[key], key=lambda i: len(examples[i][0]))
            chunks += [members[j:j + g] for j in range(0, len(members), g)]
        rng.shuffle(chunks)
        flat = [i for ch in chunks for i in ch]
        bs = [flat[j:j + cfg.batch_size] for j in range(0, len(flat), cfg.batch_size)]
        rng.shuffle(bs)
        batches += bs
    return batches[:cfg.steps]


def batch_loss(model: TinyLM, examples: list[Example], idx: list[int], pad_id: int, seq_len: int) -> torch.Tensor:
    """Mean loss over the assistant tokens of a batch, computed per run of rows with the same opening
    tokens (each run shares its prompt: :func:`shared_prefix_loss_fn`); same value and gradients as one
    :func:`loss_fn` over the whole padded batch."""
    runs: list[list[int]] = []
    for i in idx:
        if runs and _group_key(examples[runs[-1][0]]) == _group_key(examples[i]):
            runs[-1].append(i)
        else:
            runs.append([i])
    # rows that share their opening with no other row (all copy drills) go in padded batches of similar
    # lengths: one forward for many short rows instead of one per row, the same loss
    singles = sorted((r[0] for r in runs if len(r) == 1), key=lambda i: len(examples[i][0]))
    runs = [r for r in runs if len(r) > 1]
    cur: list[int] = []
    cur_tokens = 0
    for i in singles:
        n = min(seq_len, len(examples[i][0]))   # the longest row so far: the batch's padded width
        if cur and n * (len(cur) + 1) > 1.25 * (cur_tokens + n):
            runs.append(cur)
            cur, cur_tokens = [], 0
        cur.append(i)
        cur_tokens += n
    if cur:
        runs.append(cur)
    counts = [sum(sum(examples[i][1][1:seq_len]) for i in r) for r in runs]
    total = max(1, sum(counts))
    loss = None
    for r, n in zip(runs, counts):
        if n == 0:
            continue
        part = shared_prefix_loss_fn(model, *collate(examples, r, pad_id, seq_len)) * (n / total)
        loss = part if loss is None else loss + part
    if loss is None:
        return sum(p.sum() for p in model.parameters()) * 0.0
    return loss


def collate(examples: list[Example], idx: list[int], pad_id: int, seq_len: int) -> tuple[torch.Tensor, ...]:
    T = min(seq_len, max(len(examples[i][0]) for i in idx))
    ids = torch.full((len(idx), T), pad_id, dtype=torch.long)
    att = torch.zeros(len(idx), T, dtype=torch.long)
    msk = torch.zeros(len(idx), T)
    for r, i in enumerate(idx):
        a, m = examples[i]
        n = min(T, len(a))
        ids[r, :n] = torch.tensor(a[:n])
        att[r, :n] = 1
        msk[r, :n] = torch.tensor(m[:n], dtype=torch.float32)
    return ids, att, msk


def loss_fn(model: TinyLM, ids: torch.Tensor, att: torch.Tensor, msk: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy on the masked (assistant) tokens, through :meth:`TinyLM.forward`."""
    positions = (att.cumsum(-1) - 1).clamp(min=0)
    logits = model(ids, positions, att.bool())[:, :-1]
    tgt = ids[:, 1:]
    m = msk[:, 1:]
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), tgt.reshape(-1), reduction="none")
    return (ce * m.reshape(-1)).sum() / m.sum().clamp(min=1.0)


def fast_loss_fn(model: TinyLM, ids: torch.Tensor, att: torch.Tensor, msk: torch.Tensor) -> torch.Tensor:
    """:func:`loss_fn` for right-padded batches, ~15-20% faster: plain causal attention (real tokens
    only ever see earlier real tokens, so the padding mask is not needed) and the LM head only at the
    masked positions. The model's own forward pass (:meth:`TinyLM.residual_stream`) up to the final norm
    (``tests/cpu/tiny_models/test_pretrain.py`` checks the loss against :meth:`TinyLM.forward`)."""
    B, T = ids.shape
    x = model.residual_stream(ids, torch.arange(T)[None].expand(B, T))
    sel = (msk[:, 1:] > 0) & (att[:, 1:] > 0)
    if not bool(sel.any()):
        return x.sum() * 0.0
    logits = model.lm_head(model.model.norm(x[:, :-1][sel]))
    return F.cross_entropy(logits.float(), ids[:, 1:][sel])


def make_optimizer(model: TinyLM, cfg: PretrainConfig) -> torch.optim.Optimizer:
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    rest = [p for n, p in model.named_parameters() if p.ndim < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": rest, "weight_decay": 0.0}], lr=cfg.lr, betas=cfg.betas)


def training_plan(examples: list[Example], cfg: PretrainConfig, start_id: int, end_id: int,
                  ) -> tuple[list[Example], list[list[int]]]:
    """(all examples, per-step batch indices): the drill warm-up, then transcripts mixed with drills."""
    n_mix = int(round(cfg.drill_mix * cfg.steps * cfg.batch_size / max(1e-9, 1 - cfg.drill_mix)))
    drills = make_drills(examples, cfg.drill_steps * cfg.drill_batch + n_mix, cfg.seed, start_id, end_id)
    warm, mix = drills[:cfg.drill_steps * cfg.drill_batch], drills[cfg.drill_steps * cfg.drill_batch:]
    plan: list[list[int]] = []
    if cfg.drill_steps:
        wcfg = PretrainConfig(steps=cfg.drill_steps, batch_size=cfg.drill_batch, seed=cfg.seed, sort_window=1,
                              group_rows=cfg.drill_batch)
        plan += batch_plan(warm, wcfg)
    base = len(warm)
    main = examples[:max(0, cfg.steps * cfg.batch_size - len(mix))] + mix
    mcfg = PretrainConfig(steps=cfg.steps, batch_size=cfg.batch_size, seed=cfg.seed, sort_window=cfg.sort_window,
                          group_rows=cfg.group_rows)
    plan += [[base + i for i in b] for b in batch_plan(main, mcfg)]
    return warm + main, plan


def common_prefix(ids: torch.Tensor, att: torch.Tensor) -> int:
    """Length of the token prefix shared by every row (and real in every row)."""
    same = (ids == ids[:1]).all(0) & (att > 0).all(0)
    bad = (~same).nonzero()
    return int(bad[0]) if len(bad) else ids.shape[1]


def shared_prefix_loss_fn(model: TinyLM, ids: torch.Tensor, att: torch.Tensor, msk: torch.Tensor) -> torch.Tensor:
    """:func:`fast_loss_fn` computing the prefix that all rows share (a family's system prompt, tool list
    and user header: ~30% of a transcript) once instead of once per row; the rows attend to the shared
    keys/values, and gradients through them add up exactly as for per-row copies. Each layer's projections
    and RoPE are the model's own (:meth:`Attention.qkv`); only the attention is arranged around the
    shared prefix. Same loss (tested)."""
    B, T = ids.shape
    P = common_prefix(ids, att)
    if B == 1 or P < 8 or P >= T - 1:
        return fast_loss_fn(model, ids, att, msk)
    S = T - P
    cos, sin = model.rope(torch.arange(T)[None])                            # [1, 1, T, hd]
    cp, sp, cs, ss = cos[..., :P, :], sin[..., :P, :], cos[..., P:, :], sin[..., P:, :]
    mask = torch.ones(S, T, dtype=torch.bool).tril(diagonal=P)               # suffix queries: prefix + causal
    xp = model.model.embed_tokens(ids[:1, :P])
    xs = model.model.embed_tokens(ids[:, P:])

    def qkv(a: Attention, h: torch.Tensor, cos_: torch.Tensor, sin_: torch.Tensor,
            ) -> tuple[torch.Tensor, ...]:
        q, k, v = a.qkv(h, cos_, sin_)
        return (q, *a.repeat_kv(k, v))

    for layer in model.model.layers:
        a = layer.self_attn
        qp, kp, vp = qkv(a, layer.input_layernorm(xp), cp, sp)
        qs, ks, vs = qkv(a, layer.input_layernorm(xs), cs, ss)
        op = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True)
        kall = torch.cat([kp.expand(B, -1, -1, -1), ks], dim=2)
        vall = torch.cat([vp.expand(B, -1, -1, -1), vs], dim=2)
        os_ = F.scaled_dot_product_attention(qs, kall, vall, attn_mask=mask)
        xp = xp + a.o_proj(op.transpose(1, 2).reshape(1, P, -1))
        xs = xs + a.o_proj(os_.transpose(1, 2).reshape(B, S, -1))
        xp = xp + layer.mlp(layer.post_attention_layernorm(xp))
        xs = xs + layer.mlp(layer.post_attention_layernorm(xs))
    x = torch.cat([xp.expand(B, -1, -1), xs], dim=1)
    sel = (msk[:, 1:] > 0) & (att[:, 1:] > 0)
    if not bool(sel.any()):
        return x.sum() * 0.0
    logits = model.lm_head(model.model.norm(x[:, :-1][sel]))
    return F.cross_entropy(logits.float(), ids[:, 1:][sel])


def pretrain(model_cfg: TinyConfig, examples: list[Example], cfg: PretrainConfig, pad_id: int, *,
             start_id: int, end_id: int, progress: bool = True, label: str = "pretrain",
             on_step: Callable[[int, float], None] | None = None) -> tuple[TinyLM, dict[str, Any]]:
    """Train a fresh model (copy drills, then transcripts); returns (model, stats)."""
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(cfg.seed)
    model = TinyLM(model_cfg)
    opt = make_optimizer(model, cfg)
    data, plan = training_plan(examples, cfg, start_id, end_id)
    losses: list[float] = []
    t0 = time.perf_counter()
    tokens = 0
    bar = _Bar(len(plan), label, enabled=progress)
    model.train()
    for step, idx in enumerate(plan):
        lr = lr_at(step, cfg)
        for g in opt.param_groups:
            g["lr"] = lr
        tokens += sum(min(cfg.seq_len, len(data[i][0])) for i in idx)
        loss = batch_loss(model, data, idx, pad_id, cfg.seq_len)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        losses.append(float(loss.detach()))
        bar.update(step + 1, sum(losses[-20:]) / len(losses[-20:]))
        if on_step:
            on_step(step, losses[-1])
    bar.close()
    model.eval()
    secs = time.perf_counter() - t0
    k = max(1, len(losses) // 10)
    curve = [round(sum(losses[j:j + k]) / len(losses[j:j + k]), 4) for j in range(0, len(losses), k)]
    return model, {"seconds": secs, "steps": len(plan), "tokens": tokens, "tokens_per_s": tokens / max(secs, 1e-9),
                   "loss_first": sum(losses[:k]) / k, "loss_last": sum(losses[-k:]) / k, "loss_curve": curve}


class _Bar:
    """A rich progress bar (plain prints when rich is missing or disabled)."""

    def __init__(self, total: int, label: str, enabled: bool) -> None:
        self.enabled = enabled
        self.total = total
        self.prog = None
        if enabled:
            try:
                from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

                self.prog = Progress(TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("loss {task.fields[loss]:.3f}"), TimeRemainingColumn())
                self.task = self.prog.add_task(label, total=total, loss=float("nan"))
                self.prog.start()
            except ImportError:
                self.prog = None

    def update(self, n: int, loss: float) -> None:
        if self.prog is not None:
            self.prog.update(self.task, completed=n, loss=loss)

    def close(self) -> None:
        if self.prog is not None:
            self.prog.stop()


#: MKL's CNR branch codes (``mkl_cbwr.h``) as ``mkl_cbwr_get(MKL_CBWR_BRANCH)`` returns them.
MKL_BRANCHES = {1: "OFF", 2: "AUTO", 3: "COMPATIBLE", 4: "SSE2", 6: "SSSE3", 7: "SSE4_1", 8: "SSE4_2",
                9: "AVX", 10: "AVX2", 12: "AVX512", 14: "AVX512_E1"}


def mkl_branch() -> str | None:
    """The CNR branch MKL runs in this process (``OFF`` when ``MKL_CBWR`` is unset), read from the MKL
    linked into torch; None where it cannot be read. ``MKL_CBWR=AVX2`` gives ``AUTO`` on a non-Intel CPU
    (MKL's documented fallback), which is why the portable path's weights differ between vendors."""
    import ctypes

    try:
        lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        code = int(lib.mkl_serv_cbwr_get(1))
    except (OSError, AttributeError):
        return None
    return MKL_BRANCHES.get(code, str(code))


def float_path() -> dict[str, Any]:
    """What a build's float arithmetic depends on besides the corpus and the seeds: the same build gives
    bit-identical weights only where all of these agree. The vector instructions matter most: torch's
    CPU kernels and MKL's matrix products take a different code path (and summation order) on an
    AVX512 CPU than on an AVX2 one, and 1,800 pretraining steps turn those last-bit differences into
    different models, and so does MKL's branch, which depends on the CPU's vendor (docs/local_backend.md,
    "Reproducibility across machines")."""
    import platform

    import tokenizers

    return {"machine": platform.machine(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "torch": torch.__version__, "blas": "mkl" if torch.backends.mkl.is_available() else "other",
            "mkl_cbwr": os.environ.get("MKL_CBWR"), "mkl_branch": mkl_branch(),
            "aten_cpu_capability": os.environ.get("ATEN_CPU_CAPABILITY"),
            "threads": torch.get_num_threads(), "tokenizers": tokenizers.__version__}


def weights_hash(model: TinyLM) -> str:
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def save_model_dir(path: str | Path, model: TinyLM, tok: ChatTokenizer, meta: dict[str, Any]) -> Path:
    """All files of a model directory (HF-loadable) plus ``ait_model.json``."""
    path = Path(path)
    model.save(path)
    tok.save(path, model_max_length=model.cfg.max_position_embeddings)
    (path / "ait_model.json").write_text(json.dumps(meta, indent=1, default=jsonable) + "\n")
    return path


def jsonable(x: Any) -> Any:
    if hasattr(x, "__dataclass_fields__"):
        return asdict(x)
    if isinstance(x, tuple):
        return list(x)
    raise TypeError(type(x))
