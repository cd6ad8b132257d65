"""The local OpenAI-compatible endpoint, driven by the hidden-eval harness and by verifiers' own client."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from ait_env.hidden.evaluation import evaluate
from cpu.tiny_models.chat import parse_output
from cpu.tiny_models.endpoint import LocalEndpoint
from ait_env.hidden.secrets import hidden_set
from tests.helpers import load_reference_environment
from task_families import get_family


def test_chat_completion_fields_and_records(micro_model, micro_tokenizer):
    fam = get_family("arithmetic")
    inst = hidden_set("arithmetic")[0]
    with LocalEndpoint(micro_model, micro_tokenizer, "micro") as ep:
        body = {"model": "micro", "messages": fam.eval_messages(inst), "tools": fam.tool_schemas(),
                "temperature": 1.0, "max_tokens": 40, "logprobs": True, "return_token_ids": True,
                "ait_record": True}
        r = httpx.post(ep.base_url + "/chat/completions", json=body, timeout=30).json()
        choice = r["choices"][0]
        assert r["prompt_token_ids"] == micro_tokenizer.encode_chat(fam.eval_messages(inst), fam.tool_schemas(),
                                                                     add_generation_prompt=True)
        assert len(choice["token_ids"]) == len(choice["logprobs"]["content"]) >= 1
        rec = ep.records[r["id"]]
        assert rec.completion_ids == choice["token_ids"]
        assert [c["logprob"] for c in choice["logprobs"]["content"]] == pytest.approx(rec.logprobs)
        text = micro_tokenizer.decode(rec.completion_ids)
        content, calls = parse_output(text)
        assert (choice["message"]["tool_calls"] or []) and calls or not calls
        assert choice["finish_reason"] in ("stop", "length", "tool_calls")
        # context overflow is vLLM's 400
        long = {"model": "micro", "messages": [{"role": "user", "content": "7 " * 3000}], "max_tokens": 5}
        bad = httpx.post(ep.base_url + "/chat/completions", json=long, timeout=30)
        assert bad.status_code == 400 and "maximum context length" in bad.text
        models = httpx.get(ep.base_url + "/models").json()
        assert models["data"][0]["id"] == "micro"
        assert httpx.get(ep.base_url.removesuffix("/v1") + "/health").status_code == 200   # as vLLM's


def test_hidden_eval_harness_against_the_endpoint(micro_model, micro_tokenizer):
    with LocalEndpoint(micro_model, micro_tokenizer, "micro") as ep:
        res = evaluate("arithmetic", base_url=ep.base_url, model="micro", limit=40, concurrency=16, max_tokens=64)
    assert not res.failed and res.n == 40 and res.n_errors == 0
    assert sum(r.turns for r in res.records) > 40  # the fitted model calls tools (multi-turn)
    assert ep.stats["batches"] < ep.stats["requests"]  # concurrent requests were batched


def test_verifiers_rollouts_over_a_unix_socket(micro_model, micro_tokenizer, tmp_path):
    """verifiers' own rollout + rubric code, talking to the endpoint over its Unix socket."""
    pytest.importorskip("verifiers")
    from ait_env.integrations import verifiers_v0 as V

    env = load_reference_environment("arithmetic", "micro", tmp_path, {"num_examples": 20})
    sock = tmp_path / "ep.sock"
    with LocalEndpoint(micro_model, micro_tokenizer, "micro", host=None, uds=sock) as ep:
        client = V.make_client(uds=str(sock))
        groups = V.rollout_inputs(env, [0, 1], 4)
        out = asyncio.run(V.run_groups(env, client, "micro", groups,
                                       {"temperature": 1.0, "max_tokens": 48, "extra_body": {"ait_record": True}}))
    assert [len(g) for g in out] == [4, 4]
    ids = [rid for g in out for r in g for rid in r["response_ids"]]
    assert ids and all(rid in ep.records for rid in ids)
    assert all(isinstance(r["reward"], float) for g in out for r in g)
    json.dumps(out)


def test_sampling_does_not_depend_on_arrival_order_or_batching(micro_model, micro_tokenizer):
    """Same seed, same prompts (with repeats, like a GRPO group): the same multiset of samples per prompt,
    whether the requests arrive one by one or all at once in another order."""
    fam = get_family("arithmetic")
    insts = hidden_set("arithmetic")[:3]
    bodies = [{"model": "micro", "messages": fam.eval_messages(i), "tools": fam.tool_schemas(), "temperature": 1.0,
               "max_tokens": 24, "return_token_ids": True} for i in insts for _ in range(3)]

    async def fire(url: str, items: list[dict], concurrent: bool) -> list[list[int]]:
        async with httpx.AsyncClient(timeout=60) as c:
            async def one(b: dict) -> list[int]:
                return (await c.post(url, json=b)).json()["choices"][0]["token_ids"]
            if concurrent:
                return list(await asyncio.gather(*(one(b) for b in items)))
            return [await one(b) for b in items]

    def by_prompt(items: list[dict], outs: list[list[int]]) -> dict[str, list[tuple[int, ...]]]:
        d: dict[str, list[tuple[int, ...]]] = {}
        for b, o in zip(items, outs):
            d.setdefault(json.dumps(b["messages"]), []).append(tuple(o))
        return {k: sorted(v) for k, v in d.items()}

    with LocalEndpoint(micro_model, micro_tokenizer, "micro", seed=7) as ep:
        serial = by_prompt(bodies, asyncio.run(fire(ep.base_url + "/chat/completions", bodies, False)))
    shuffled = bodies[::-1]
    with LocalEndpoint(micro_model, micro_tokenizer, "micro", seed=7, batch_window_s=0.05) as ep:
        together = by_prompt(shuffled, asyncio.run(fire(ep.base_url + "/chat/completions", shuffled, True)))
        assert ep.stats["batches"] < ep.stats["requests"]
    assert serial == together
    with LocalEndpoint(micro_model, micro_tokenizer, "micro", seed=8) as ep:
        other = by_prompt(bodies, asyncio.run(fire(ep.base_url + "/chat/completions", bodies, False)))
    assert other != serial
