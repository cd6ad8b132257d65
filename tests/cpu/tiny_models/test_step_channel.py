"""The trainer's step channel on the local endpoint (``GET /ait/work``, ``POST /ait/results``): the sandboxed
rollout worker runs the agent's code, so its posts are untrusted and what it can make the job runner hold is
bounded (issue 46, item 6: 4 x 8 MB posts for steps never asked raised the runner's peak RSS from 629 MB to
1,406 MB). The memory figures themselves: ``benchmarks/endpoint_memory.py`` (docs/security.md)."""

from __future__ import annotations

import threading

import httpx
import pytest

from cpu.tiny_models.endpoint import MAX_RESULT_BYTES, LocalEndpoint, StepChannel
from cpu.tiny_models.model import TinyConfig, TinyLM


def test_results_are_taken_once_and_only_for_an_awaited_step():
    ch = StepChannel()
    assert ch.post_json(b'{"step": 0, "groups": []}')[0] == 409          # not published yet
    assert ch.post_json(b'{"step": -1, "rows": 8}') == (200, "ok")        # the worker's hello
    assert ch.post_json(b'{"step": -1, "rows": 9}')[0] == 409             # once
    assert ch.wait_results(-1, 5) == {"step": -1, "rows": 8}
    ch.publish({"step": 0})
    assert ch.post_json(b'{"step": 1000000, "groups": "' + b"x" * 1000 + b'"}')[0] == 409
    assert ch.post_json(b'{"step": 0, "groups": []}') == (200, "ok")
    assert ch.post_json(b'{"step": 0, "groups": [[]]}')[0] == 409
    assert ch.wait_results(0, 5) == {"step": 0, "groups": []}
    assert not ch._results  # nothing left held


@pytest.mark.parametrize("body, status, says", [
    (None, 413, "at most 2,097,152 bytes"),
    (b"[" + b"{}," * 300_000 + b"{}]", 400, "more than 200,000 lists and objects"),
    (b'{"step": 0, "rows": ' + b"9" * 5000 + b"}", 400, "an integer of 5000 digits"),
    (b'{"step": 0, "x": ' + b"[" * 5000 + b"}", 400, "nested deeper"),
    (b"{not json", 400, "not valid JSON"),
    (b'{"step": "0"}', 400, "an integer 'step'"),
])
def test_an_unreadable_post_is_refused_and_fails_the_awaited_step_at_once(body, status, says):
    """The trainer hears why at once (the job's fault), instead of waiting out the step timeout."""
    ch = StepChannel()
    ch.publish({"step": 0})
    got, why = ch.post_json(body, 8 * 2**20 if body is None else None)
    assert got == status and says in why
    assert ch.wait_results(0, 5) == {"step": 0, "error": why}


@pytest.fixture
def endpoint(micro_tokenizer):
    model = TinyLM(TinyConfig(vocab_size=micro_tokenizer.vocab_size, max_position_embeddings=64, num_hidden_layers=1))
    with LocalEndpoint(model, micro_tokenizer, "micro") as ep:
        yield ep


def _post(ep: LocalEndpoint, body: bytes) -> httpx.Response:
    return httpx.post(f"http://{ep.host}:{ep.port}/ait/results", content=body,
                      headers={"content-type": "application/json"}, timeout=60)


def test_the_results_route_bounds_what_a_post_can_make_the_runner_hold(endpoint):
    ep = endpoint
    big = b'{"step": 5, "groups": "' + b"x" * (MAX_RESULT_BYTES + 1) + b'"}'
    r = _post(ep, big)
    assert r.status_code == 413 and "at most" in r.json()["error"]["message"]
    assert ep.channel.wait_results(-1, 5)["error"].startswith("the rollout worker posted")

    def chunked() -> object:  # no Content-Length: the route counts what it reads
        yield b'{"step": 0, "groups": "'
        for _ in range(MAX_RESULT_BYTES // 2**16 + 2):
            yield b"x" * 2**16
        yield b'"}'

    ep.channel.publish({"step": 0})
    r = httpx.post(f"http://{ep.host}:{ep.port}/ait/results", content=chunked(), timeout=60)
    assert r.status_code == 413
    assert "error" in ep.channel.wait_results(0, 5)

    ep.channel.publish({"step": 1})
    flood = [threading.Thread(target=_post, args=(ep, b'{"step": %d, "groups": []}' % (10**6 + i)))
             for i in range(8)]
    for t in flood:
        t.start()
    for t in flood:
        t.join()
    assert _post(ep, b'{"step": 1, "groups": [[{"reward": 1.0}]]}').json() == {"ok": True}
    assert ep.channel.wait_results(1, 5) == {"step": 1, "groups": [[{"reward": 1.0}]]}
    assert not ep.channel._results


def test_the_work_route_refuses_hostile_queries(endpoint):
    base = f"http://{endpoint.host}:{endpoint.port}/ait/work"
    for params, status in (({"after": "9" * 5000}, 400), ({"after": "x"}, 400), ({"timeout": "1e999"}, 400),
                           ({"timeout": "nan", "after": "5"}, 400), ({"timeout": "-1", "after": "5"}, 200)):
        r = httpx.get(base, params=params, timeout=30)
        assert r.status_code == status, (params, r.status_code)
        assert r.json() == {"wait": True} if status == 200 else "integer step" in r.text
