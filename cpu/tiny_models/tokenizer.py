"""Tokenizer of the local models: a byte-level BPE (``tokenizers``) trained on our own text, with digits
split one per token and the chat format's markers as special tokens.

:func:`train_tokenizer` is deterministic for a given corpus and vocabulary size. :class:`ChatTokenizer`
wraps the result with the chat template of :mod:`cpu.tiny_models.chat` and writes the HF files
(``tokenizer.json``, ``tokenizer_config.json`` with ``chat_template``, ``special_tokens_map.json``)
next to the model so transformers / vLLM can load them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from cpu.tiny_models.chat import CHAT_TEMPLATE, IM_END, PAD, SPECIAL_TOKENS, render


def train_tokenizer(texts: Iterable[str], vocab_size: int = 1024, *, split_spaces: bool = False) -> Tokenizer:
    """Byte-level BPE with digits one per token; ``split_spaces`` also splits a space before a letter or
    digit off as its own token (see :func:`cpu.tiny_models.corpus.train_corpus_tokenizer` for why)."""
    steps = [pre_tokenizers.Split(Regex(r" (?=[A-Za-z0-9])"), behavior="isolated")] if split_spaces else []
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps + [
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


class ChatTokenizer:
    def __init__(self, tok: Tokenizer) -> None:
        self.tok = tok
        self.pad_id = tok.token_to_id(PAD)
        self.im_end_id = tok.token_to_id(IM_END)
        self.vocab_size = tok.get_vocab_size()

    @classmethod
    def load(cls, path: str | Path) -> "ChatTokenizer":
        return cls(Tokenizer.from_file(str(Path(path) / "tokenizer.json")))

    def save(self, path: str | Path, model_max_length: int) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.tok.save(str(path / "tokenizer.json"))
        cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE,
               "bos_token": None, "eos_token": IM_END, "pad_token": PAD, "unk_token": None,
               "model_max_length": model_max_length, "clean_up_tokenization_spaces": False,
               "added_tokens_decoder": {str(self.tok.token_to_id(t)): {"content": t, "special": True,
                                        "lstrip": False, "rstrip": False, "normalized": False,
                                        "single_word": False} for t in SPECIAL_TOKENS}}
        (path / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1) + "\n")
        (path / "special_tokens_map.json").write_text(json.dumps({"eos_token": IM_END, "pad_token": PAD}) + "\n")

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
               add_generation_prompt: bool = False) -> str:
        return render(messages, tools, add_generation_prompt)

    def encode_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                    add_generation_prompt: bool = False) -> list[int]:
        return self.encode(self.render(messages, tools, add_generation_prompt))
