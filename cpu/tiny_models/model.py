"""A small decoder-only transformer, weight-compatible with Hugging Face ``LlamaForCausalLM``.

Why this design: the files we write (``config.json`` with ``model_type: llama``, ``model.safetensors``
with HF parameter names, a ``tokenizers`` tokenizer with a chat template) load in transformers and
can be served by vLLM on a GPU pod unchanged, while training and sampling on CPU use this lean
implementation (batched KV-cache decoding, no generic generation machinery). Equivalence with
transformers' own implementation is not checked by a test in this repository.

Contract:
- :class:`TinyConfig` <-> HF ``config.json``; :meth:`TinyLM.save` / :meth:`TinyLM.load` use
  safetensors with HF names (``model.layers.N.self_attn.q_proj.weight`` ...; tied embeddings).
- :meth:`TinyLM.forward` takes ``input_ids [B, T]``, ``positions [B, T]``, a boolean ``key_mask [B, S]``
  (which cached + new positions are real tokens) and an optional :class:`KVCache`; returns logits.
- :meth:`TinyLM.sequence_logprobs` (training) and :func:`generate` (sampling) build on it.
- :meth:`TinyLM.rope`, :meth:`Attention.qkv` / :meth:`Attention.repeat_kv` and
  :meth:`TinyLM.residual_stream` are the pieces of it that pretraining's faster losses
  (:mod:`cpu.tiny_models.pretrain`) reuse, so the Llama arithmetic exists once.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class TinyConfig:
    vocab_size: int = 1024
    hidden_size: int = 64
    intermediate_size: int = 172
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    max_position_embeddings: int = 512
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = True
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def to_hf(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k != "extra"}
        d.update({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
                  "attention_bias": False, "mlp_bias": False, "attention_dropout": 0.0, "torch_dtype": "float32",
                  "initializer_range": 0.02, "use_cache": True, "head_dim": self.head_dim})
        d.update(self.extra)
        return d

    @classmethod
    def from_hf(cls, d: dict[str, Any]) -> "TinyConfig":
        names = {f for f in cls.__dataclass_fields__ if f != "extra"}
        fields = {k: v for k, v in d.items() if k in names}
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        if "rope_theta" not in fields and isinstance(rope, dict) and "rope_theta" in rope:
            fields["rope_theta"] = rope["rope_theta"]   # transformers >= 5 writes it under rope_parameters
        if rope and rope.get("rope_type", "default") != "default":
            raise ValueError(f"rope_type {rope.get('rope_type')!r} is not supported (only the default RoPE)")
        return cls(**fields)

    def n_params(self) -> int:
        h, i, v, L = self.hidden_size, self.intermediate_size, self.vocab_size, self.num_hidden_layers
        kv = self.num_key_value_heads * self.head_dim
        per_layer = h * h * 2 + h * kv * 2 + 3 * h * i + 2 * h
        return v * h * (1 if self.tie_word_embeddings else 2) + L * per_layer + h


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.eps))


def _rope_table(n: int, dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    freqs = torch.arange(n, dtype=torch.float32)[:, None] * inv  # [n, dim/2]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


class KVCache:
    """Preallocated keys/values per layer for a batch; ``length`` positions are filled."""

    def __init__(self, cfg: TinyConfig, batch: int, capacity: int, device: torch.device | str = "cpu") -> None:
        shape = (batch, cfg.num_key_value_heads, capacity, cfg.head_dim)
        self.k = [torch.zeros(shape, device=device) for _ in range(cfg.num_hidden_layers)]
        self.v = [torch.zeros(shape, device=device) for _ in range(cfg.num_hidden_layers)]
        self.length = 0
        self.capacity = capacity
        #: per-row write columns ``[B]`` (decoding one token per row, rows of different lengths): then
        #: ``length`` is the number of columns attended to and stays as it is
        self.cols: torch.Tensor | None = None

    @classmethod
    def slots(cls, k: list[torch.Tensor], v: list[torch.Tensor], cols: torch.Tensor, width: int) -> "KVCache":
        """A view of per-layer tensors ``[N, H, C, hd]`` for decoding rows ``0..len(cols)-1``: row ``b`` writes
        its new key at column ``cols[b]`` and attends to columns ``[0, width)`` (its key mask says which)."""
        cache = cls.__new__(cls)
        cache.k, cache.v, cache.length, cache.capacity, cache.cols = k, v, width, k[0].shape[2], cols
        return cache


class Attention(nn.Module):
    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h, d = cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(h, cfg.num_attention_heads * d, bias=False)
        self.k_proj = nn.Linear(h, cfg.num_key_value_heads * d, bias=False)
        self.v_proj = nn.Linear(h, cfg.num_key_value_heads * d, bias=False)
        self.o_proj = nn.Linear(cfg.num_attention_heads * d, h, bias=False)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values ``[B, heads, T, head_dim]`` of ``x [B, T, hidden]``, queries and keys
        rotated by RoPE (``cos``/``sin`` from :meth:`TinyLM.rope`); keys and values per KV head."""
        B, T, _ = x.shape
        c = self.cfg
        q = self.q_proj(x).view(B, T, c.num_attention_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        return q, k, v

    def repeat_kv(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values repeated for every query head (grouped-query attention); as they are otherwise."""
        c = self.cfg
        if c.num_key_value_heads != c.num_attention_heads:
            rep = c.num_attention_heads // c.num_key_value_heads
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        return k, v

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
                cache: KVCache | None, layer: int) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.qkv(x, cos, sin)
        if cache is not None and cache.cols is not None:  # one token per row, at each row's own column
            rows = torch.arange(B, device=x.device)
            cache.k[layer][rows, :, cache.cols] = k[:, :, 0]
            cache.v[layer][rows, :, cache.cols] = v[:, :, 0]
            k = cache.k[layer][:B, :, :cache.length]
            v = cache.v[layer][:B, :, :cache.length]
        elif cache is not None:
            start = cache.length
            cache.k[layer][:, :, start:start + T] = k
            cache.v[layer][:, :, start:start + T] = v
            k = cache.k[layer][:, :, :start + T]
            v = cache.v[layer][:, :, :start + T]
        # grouped-query attention without copying the keys/values per query head (repeat_kv's copies cost 6x
        # the attention itself when decoding long contexts: benchmarks/bench_agent_model.py)
        gqa = self.cfg.num_key_value_heads != self.cfg.num_attention_heads
        if mask is None:  # right-padded full sequences: causal attention alone never lets real tokens see pads
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)


class _Inner(nn.Module):
    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([Block(cfg) for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class TinyLM(nn.Module):
    """Llama-architecture causal LM. Parameter names equal transformers' ``LlamaForCausalLM``."""

    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = _Inner(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.apply(self._init)

    @property
    def device(self) -> torch.device:
        """Where the parameters live (``TinyLM.to(device)`` moves them; every input follows)."""
        return self.lm_head.weight.device

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE's cos and sin ``[B, 1, T, head_dim]`` at ``positions [B, T]``, read from a table of every
        position up to ``max_position_embeddings`` (grown when a position lies beyond it)."""
        need = int(positions.max()) + 1 if positions.numel() else 1
        table = getattr(self, "_rope_cache", None)
        if table is None or table[0].shape[0] < need or table[0].device != positions.device:
            n = max(need, self.cfg.max_position_embeddings)
            table = tuple(t.to(positions.device) for t in _rope_table(n, self.cfg.head_dim, self.cfg.rope_theta))
            self._rope_cache = table
        return table[0][positions][:, None], table[1][positions][:, None]  # [B, 1, T, dim]

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    # ------------------------------------------------------------------ forward
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, key_mask: torch.Tensor | None,
                cache: KVCache | None = None, hidden_only: bool = False) -> torch.Tensor:
        """Logits ``[B, T, V]``. ``key_mask [B, S]`` marks real tokens among all S = cached + T keys;
        ``None`` means plain causal attention over right-padded sequences (training)."""
        B, T = input_ids.shape
        S = key_mask.shape[1] if key_mask is not None else T
        past = S - T
        if key_mask is None:
            mask = None
        elif T == 1:  # decoding: the new key is real for every row, no causal structure needed
            mask = key_mask[:, None, None, :]
        else:
            dev = input_ids.device
            causal = torch.ones(T, S, dtype=torch.bool, device=dev).tril(diagonal=past)
            mask = (causal[None] & key_mask[:, None, :])[:, None]  # [B, 1, T, S]
            # rows of padding queries would be all-False (NaN in softmax): let them see themselves
            diag = torch.zeros(T, S, dtype=torch.bool, device=dev)
            diag[torch.arange(T, device=dev), torch.arange(T, device=dev) + past] = True
            mask = mask | diag[None, None]
        x = self.model.norm(self.residual_stream(input_ids, positions, mask, cache))
        return x if hidden_only else self.lm_head(x)

    def residual_stream(self, input_ids: torch.Tensor, positions: torch.Tensor,
                        mask: torch.Tensor | None = None, cache: KVCache | None = None) -> torch.Tensor:
        """The residual stream ``[B, T, hidden]`` after the last block, before the final norm: what
        :meth:`forward` computes with an attention ``mask [B, 1, T, S]`` built from its key mask (``None``:
        plain causal attention over right-padded sequences). Pretraining's loss reads it directly
        (:func:`cpu.tiny_models.pretrain.fast_loss_fn`), to apply the LM head only where it is trained."""
        cos, sin = self.rope(positions)
        x = self.model.embed_tokens(input_ids)
        for i, layer in enumerate(self.model.layers):
            x = x + layer.self_attn(layer.input_layernorm(x), cos, sin, mask, cache, i)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        if cache is not None and cache.cols is None:
            cache.length += input_ids.shape[1]
        return x

    def sequence_logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                          temperature: float = 1.0, only: torch.Tensor | None = None) -> torch.Tensor:
        """Log-probabilities ``[B, T-1]`` of tokens 1..T-1 given their prefix (right-padded batch).

        ``only [B, T-1]`` (bool) restricts the vocabulary projection to those positions (others are 0),
        which saves most of the work when only sampled tokens are trained."""
        positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        h = self.forward(input_ids, positions, None, hidden_only=True)[:, :-1]  # right padding: causal suffices
        targets = input_ids[:, 1:]
        if only is None:
            logp = torch.log_softmax(self.lm_head(h).float() / max(temperature, 1e-6), dim=-1)
            return logp.gather(-1, targets[..., None]).squeeze(-1)
        sel = only.bool()
        out = torch.zeros(targets.shape, dtype=torch.float32, device=h.device)
        logp = torch.log_softmax(self.lm_head(h[sel]).float() / max(temperature, 1e-6), dim=-1)
        return out.masked_scatter(sel, logp.gather(-1, targets[sel][:, None]).squeeze(-1))

    # ------------------------------------------------------------------ io
    def save(self, path: str | Path, extra_files: dict[str, str] | None = None) -> None:
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}
        if self.cfg.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
        (path / "model.safetensors").chmod(0o644)   # safetensors writes 0600; HF folders are world-readable
        (path / "config.json").write_text(json.dumps(self.cfg.to_hf(), indent=1) + "\n")
        (path / "generation_config.json").write_text(json.dumps(
            {"bos_token_id": self.cfg.bos_token_id, "eos_token_id": self.cfg.eos_token_id,
             "pad_token_id": self.cfg.pad_token_id}, indent=1) + "\n")
        for name, text in (extra_files or {}).items():
            (path / name).write_text(text)

    @classmethod
    def load(cls, path: str | Path) -> "TinyLM":
        from safetensors.torch import load_file

        path = Path(path)
        cfg = TinyConfig.from_hf(json.loads((path / "config.json").read_text()))
        model = cls(cfg)
        state = load_file(str(path / "model.safetensors"))
        if cfg.tie_word_embeddings:
            state["lm_head.weight"] = state["model.embed_tokens.weight"]
        model.load_state_dict(state)
        return model


@dataclass
class Generation:
    tokens: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length"


@torch.inference_mode()
def generate(model: TinyLM, prompts: list[list[int]], *, max_new_tokens: int, temperature: float = 1.0,
             top_p: float = 1.0, stop_ids: set[int] | frozenset[int] = frozenset(),
             generator: torch.Generator | None = None) -> list[Generation]:
    """Sample continuations of a batch of prompts with a KV cache (left-padded prefill).

    ``logprobs`` are of each sampled token under the distribution it was sampled from (logits /
    temperature, after top-p); temperature 0 is greedy (logprobs then under temperature 1).
    A sequence stops at its first stop token (included) or after ``max_new_tokens``. On a GPU the
    model runs there; a CPU ``generator`` samples on the CPU (the same draws as a CPU-only run).
    """
    model.eval()
    dev = model.device
    B = len(prompts)
    lens = [len(p) for p in prompts]
    P = max(lens)
    cap = P + max_new_tokens
    if cap > model.cfg.max_position_embeddings + P:
        raise ValueError("sequence too long for the model")
    ids = torch.zeros(B, P, dtype=torch.long)
    mask = torch.zeros(B, cap, dtype=torch.bool)
    for i, p in enumerate(prompts):
        ids[i, P - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, P - len(p):P] = True
    ids, mask = ids.to(dev), mask.to(dev)
    positions = (mask[:, :P].long().cumsum(-1) - 1).clamp(min=0)
    cache = KVCache(model.cfg, B, cap, dev)
    logits = model(ids, positions, mask[:, :P], cache)[:, -1]
    next_pos = torch.tensor(lens, dtype=torch.long, device=dev)
    toks = torch.zeros(B, max_new_tokens, dtype=torch.long, device=dev)
    lps = torch.zeros(B, max_new_tokens, device=dev)
    done = torch.zeros(B, dtype=torch.bool, device=dev)
    n_out = torch.full((B,), max_new_tokens, dtype=torch.long, device=dev)
    stop = torch.tensor(sorted(stop_ids), dtype=torch.long, device=dev)
    for step in range(max_new_tokens):
        if temperature <= 0:
            logp = torch.log_softmax(logits.float(), -1)
            tok = logp.argmax(-1)
        else:
            logp = torch.log_softmax(logits.float() / temperature, -1)
            if top_p < 1.0:
                sp, si = logp.exp().sort(-1, descending=True)
                cut = sp.cumsum(-1) - sp > top_p
                sp = sp.masked_fill(cut, 0.0)
                probs = torch.zeros_like(sp).scatter(-1, si, sp)
                logp = torch.log(probs / probs.sum(-1, keepdim=True))
            probs = logp.exp()
            if generator is not None and generator.device != probs.device:
                probs = probs.cpu()
            tok = torch.multinomial(probs, 1, generator=generator).squeeze(-1).to(dev)
        toks[:, step] = tok
        lps[:, step] = logp.gather(-1, tok[:, None]).squeeze(-1)
        if len(stop):
            hit = torch.isin(tok, stop) & ~done
            n_out = torch.where(hit, torch.full_like(n_out, step + 1), n_out)
            done = done | hit
        if bool(done.all()) or step == max_new_tokens - 1:
            break
        mask[:, P + step] = True  # this step's keys exist for every row (finished rows are ignored)
        logits = model(tok[:, None], next_pos[:, None], mask[:, :P + step + 1], cache)[:, -1]
        next_pos = next_pos + 1
    out = []
    toks, lps, done, n_out = toks.cpu(), lps.cpu(), done.cpu(), n_out.cpu()
    for i in range(B):
        n = int(n_out[i])
        out.append(Generation(toks[i, :n].tolist(), lps[i, :n].tolist(), "stop" if bool(done[i]) else "length"))
    return out


def resolve_device(name: str) -> torch.device:
    """The torch device for a ``device`` setting: "cpu", "cuda" / "cuda:N", or "auto" (a GPU if torch sees one)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ValueError(f"unknown device {name!r}: use cpu, cuda, cuda:N or auto") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={name} but this torch sees no GPU (torch {torch.__version__}, "
                         f"torch.cuda.is_available() is False): use device=cpu, or install a CUDA build of torch")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device {name!r} is not supported: use cpu, cuda, cuda:N or auto")
    return device


def param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)

