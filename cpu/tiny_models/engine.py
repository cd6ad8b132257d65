"""Continuous batching for the local endpoint: requests join and leave the decode batch at every step.

Many clients (the hidden-eval harness, verifiers' rollouts) send multi-turn conversations; their next
turns come back one by one as the clients parse replies and run tools. A batcher that waits for a batch
and then decodes it to the end splits those turns into many small batches and leaves the model idle
while clients work. :class:`Engine` instead keeps one running batch: :meth:`Engine.admit` prefills new
requests (reusing a finished turn's keys/values from a :class:`~cpu.tiny_models.kv_reuse.PrefixStore`)
and merges them into the batch; :meth:`Engine.step` samples one token for every running row, hands
finished rows to their callbacks, and feeds the rest.

Contract:
- Every request has its own sampling generator, temperature and token limit, so a request's sample
  depends only on its own seed and logits, not on which requests share the batch (up to float
  round-off of batched kernels). Temperature 0 is greedy; ``logprobs`` are of each sampled token under
  the distribution it was sampled from (greedy: temperature 1), like :func:`cpu.tiny_models.model.generate`.
- A row finishes at its stop token (included, ``"stop"``) or at its limit (``"length"``); its
  callback gets a :class:`~cpu.tiny_models.model.Generation`. A ``"stop"`` row's keys/values go to the
  prefix store, so the conversation's next turn prefills only its new tokens.
- Cache layout: slots. One key/value tensor per layer ``[slots, H, C, hd]``; running row ``b`` is slot
  ``b`` and keeps its token ``j`` at column ``j``, so a row attends to columns ``[0, len_b)`` and rows of
  any length decode together (each writes its new key at its own column). Admission writes only the new
  rows' slots; a finished row's slot is refilled by moving the last running row into it (one row's
  copy), so the running rows stay ``0..n-1`` and no step copies the whole batch. The tensors grow by
  doubling (rows or columns) when needed.
- Device: the caches and logits live on the model's device (``TinyLM.to``); the row lengths and the
  sampling stay on the CPU (per-request CPU generators: a GPU run draws what a CPU run would from the
  same logits), so each step moves one ``[rows, vocab]`` logits block to the CPU and a few indices back.
- Not thread-safe: one thread drives an engine (the endpoint's batching worker).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from cpu.tiny_models.kv_reuse import Held, PrefixStore, prefill, reusable
from cpu.tiny_models.model import Generation, KVCache, TinyLM


@dataclass
class EngineRequest:
    prompt_ids: list[int]
    max_tokens: int
    temperature: float
    generator: torch.Generator
    on_done: Callable[[Generation], None]
    on_error: Callable[[BaseException], None]


@dataclass
class _Row:
    req: EngineRequest
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


class Engine:
    """One running decode batch over ``model`` (see the module docstring)."""

    def __init__(self, model: TinyLM, stop_id: int, store: PrefixStore | None = None, *,
                 slots: int = 64, columns: int = 256) -> None:
        self.model = model
        self.stop_id = stop_id
        self.store = store
        cfg = model.cfg
        dev = self.device = model.device
        shape = (slots, cfg.num_key_value_heads, columns, cfg.head_dim)
        self.k = [torch.zeros(shape, device=dev) for _ in range(cfg.num_hidden_layers)]
        self.v = [torch.zeros(shape, device=dev) for _ in range(cfg.num_hidden_layers)]
        self.rows: list[_Row] = []
        self.lens = torch.zeros(0, dtype=torch.long)  # tokens in each running row's cache = its next position (CPU)
        self.logits = torch.zeros(0, cfg.vocab_size, device=dev)  # each running row's next-token logits

    @property
    def alive(self) -> int:
        return len(self.rows)

    @property
    def idle(self) -> bool:
        return not self.rows

    # ------------------------------------------------------------------ capacity
    def _ensure(self, rows: int, columns: int) -> None:
        """Room for ``rows`` running rows of up to ``columns`` tokens (grows by half, copying the running rows)."""
        n, _, c, _ = self.k[0].shape
        if rows <= n and columns <= c:
            return
        n2 = n if rows <= n else max(rows, n + n // 2)
        c2 = c if columns <= c else -(-max(columns, c + c // 2) // 64) * 64
        used, width = len(self.rows), int(self.lens.max()) if len(self.lens) else 0

        def grown(x: torch.Tensor) -> torch.Tensor:
            y = x.new_zeros(n2, x.shape[1], c2, x.shape[3])
            y[:used, :, :width] = x[:used, :, :width]
            return y

        self.k = [grown(x) for x in self.k]
        self.v = [grown(x) for x in self.v]

    # ------------------------------------------------------------------ admission
    @torch.inference_mode()
    def admit(self, reqs: list[EngineRequest]) -> None:
        """Prefill ``reqs`` into free slots (they sample at the next :meth:`step`)."""
        if not reqs:
            return
        self.model.eval()
        held: list[Held | None] = [self.store.take(r.prompt_ids) if self.store is not None else None for r in reqs]
        # continuing turns (few new tokens) and fresh prompts are prefilled apart, so one long fresh
        # prompt does not pad every continuing row's prefill to its length
        for idx in ([i for i in range(len(reqs)) if held[i] is not None],
                    [i for i in range(len(reqs)) if held[i] is None]):
            if idx:
                self._prefill([reqs[i] for i in idx], [held[i] for i in idx])

    def _prefill(self, reqs: list[EngineRequest], held: list[Held | None]) -> None:
        cfg = self.model.cfg
        keep = [reusable(h, r.prompt_ids) for h, r in zip(held, reqs)]
        delta = [r.prompt_ids[k:] for r, k in zip(reqs, keep)]
        K = max(keep)
        part = KVCache(cfg, len(reqs), K + max(len(d) for d in delta), self.device)
        part_mask = torch.zeros(len(reqs), part.capacity, dtype=torch.bool, device=self.device)
        logits = prefill(self.model, part, part_mask, held, keep, delta)
        base = len(self.rows)
        self._ensure(base + len(reqs), max(len(r.prompt_ids) for r in reqs) + 1)
        for i, r in enumerate(reqs):  # part's layout (held | pad | new) -> the slot's (token j at column j)
            b, n_keep, n_new = base + i, keep[i], len(delta[i])
            for layer in range(cfg.num_hidden_layers):
                for dst, src in ((self.k[layer], part.k[layer]), (self.v[layer], part.v[layer])):
                    dst[b, :, :n_keep] = src[i, :, :n_keep]
                    dst[b, :, n_keep:n_keep + n_new] = src[i, :, K:K + n_new]
        self.rows += [_Row(r) for r in reqs]
        self.lens = torch.cat([self.lens, torch.tensor([len(r.prompt_ids) for r in reqs], dtype=torch.long)])
        self.logits = torch.cat([self.logits, logits.float()])

    # ------------------------------------------------------------------ decoding
    @torch.inference_mode()
    def step(self) -> int:
        """Sample one token for every running row, finish rows, feed the rest; returns rows finished."""
        if self.idle:
            return 0
        tok, lp = self._sample()
        tl, ll = tok.tolist(), lp.tolist()
        done: list[int] = []
        for b, row in enumerate(self.rows):
            row.tokens.append(tl[b])
            row.logprobs.append(ll[b])
            if tl[b] == self.stop_id or len(row.tokens) >= row.req.max_tokens:
                done.append(b)
        for b in reversed(done):  # highest first: moving the last row down never moves a finished one
            row = self.rows[b]
            stop = row.tokens[-1] == self.stop_id
            if stop and self.store is not None:
                n = int(self.lens[b])
                self.store.put((row.req.prompt_ids + row.tokens[:-1], [x[b, :, :n].clone() for x in self.k],
                                [x[b, :, :n].clone() for x in self.v]))
            self._free(b)
            row.req.on_done(Generation(row.tokens, row.logprobs, "stop" if stop else "length"))
        if self.idle:
            return len(done)
        width = int(self.lens.max()) + 1
        self._ensure(len(self.rows), width)
        dev = self.device
        lens = self.lens.to(dev)
        mask = torch.arange(width, device=dev)[None, :] <= lens[:, None]
        feed = torch.tensor([r.tokens[-1] for r in self.rows], dtype=torch.long).to(dev)
        cache = KVCache.slots(self.k, self.v, lens, width)
        self.logits = self.model(feed[:, None], lens[:, None], mask, cache)[:, -1].float()
        self.lens = self.lens + 1
        return len(done)

    def _free(self, b: int) -> None:
        """Drop running row ``b``: the last running row moves into its slot."""
        last = len(self.rows) - 1
        if b != last:
            n = int(self.lens[last])
            for x in self.k + self.v:
                x[b, :, :n] = x[last, :, :n]
            self.rows[b] = self.rows[last]
            self.lens[b] = self.lens[last]
            self.logits[b] = self.logits[last]
        self.rows.pop()
        self.lens = self.lens[:last]
        self.logits = self.logits[:last]

    def _sample(self) -> tuple[torch.Tensor, torch.Tensor]:
        temps = [r.req.temperature for r in self.rows]
        t = torch.tensor([x if x > 0 else 1.0 for x in temps])
        logp = torch.log_softmax(self.logits.cpu() / t[:, None], -1)
        tok = logp.argmax(-1)
        hot = [b for b, x in enumerate(temps) if x > 0]
        if hot:
            probs = logp[hot].exp()
            tok[hot] = torch.cat([torch.multinomial(probs[j], 1, generator=self.rows[b].req.generator)
                                  for j, b in enumerate(hot)])
        return tok, logp.gather(-1, tok[:, None]).squeeze(-1)

    def fail_all(self, exc: BaseException) -> None:
        """Hand ``exc`` to every running row and start over (the batch state may be inconsistent)."""
        rows, self.rows = self.rows, []
        self.lens, self.logits = self.lens[:0], self.logits[:0]
        for r in rows:
            r.req.on_error(exc)
