"""Generation that reuses the keys/values of earlier turns of the same conversation.

A multi-turn rollout re-sends the whole conversation every turn; its prompt is the previous turn's
prompt + completion + the tool results. :func:`generate_cached` prefills only the tokens a held cache
does not cover (positions continue), samples with the KV cache, and drops finished rows from the decode
batch. The logits equal those of a full prefill up to float round-off (same tokens and positions; only
the summation order of the batched kernels differs), so sampling and logprobs follow the same
distribution as :func:`cpu.tiny_models.model.generate`.

- :class:`TurnCache`: per-conversation caches, for callers that know which request continues which
  conversation (the in-process evaluator :mod:`cpu.tiny_models.quick_eval`).
- :class:`PrefixStore`: caches keyed by their token ids, for callers that do not (the OpenAI-compatible
  endpoint's :class:`cpu.tiny_models.engine.Engine`): a new prompt reuses the longest stored sequence that
  ends right before one of its ``<|im_end|>`` tokens. Entries are taken once, bounded in number, and
  must be cleared when the weights change (:meth:`PrefixStore.clear`).
- :func:`prefill` (shared by both): fills a cache for rows that reuse some held tokens and prefill the rest.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from cpu.tiny_models.model import KVCache, TinyLM

Held = tuple[list[int], list[torch.Tensor], list[torch.Tensor]]


class TurnCache:
    """Keys/values of each open conversation kept across turns (``reuse_kv``).

    A turn re-renders and re-tokenizes the conversation exactly as the endpoint does; when the new
    prompt extends the tokens the cache holds, only the new tokens are prefilled (positions continue),
    else the row is prefilled from scratch. The logits are those of a full prefill up to float
    round-off (same tokens, same positions; only the summation order of the batched kernels differs)."""

    def __init__(self) -> None:
        # conversation -> (token ids held, per-layer keys [H, n, hd], per-layer values)
        self.rows: dict[int, tuple[list[int], list[torch.Tensor], list[torch.Tensor]]] = {}


def _sample(logits: torch.Tensor, temperature: float, generator: torch.Generator | list[torch.Generator] | None,
            rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row. ``generator`` may be one generator per original row (``rows`` maps
    batch rows to original rows): then each row's sample depends only on its own generator, not on which
    other rows share the batch (reproducible sampling under dynamic batching). Sampling runs on the CPU
    (the generators' device, whatever the model's): a GPU run draws what a CPU run draws from the same
    logits; the tokens and logprobs come back on the CPU."""
    logits = logits.cpu()
    if temperature <= 0:
        logp = torch.log_softmax(logits.float(), -1)
        tok = logp.argmax(-1)
    else:
        logp = torch.log_softmax(logits.float() / temperature, -1)
        probs = logp.exp()
        if isinstance(generator, list):
            idx = rows.tolist() if rows is not None else list(range(probs.shape[0]))
            tok = torch.stack([torch.multinomial(probs[b], 1, generator=generator[int(i)])[0]
                               for b, i in enumerate(idx)])
        else:
            tok = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


def reusable(held: Held | None, prompt: list[int]) -> int:
    """How many leading tokens of ``prompt`` the held keys/values cover (0: prefill from scratch)."""
    if held is None:
        return 0
    k = len(held[0])
    return k if 0 < k < len(prompt) and prompt[:k] == held[0] else 0


def prefill(model: TinyLM, cache: KVCache, key_mask: torch.Tensor, held: list[Held | None], keep: list[int],
            delta: list[list[int]]) -> torch.Tensor:
    """Fill ``cache`` (and ``key_mask``) for a batch whose row ``i`` reuses ``keep[i]`` held tokens and
    prefills ``delta[i]``; returns each row's next-token logits ``[n, V]``.

    Layout: columns ``[0, K)`` hold the reused keys/values (row ``i`` uses the first ``keep[i]``),
    columns ``[K, K + D)`` the prefilled ones (``K = max(keep)``, ``D = max(len(delta))``); positions
    continue each row's sequence, so the padding columns in between are only masked out."""
    n = len(delta)
    K, D = max(keep), max(len(d) for d in delta)
    for i in range(n):
        if keep[i]:
            _, ks, vs = held[i]  # type: ignore[misc]
            for layer in range(model.cfg.num_hidden_layers):
                cache.k[layer][i, :, :keep[i]] = ks[layer][:, :keep[i]]
                cache.v[layer][i, :, :keep[i]] = vs[layer][:, :keep[i]]
    cache.length = K
    dev = model.device
    ids = torch.zeros(n, D, dtype=torch.long)
    pos = torch.zeros(n, D, dtype=torch.long)
    for i in range(n):
        key_mask[i, :keep[i]] = True
        key_mask[i, K:K + len(delta[i])] = True
        ids[i, :len(delta[i])] = torch.tensor(delta[i], dtype=torch.long)
        pos[i] = keep[i] + torch.arange(D).clamp(max=len(delta[i]) - 1)
    out = model(ids.to(dev), pos.to(dev), key_mask[:, :K + D], cache)
    return out[torch.arange(n, device=dev), torch.tensor([len(d) - 1 for d in delta], device=dev)]


