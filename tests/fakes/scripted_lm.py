"""Scripted stand-ins for a local TinyLM's forward pass (``model(ids, positions, key_mask) -> logits``),
for tests of code that reads a model's next-token choices (the flaw and skill probes)."""

from __future__ import annotations

import torch


class PeekingLM:
    """The next token of its own input is the most likely one (logit 20, others 0): a model that always
    stays on the teacher's path. Token ids in ``blind`` are never predicted (token 0 is, instead)."""

    def __init__(self, vocab: int, blind: set[int] | None = None) -> None:
        self.vocab = vocab
        self.blind = blind or set()

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor, key_mask: None) -> torch.Tensor:
        out = torch.zeros(ids.shape[0], ids.shape[1], self.vocab)
        nxt = ids[:, 1:].clone()
        for t in self.blind:
            nxt[nxt == t] = 0
        out[:, :-1].scatter_(-1, nxt[..., None], 20.0)
        return out


class FixedLM:
    """The same logits at every position: ``scores`` {token id: logit}, 0 elsewhere."""

    def __init__(self, vocab: int, scores: dict[int, float]) -> None:
        self.row = torch.zeros(vocab)
        for i, v in scores.items():
            self.row[i] = v

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor, key_mask: None) -> torch.Tensor:
        return self.row.expand(ids.shape[0], ids.shape[1], -1).clone()
