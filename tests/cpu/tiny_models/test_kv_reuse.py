"""The prefix store: finished turns are found by the conversation that continues them, and it stays bounded."""

from __future__ import annotations

import torch

from cpu.tiny_models.engine import Engine, EngineRequest
from cpu.tiny_models.kv_reuse import PrefixStore


def _prompt(tok, question: str) -> list[int]:
    return tok.encode_chat([{"role": "user", "content": question}], None, add_generation_prompt=True)


def _run(engine: Engine, prompts: list[list[int]]) -> list:
    out: dict = {}
    for i, p in enumerate(prompts):
        engine.admit([EngineRequest(p, 40, 0.0, torch.Generator(), lambda g, i=i: out.__setitem__(i, g),
                                    lambda exc: None)])
    while not engine.idle:
        engine.step()
    return [out[i] for i in range(len(prompts))]


def test_unrelated_prompts_miss_and_the_store_is_bounded(micro_model, micro_tokenizer) -> None:
    tok = micro_tokenizer
    store = PrefixStore(tok.im_end_id, max_entries=2)
    engine = Engine(micro_model, tok.im_end_id, store)
    outs = _run(engine, [_prompt(tok, f"What is {a}+{a}?") for a in range(4)])
    assert any(g.finish_reason == "stop" for g in outs)
    assert 1 <= len(store.rows) <= 2
    _run(engine, [_prompt(tok, "What is 9*9?")])
    assert store.hits == 0
    store.clear()
    assert not store.rows