def generate_cached(model: TinyLM, tc: TurnCache, convs: list[int], prompts: list[list[int]],
                    limits: list[int], temperature: float, stop_id: int,
                    generator: torch.Generator | list[torch.Generator] | None,
                    ) -> list[tuple[list[int], list[float], str]]:
    """One turn for ``convs`` (their prompts), reusing ``tc``; returns (tokens, logprobs, finish) per row.

    Finished rows leave the decode batch (their keys/values are stored first), so a few long replies do
    not keep the whole batch busy."""
    cfg = model.cfg
    dev = model.device
    n = len(convs)
    held = [tc.rows.get(c) for c in convs]
    keep = [reusable(h, p) for h, p in zip(held, prompts)]
    delta = [p[k:] for p, k in zip(prompts, keep)]
    K, D, G = max(keep), max(len(d) for d in delta), max(limits)
    cache = KVCache(cfg, n, K + D + G, dev)
    key_mask = torch.zeros(n, K + D + G, dtype=torch.bool, device=dev)
    logits = prefill(model, cache, key_mask, held, keep, delta)
    next_pos = torch.tensor([len(p) for p in prompts], dtype=torch.long, device=dev)
    toks: list[list[int]] = [[] for _ in range(n)]
    lps: list[list[float]] = [[] for _ in range(n)]
    lim = torch.tensor(limits)
    active = torch.arange(n)          # original row of each batch row
    new_tc: dict[int, tuple[list[int], list[torch.Tensor], list[torch.Tensor]]] = {}

    def store(batch_rows: list[int], fed: int) -> None:
        """Save the keys/values of (original) rows that leave the batch; ``fed`` generated tokens are cached."""
        for br in batch_rows:
            i = int(active[br])
            cols = list(range(keep[i])) + list(range(K, K + len(delta[i]))) + \
                list(range(K + D, K + D + min(fed, len(toks[i]))))
            idx = torch.tensor(cols, dtype=torch.long, device=dev)
            new_tc[convs[i]] = (prompts[i] + toks[i][:min(fed, len(toks[i]))],
                                [cache.k[layer][br][:, idx] for layer in range(cfg.num_hidden_layers)],
                                [cache.v[layer][br][:, idx] for layer in range(cfg.num_hidden_layers)])

    for step in range(G):
        tok, lp = _sample(logits, temperature, generator, active)
        tl, ll = tok.tolist(), lp.tolist()
        tok = tok.to(dev)
        finished = []
        for br in range(len(active)):
            i = int(active[br])
            toks[i].append(tl[br])
            lps[i].append(ll[br])
            if tl[br] == stop_id or len(toks[i]) >= int(lim[i]):
                finished.append(br)
        if len(finished) == len(active):
            store(list(range(len(active))), step)
            break
        if finished:  # shrink the batch: store the finished rows, keep the others
            store(finished, step)
            stay = torch.tensor([br for br in range(len(active)) if br not in set(finished)], dtype=torch.long)
            on_dev = stay.to(dev)
            for layer in range(cfg.num_hidden_layers):
                cache.k[layer] = cache.k[layer][on_dev]
                cache.v[layer] = cache.v[layer][on_dev]
            key_mask, next_pos, tok, active = key_mask[on_dev], next_pos[on_dev], tok[on_dev], active[stay]
        key_mask[:, K + D + step] = True
        logits = model(tok[:, None], next_pos[:, None], key_mask[:, :K + D + step + 1], cache)[:, -1]
        next_pos = next_pos + 1
    tc.rows = new_tc
    return [(toks[i], lps[i], "stop" if toks[i] and toks[i][-1] == stop_id else "length") for i in range(n)]


class PrefixStore:
    """Finished generations' keys/values keyed by their token ids (see the module docstring)."""

    def __init__(self, boundary_id: int, max_entries: int = 1024, max_tokens: int | None = None) -> None:
        """``max_tokens`` bounds the tokens held in all (the oldest entries go first): a model with large
        keys/values per token (a real LLM: ~46 KB per token for SmolLM2-135M) needs it, the tiny models do not."""
        self.boundary_id = boundary_id
        self.max_entries = max_entries
        self.max_tokens = max_tokens
        self.tokens = 0
        self.rows: OrderedDict[tuple[int, ...], Held] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def take(self, prompt: list[int]) -> Held | None:
        """Remove and return the longest stored sequence that ``prompt`` continues, if any."""
        if self.rows:
            for p in range(len(prompt) - 1, 0, -1):
                if prompt[p] == self.boundary_id:
                    held = self.rows.pop(tuple(prompt[:p]), None)
                    if held is not None:
                        self.tokens -= len(held[0])
                        self.hits += 1
                        return held
        self.misses += 1
        return None

    def put(self, held: Held) -> None:
        key = tuple(held[0])
        old = self.rows.pop(key, None)
        if old is not None:
            self.tokens -= len(old[0])
        self.rows[key] = held
        self.tokens += len(key)
        while len(self.rows) > self.max_entries or (self.max_tokens is not None and self.tokens > self.max_tokens
                                                    and self.rows):
            _, dropped = self.rows.popitem(last=False)
            self.tokens -= len(dropped[0])

    def clear(self) -> None:
        self.rows.clear()
        self.tokens = 0
