"""Reusing a conversation's keys/values across turns gives the same greedy tokens as a full prefill."""

from __future__ import annotations

import torch

from ait_env.local.kv_reuse import PrefixStore, generate_with_store
from ait_env.local.model import generate


def _prompt(tok, question: str) -> list[int]:
    return tok.encode_chat([{"role": "user", "content": question}], None, add_generation_prompt=True)


def test_second_turn_reuses_the_first_and_matches_a_full_prefill(micro_model, micro_tokenizer) -> None:
    tok, model = micro_tokenizer, micro_model
    store = PrefixStore(tok.im_end_id)
    prompts = [_prompt(tok, "What is 3+4?"), _prompt(tok, "What is (12*3)-5?")]
    first = generate_with_store(model, store, prompts, [24, 24], 0.0, tok.im_end_id, None)
    stopped = [i for i, (_, _, f) in enumerate(first) if f == "stop"]
    assert stopped, "the micro model should end a reply with <|im_end|>"
    assert len(store.rows) == len(stopped) and store.hits == 0
    # the next turn: the whole first turn (reply included) + a tool result + a new assistant header
    follow = tok.encode("\n<|im_start|>tool\n7<|im_end|>\n<|im_start|>assistant\n")
    second_prompts = [prompts[i] + first[i][0] + follow for i in stopped]
    cached = generate_with_store(model, store, second_prompts, [24] * len(stopped), 0.0, tok.im_end_id, None)
    assert store.hits == len(stopped)
    full = generate(model, second_prompts, max_new_tokens=24, temperature=0.0, stop_ids={tok.im_end_id})
    for (toks, lps, _), g in zip(cached, full):
        assert toks == g.tokens[:len(toks)]
        torch.testing.assert_close(torch.tensor(lps), torch.tensor(g.logprobs[:len(lps)]), atol=1e-4, rtol=1e-4)


def test_unrelated_prompts_miss_and_the_store_is_bounded(micro_model, micro_tokenizer) -> None:
    tok = micro_tokenizer
    store = PrefixStore(tok.im_end_id, max_entries=2)
    prompts = [_prompt(tok, f"What is {a}+{a}?") for a in range(4)]
    generate_with_store(micro_model, store, prompts, [16] * 4, 0.0, tok.im_end_id, None)
    assert len(store.rows) <= 2
    generate_with_store(micro_model, store, [_prompt(tok, "What is 9*9?")], [16], 0.0, tok.im_end_id, None)
    assert store.hits == 0
    store.clear()
    assert not store.rows
