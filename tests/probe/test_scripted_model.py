"""The probe's scripted model (:mod:`ait_env.probe.scripted_model`) answers whatever the agent's environment
sends: an unexpected request is an HTTP error the rollout reports (never a hang, never an exception), a prompt
with few-shot dev questions is still dealt its row's script, and over a real Unix socket it speaks the
OpenAI chat API the verifiers client expects."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from ait_env.probe.scripted_model import ScriptedModel

EXAMPLES = [("What is 1+2?", {"good": [{"content": "", "tool_calls": [{"function": {
    "name": "calculator", "arguments": '{"expression": "1+2"}'}}]}, {"content": "Answer: 3"}],
                              "bad": [{"content": "Answer: 4"}]}),
            ("What is 5*5?", {"good": [{"content": "Answer: 25"}], "bad": [{"content": "Answer: 24"}]})]


def test_a_conversation_is_dealt_a_script_and_followed_by_its_nonce_ids(tmp_path: Path):
    model = ScriptedModel(tmp_path / "m.sock", EXAMPLES)
    first = [{"role": "system", "content": "Few-shot: What is 5*5? Answer: 25"}, {"role": "user", "content": "What is 1+2?"}]
    seen = {}
    for _ in range(2):
        status, reply = model.answer({"messages": first, "tools": [{"type": "function", "function": {"name": "calculator"}}]})
        assert status == 200
        msg = reply["choices"][0]["message"]
        seen[msg.get("content") or "call"] = (reply["id"], msg)
    assert set(seen) == {"call", "Answer: 4"}     # both scripts of example 1, whatever order they were dealt in
    rid, call_msg = seen["call"]
    cid = call_msg["tool_calls"][0]["id"]
    assert cid.startswith("call_") and len(cid) > 12 and rid.startswith("probe-")
    status, reply = model.answer({"messages": first + [call_msg, {"role": "tool", "tool_call_id": cid, "content": "3"}]})
    assert reply["choices"][0]["message"]["content"] == "Answer: 3"
    conv = model.conversation_of([rid, reply["id"]])
    assert conv is not None and conv.label == "good" and conv.shown_results() == ["3"] and conv.tools == {"calculator"}
    assert model.conversation_of([rid, "made-up"]) is None


@pytest.mark.parametrize("body, why", [
    ({"messages": "x"}, "without a list of messages"),
    ({"messages": [{"role": "user", "content": "What is 7-7?"}]}, "exactly one of the dev examples"),
    ({"messages": [{"role": "user", "content": "What is 1+2? What is 5*5?"}]}, "exactly one of the dev examples"),
])
def test_unexpected_requests_are_refused_with_a_reason(tmp_path: Path, body: dict, why: str):
    model = ScriptedModel(tmp_path / "m.sock", EXAMPLES)
    status, reply = model.answer(body)
    assert status == 400 and why in reply["error"]["message"] and why in model.refused[0]


def test_more_conversations_than_scripts_are_refused(tmp_path: Path):
    model = ScriptedModel(tmp_path / "m.sock", EXAMPLES)
    ask = {"messages": [{"role": "user", "content": "What is 5*5?"}]}
    assert [model.answer(ask)[0] for _ in range(3)] == [200, 200, 400]


def test_it_serves_the_chat_api_on_a_unix_socket(tmp_path: Path):
    import httpx

    sock = tmp_path / "m.sock"
    with ScriptedModel(sock, EXAMPLES, model_name="Qwen/Qwen3-1.7B"):
        client = httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://localhost", timeout=10)
        assert client.get("/v1/models").json()["data"][0]["id"] == "Qwen/Qwen3-1.7B"
        results = []

        def ask() -> None:
            results.append(client.post("/v1/chat/completions", json={"messages": [
                {"role": "user", "content": "What is 5*5?"}]}).json())

        threads = [threading.Thread(target=ask) for _ in range(2)]
        [t.start() for t in threads]
        [t.join(10) for t in threads]
        assert sorted(r["choices"][0]["message"]["content"] for r in results) == ["Answer: 24", "Answer: 25"]
        assert client.post("/v1/chat/completions", content=b"{" * 10_000).status_code == 400
        assert client.post("/v1/other", content=json.dumps({})).status_code == 404
    assert not sock.exists()
