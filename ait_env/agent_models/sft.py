"""Behaviour cloning of an agent model on chat conversations: next-token loss on chosen assistant turns only.

Contract:
- :func:`encode_conversation` renders a conversation with the model's own chat template and tokenizes it the
  way the endpoint tokenizes a prompt (the whole rendered text at once). The trained tokens of an assistant
  turn are exactly what the model generates at inference: the turn's text and the end-of-turn token, not the
  template's ``<|im_start|>assistant`` header (the prompt's generation header) and not the newline after it.
  Turns are located by rendering prefixes; a template whose prefixes do not tokenize as prefixes of the whole
  is refused (:class:`ait_env.agent_models.load.TemplateError`), never silently mis-masked.
- :func:`behaviour_clone` trains ``agent.model`` in place: AdamW, linear warmup then cosine decay, gradient
  clipping, one conversation per forward pass and ``batch`` conversations per optimizer step. The loss is the
  mean negative log-likelihood over the batch's trained tokens (``loss_per="token"``) or over its trained
  turns (``loss_per="turn"``: each turn's mean token NLL, so a 25-token tool call weighs as much as a
  2,000-token file write; a small model's structural turns are what fails first). The LM head runs only at
  the trained positions.
  ``train_layers`` > 0 trains only the top layers (and the final norm): the lower layers run without a
  graph, which makes a step cheaper; the embeddings (tied with the LM head) are never trained. Progress goes
  to ``on_step``; the loop is deterministic for a seed and a thread count.
- A conversation longer than ``max_len`` tokens is cut at ``max_len`` (its trained tokens beyond are lost,
  and counted in the logs as ``cut_tokens``).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from ait_env.agent_models.load import AgentModel, TemplateError
from cpu.tiny_models.tokenizer import ChatTokenizer


@dataclass
class Encoded:
    ids: list[int]
    mask: list[int]      # 1 where the token is trained
    #: per token: 0 where not trained, else the number (1, 2, ...) of the assistant turn it belongs to
    turn: list[int] = field(default_factory=list)

    @property
    def trained(self) -> int:
        return sum(self.mask)

    @property
    def turns(self) -> int:
        return max(self.turn, default=0)


def encode_conversation(tok: ChatTokenizer, messages: Sequence[dict[str, Any]], trained: Sequence[bool]) -> Encoded:
    """Token ids of the rendered conversation and the mask of the trained assistant tokens (module docstring)."""
    if len(messages) != len(trained):
        raise ValueError("one 'trained' flag per message")
    full = tok.encode(tok.render(list(messages)))
    mask = [0] * len(full)
    turn = [0] * len(full)
    n = 0
    for k, (m, t) in enumerate(zip(messages, trained)):
        if not t:
            continue
        if m.get("role") != "assistant":
            raise ValueError(f"message {k} is a {m.get('role')} message: only assistant turns can be trained")
        prompt = tok.encode(tok.render(list(messages[:k]), add_generation_prompt=True))
        upto = tok.encode(tok.render(list(messages[:k + 1])))
        if full[:len(upto)] != upto or upto[:len(prompt)] != prompt:
            raise TemplateError(f"turn {k}: the chat template's prefixes do not tokenize as prefixes of the "
                                "conversation; these turns cannot be masked exactly")
        end = len(upto)
        while end > len(prompt) and upto[end - 1] != tok.im_end_id:
            end -= 1   # the template's newline after the end-of-turn token is not generated
        if end == len(prompt):
            raise TemplateError(f"turn {k}: no end-of-turn token after the assistant's text")
        n += 1
        for i in range(len(prompt), end):
            mask[i] = 1
            turn[i] = n
    return Encoded(full, mask, turn)


@dataclass
class SFTSettings:
    lr: float = 5e-5
    epochs: float = 2.0           # passes over the conversations (a fraction stops early)
    batch: int = 4                # conversations per optimizer step
    warmup_steps: int = 5
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    max_norm: float = 1.0
    max_len: int = 8192
    train_layers: int = 0         # 0: every layer; k: the top k layers only
    loss_per: str = "token"       # "token": mean over trained tokens; "turn": mean over trained turns
    seed: int = 0

    def __post_init__(self) -> None:
        if self.loss_per not in ("token", "turn"):
            raise ValueError(f"loss_per must be 'token' or 'turn', not {self.loss_per!r}")


@dataclass
class SFTLog:
    step: int
    of: int
    loss: float
    lr: float
    tokens: int
    seconds: float
    cut_tokens: int = 0
    grad_norm: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)


def trainable_parameters(model: Any, train_layers: int) -> list[torch.nn.Parameter]:
    """Freeze what :class:`SFTSettings` does not train; returns the trained parameters."""
    layers = model.model.layers
    first = 0 if train_layers <= 0 else max(0, len(layers) - train_layers)
    for p in model.parameters():
        p.requires_grad_(False)
    params: list[torch.nn.Parameter] = []
    for i, layer in enumerate(layers):
        if i >= first:
            for p in layer.parameters():
                p.requires_grad_(True)
                params.append(p)
    for p in model.model.norm.parameters():
        p.requires_grad_(True)
        params.append(p)
    return params


def lr_at(step: int, total: int, s: SFTSettings) -> float:
    if step < s.warmup_steps:
        return s.lr * (step + 1) / (s.warmup_steps + 1)
    done = (step - s.warmup_steps) / max(1, total - s.warmup_steps)
    return s.lr * (s.min_lr_ratio + (1 - s.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, done))))


def sequence_nll(model: Any, enc: Encoded, max_len: int, per_turn: bool = False) -> tuple[torch.Tensor, int, int]:
    """(summed negative log-likelihood of the trained tokens, trained tokens, trained tokens cut off); with
    ``per_turn`` the sum is of each trained turn's mean NLL (one unit per turn, a turn cut short counts what
    is left of it) and the count is of turns."""
    ids, mask = enc.ids[:max_len], enc.mask[:max_len]
    cut = sum(enc.mask[max_len:])
    x = torch.tensor([ids], dtype=torch.long, device=model.device)
    att = torch.ones_like(x)
    only = torch.tensor([mask[1:]], dtype=torch.bool, device=model.device)
    n = int(only.sum())
    if n == 0:
        return torch.zeros((), device=model.device), 0, cut
    logp = model.sequence_logprobs(x, att, only=only)
    if not per_turn:
        return -(logp * only).sum(), n, cut
    turn = torch.tensor([(enc.turn or mask)[1:max_len]], dtype=torch.long, device=model.device)
    sizes = torch.bincount(turn.flatten(), minlength=int(turn.max()) + 1).float()
    weight = torch.where(only, 1.0 / sizes.clamp(min=1)[turn], torch.zeros((), device=model.device))
    return -(logp * weight).sum(), int((sizes[1:] > 0).sum()), cut


def behaviour_clone(agent: AgentModel, data: Sequence[Encoded], settings: SFTSettings,
                    on_step: Callable[[SFTLog], None] | None = None, start_step: int = 0,
                    optimizer_state: dict[str, Any] | None = None,
                    on_optimizer: Callable[[torch.optim.Optimizer], None] | None = None,
                    ) -> tuple[list[SFTLog], torch.optim.Optimizer]:
    """Train ``agent.model`` on ``data`` (module docstring). ``start_step`` and ``optimizer_state`` resume a run
    (the order of conversations is the seed's, so a resumed run sees what an uninterrupted one would);
    ``on_optimizer`` receives the optimizer before the first step (to checkpoint its state)."""
    if not data:
        raise ValueError("no conversations to train on")
    model = agent.model
    params = trainable_parameters(model, settings.train_layers)
    opt = torch.optim.AdamW(params, lr=settings.lr, weight_decay=settings.weight_decay)
    if optimizer_state:
        opt.load_state_dict(optimizer_state)
    if on_optimizer:
        on_optimizer(opt)
    rng = random.Random(settings.seed)
    order: list[int] = []
    while len(order) < math.ceil(settings.epochs * len(data)):
        epoch = list(range(len(data)))
        rng.shuffle(epoch)
        order += epoch
    order = order[:max(1, math.ceil(settings.epochs * len(data)))]
    batches = [order[i:i + settings.batch] for i in range(0, len(order), settings.batch)]
    logs: list[SFTLog] = []
    model.train()
    for step in range(start_step, len(batches)):
        t0 = time.perf_counter()
        lr = lr_at(step, len(batches), settings)
        for g in opt.param_groups:
            g["lr"] = lr
        batch = [data[i] for i in batches[step]]
        per_turn = settings.loss_per == "turn"
        total = sum(len(set((e.turn or e.mask)[1:settings.max_len]) - {0}) if per_turn
                    else sum(e.mask[1:settings.max_len]) for e in batch) or 1
        loss_sum, units, tokens, cut = 0.0, 0, 0, 0
        opt.zero_grad(set_to_none=True)
        for enc in batch:
            nll, n, c = sequence_nll(model, enc, settings.max_len, per_turn)
            cut += c
            if n:
                (nll / total).backward()
                loss_sum += float(nll.detach())
                units += n
                tokens += sum(enc.mask[1:settings.max_len])
        norm = float(torch.nn.utils.clip_grad_norm_(params, settings.max_norm))
        opt.step()
        log = SFTLog(step=step + 1, of=len(batches), loss=loss_sum / max(1, units), lr=lr, tokens=tokens,
                     seconds=time.perf_counter() - t0, cut_tokens=cut, grad_norm=norm)
        logs.append(log)
        if on_step:
            on_step(log)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(True)
    return logs, opt


def settings_dict(s: SFTSettings) -> dict[str, Any]:
    return asdict(s)
