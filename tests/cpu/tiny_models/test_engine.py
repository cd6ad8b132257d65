"""The continuous-batching engine: rows that join and leave at any step decode exactly as they would alone."""

from __future__ import annotations

import torch

from cpu.tiny_models.engine import Engine, EngineRequest
from cpu.tiny_models.kv_reuse import PrefixStore
from cpu.tiny_models.model import Generation, generate


def _prompt(tok, question: str) -> list[int]:
    return tok.encode_chat([{"role": "user", "content": question}], None, add_generation_prompt=True)


QUESTIONS = ["What is 3+4?", "What is (12*3)-5?", "7*8", "Compute ((2+3)*(4+5))-6 please", "1+1", "99-9"]


def _request(prompt: list[int], out: dict[int, Generation], key: int, *, max_tokens: int = 20,
             temperature: float = 0.0, seed: int = 0) -> EngineRequest:
    def fail(exc: BaseException) -> None:
        raise AssertionError(f"request {key} failed: {exc}")

    return EngineRequest(prompt, max_tokens, temperature, torch.Generator().manual_seed(seed),
                         lambda g: out.__setitem__(key, g), fail)


def _drain(engine: Engine, out: dict[int, Generation], want: int) -> None:
    for _ in range(500):
        if len(out) == want:
            return
        engine.step()
    raise AssertionError("the engine did not finish its rows")


def test_staggered_greedy_rows_match_decoding_each_alone(micro_model, micro_tokenizer) -> None:
    tok = micro_tokenizer
    prompts = [_prompt(tok, q) for q in QUESTIONS]
    limits = [20, 7, 20, 12, 3, 20]
    # tiny initial tensors: admission and decoding must grow them (rows and columns) on the way
    engine = Engine(micro_model, tok.im_end_id, slots=1, columns=8)
    out: dict[int, Generation] = {}
    engine.admit([_request(prompts[i], out, i, max_tokens=limits[i]) for i in (0, 1)])
    engine.step()
    engine.step()
    engine.admit([_request(prompts[i], out, i, max_tokens=limits[i]) for i in (2, 3, 4)])
    for _ in range(4):
        engine.step()
    engine.admit([_request(prompts[5], out, 5, max_tokens=limits[5])])
    _drain(engine, out, len(prompts))
    assert engine.idle
    for i, p in enumerate(prompts):
        alone = generate(micro_model, [p], max_new_tokens=limits[i], temperature=0.0, stop_ids={tok.im_end_id})[0]
        assert out[i].tokens == alone.tokens, f"row {i}"
        assert out[i].finish_reason == alone.finish_reason
        torch.testing.assert_close(torch.tensor(out[i].logprobs), torch.tensor(alone.logprobs), atol=1e-4, rtol=1e-4)


def test_a_sample_depends_on_its_seed_not_on_its_batch(micro_model, micro_tokenizer) -> None:
    tok = micro_tokenizer
    prompts = [_prompt(tok, q) for q in QUESTIONS]

    def run(order: list[int], stagger: bool, seed_base: int = 0) -> dict[int, list[int]]:
        engine = Engine(micro_model, tok.im_end_id)
        out: dict[int, Generation] = {}
        for i in order:
            engine.admit([_request(prompts[i], out, i, temperature=1.0, seed=seed_base + i, max_tokens=16)])
            if stagger:
                engine.step()
        _drain(engine, out, len(order))
        return {i: g.tokens for i, g in out.items()}

    together = run(list(range(len(prompts))), stagger=False)
    assert run(list(reversed(range(len(prompts)))), stagger=True) == together
    assert run(list(range(len(prompts))), stagger=False, seed_base=100) != together


def test_a_stopped_turn_is_reused_by_the_next(micro_model, micro_tokenizer) -> None:
    tok = micro_tokenizer
    store = PrefixStore(tok.im_end_id)
    engine = Engine(micro_model, tok.im_end_id, store)
    prompts = [_prompt(tok, q) for q in QUESTIONS[:3]]
    out: dict[int, Generation] = {}
    engine.admit([_request(p, out, i, max_tokens=24) for i, p in enumerate(prompts)])
    _drain(engine, out, 3)
    stopped = [i for i in range(3) if out[i].finish_reason == "stop"]
    assert stopped and len(store.rows) == len(stopped)
    follow = tok.encode("\n<|im_start|>tool\n7<|im_end|>\n<|im_start|>assistant\n")
    second = [prompts[i] + out[i].tokens + follow for i in stopped]
    out2: dict[int, Generation] = {}
    engine.admit([_request(p, out2, j, max_tokens=24) for j, p in enumerate(second)])
    assert store.hits == len(stopped)
    _drain(engine, out2, len(second))
    full = generate(micro_model, second, max_new_tokens=24, temperature=0.0, stop_ids={tok.im_end_id})
    for j, g in enumerate(full):
        assert out2[j].tokens == g.tokens
        torch.testing.assert_close(torch.tensor(out2[j].logprobs), torch.tensor(g.logprobs), atol=1e-4, rtol=1e-4)
