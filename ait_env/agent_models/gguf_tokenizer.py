"""The tokenizer of a GGUF model, rebuilt from the GGUF's own metadata with ``tokenizers``.

Why not transformers' GGUF conversion: for SmolLM2-135M-Instruct (transformers 5.5.4) it yields a
``CodeLlamaTokenizer`` whose post-processor prepends ``<|im_start|>`` to every encoding (the GGUF says
``add_bos_token = False``), whose ``eos_token`` is ``<|im_start|>`` (the GGUF says id 2, ``<|im_end|>``), with
five added tokens (ids 49152-49156) beyond the model's 49,152 embeddings and a SentencePiece-style decoder
(``▁`` replaced by a space). A trainer that takes that ``eos_token`` as its stop token never stops a turn.

Contract of :func:`tokenizer_from_gguf`: a byte-level BPE with the GGUF's vocabulary and merges, the
pre-tokenizer its ``tokenizer.ggml.pre`` names (:data:`PRE_TOKENIZERS`; others are refused, not guessed),
its control tokens (token type 3) as special tokens, no post-processor unless ``add_bos_token`` is set, and a
byte-level decoder. :func:`write_hf_tokenizer` writes ``tokenizer.json``, ``tokenizer_config.json`` (the
GGUF's chat template, its bos/eos/pad tokens) and ``special_tokens_map.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

#: GGUF token type of control tokens (llama.cpp's ``LLAMA_TOKEN_TYPE_CONTROL``)
CONTROL = 3


def _smollm() -> Any:
    # llama.cpp groups "smollm" with the StarCoder pre-tokenizers: digits one by one, then GPT-2's regex
    # (its llama-vocab.cpp); the model's original tokenizer.json is Digits(individual) + ByteLevel(regex).
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])


#: ``tokenizer.ggml.pre`` -> the pre-tokenizer it stands for
PRE_TOKENIZERS = {"smollm": _smollm}


def gguf_metadata(path: str | Path) -> dict[str, Any]:
    """The GGUF file's key/value metadata (tensors are not read)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    return {k: f.contents() for k, f in reader.fields.items()}


def tokenizer_from_gguf(meta: dict[str, Any]) -> Tokenizer:
    """A ``tokenizers`` tokenizer equal to the model's own (module docstring)."""
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"GGUF tokenizer model {kind!r} is not supported (only byte-level BPE, 'gpt2')")
    pre = meta.get("tokenizer.ggml.pre")
    if pre not in PRE_TOKENIZERS:
        raise ValueError(f"GGUF pre-tokenizer {pre!r} is not supported (known: {', '.join(PRE_TOKENIZERS)})")
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    types: list[int] = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise ValueError("the GGUF vocabulary has duplicate tokens")
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = PRE_TOKENIZERS[pre]()
    tok.decoder = decoders.ByteLevel()
    specials = [tokens[i] for i, t in enumerate(types) if t == CONTROL]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    if meta.get("tokenizer.ggml.add_bos_token"):
        bos = tokens[int(meta["tokenizer.ggml.bos_token_id"])]
        tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, vocab[bos])])
    if tok.get_vocab_size(with_added_tokens=True) != len(tokens):
        raise ValueError("the rebuilt tokenizer's size differs from the GGUF vocabulary")
    return tok


def special_token(meta: dict[str, Any], key: str) -> str | None:
    i = meta.get(f"tokenizer.ggml.{key}_token_id")
    return None if i is None else str(meta["tokenizer.ggml.tokens"][int(i)])


def write_hf_tokenizer(tok: Tokenizer, meta: dict[str, Any], path: str | Path, model_max_length: int) -> None:
    """The HF tokenizer files of ``tok`` in ``path`` (loadable by ``AutoTokenizer``)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    bos, eos, pad, unk = (special_token(meta, k) for k in ("bos", "eos", "padding", "unknown"))
    types = list(meta.get("tokenizer.ggml.token_type") or [])
    tokens = list(meta["tokenizer.ggml.tokens"])
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": meta.get("tokenizer.chat_template"),
           "bos_token": bos, "eos_token": eos, "pad_token": pad or eos, "unk_token": unk,
           "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token")), "add_eos_token": False,
           "model_max_length": model_max_length, "clean_up_tokenization_spaces": False,
           "added_tokens_decoder": {str(i): {"content": tokens[i], "special": True, "lstrip": False, "rstrip": False,
                                             "normalized": False, "single_word": False}
                                    for i, t in enumerate(types) if t == CONTROL}}
    (path / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    (path / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": bos, "eos_token": eos, "pad_token": pad or eos, "unk_token": unk}, indent=1) + "\n")
