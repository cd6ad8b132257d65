"""An endpoint that answers badly ends that episode ``endpoint_failed`` and the run goes on: an HTML page
with status 200, no choices, content as a list of parts, non-numeric usage, an answer that drips a byte
at a time, and an endpoint that echoes the API key (which must appear in nothing the runner writes)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

import pytest

pytest.importorskip("openai")
pytest.importorskip("verifiers")

from ait_env.agents.llm import AgentSettings, run  # noqa: E402

KEY = "sk-test-ECHOED-KEY-0123456789abcdef"
Answer = Callable[[BaseHTTPRequestHandler, dict[str, Any]], None]


def _completion(content: Any, usage: Any = None) -> dict[str, Any]:
    return {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": content}}],
            "usage": usage if usage is not None else {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}


def _send(h: BaseHTTPRequestHandler, status: int, body: bytes, ctype: str = "application/json") -> None:
    h.send_response(status)
    h.send_header("Content-Type", ctype)
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


class _Server:
    def __init__(self, answer: Answer) -> None:
        answer_fn = answer

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
                try:
                    answer_fn(self, body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _run(tmp_path: Path, answer: Answer, episodes: int = 2, **agent: Any) -> tuple[list[dict], Path]:
    with _Server(answer) as url:
        settings = AgentSettings(base_url=url, model="m", api_key=KEY, tool_mode="text", max_retries=0,
                                 **{"timeout_s": 10.0, **agent})
        out = tmp_path / "out"
        run(settings, ["arithmetic"], episodes, backend="stub", out=out, concurrency=1, log=lambda _: None,
            overrides={"env": {"max_turns": 3}})
    return [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()], out


def _no_key_anywhere(out: Path) -> None:
    for path in out.rglob("*"):
        if path.is_file() and path.suffix in (".json", ".jsonl", ".md", ".txt", ".toml", ".py", ".log", ""):
            assert KEY not in path.read_text(errors="replace"), path


@pytest.mark.parametrize("answer", [
    lambda h, b: _send(h, 200, b"<html><body>502 Bad Gateway</body></html>", "text/html"),
    lambda h, b: _send(h, 200, json.dumps({"id": "x", "object": "chat.completion", "choices": []}).encode()),
    lambda h, b: _send(h, 200, b'{"choices": [{"message": 17}]}'),
    lambda h, b: _send(h, 200, b"not json at all"),
], ids=["html page", "no choices", "message not an object", "not json"])
def test_an_unusable_answer_ends_the_episode_and_the_run_goes_on(tmp_path, answer):
    records, out = _run(tmp_path, answer)
    assert [r["status"] for r in records] == ["endpoint_failed", "endpoint_failed"]
    assert all(r["reward"] is None and r["error"] for r in records)
    assert (out / "results.md").exists()


def test_content_as_parts_and_odd_usage_are_read_not_fatal(tmp_path):
    call = '<tool_call>{"name": "list_files", "arguments": {}}</tool_call>'
    answer = lambda h, b: _send(h, 200, json.dumps(_completion(  # noqa: E731
        [{"type": "text", "text": call}], usage={"prompt_tokens": "many", "completion_tokens": None})).encode())
    records, _ = _run(tmp_path, answer, episodes=1)
    assert records[0]["status"] not in ("endpoint_failed", "")  # the episode ran to its turn limit
    assert records[0]["turns"] == 3 and records[0]["tokens_in"] == 0


def test_an_answer_that_drips_is_cut_off_by_its_deadline(tmp_path):
    def drip(h: BaseHTTPRequestHandler, body: dict) -> None:
        payload = json.dumps(_completion("Answer: 1")).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(payload)))
        h.end_headers()
        for byte in payload:
            h.wfile.write(bytes([byte]))
            h.wfile.flush()
            time.sleep(0.5)

    t0 = time.monotonic()
    records, _ = _run(tmp_path, drip, episodes=1, timeout_s=2.0)
    assert records[0]["status"] == "endpoint_failed" and "Timeout" in records[0]["error"]
    assert time.monotonic() - t0 < 30


def test_an_echoed_api_key_is_in_nothing_the_runner_writes(tmp_path):
    turns = {"n": 0}

    def echo(h: BaseHTTPRequestHandler, body: dict) -> None:
        turns["n"] += 1
        auth = h.headers.get("Authorization", "")
        if turns["n"] == 1:  # the key in the content of a 200 (it reaches the env as the agent's turn)
            _send(h, 200, json.dumps(_completion(f"my header was {auth}")).encode())
        else:  # and in an error body
            _send(h, 401, json.dumps({"error": {"message": f"bad credentials: {auth}"}}).encode())

    records, out = _run(tmp_path, echo, episodes=1)
    assert records[0]["status"] == "endpoint_failed" and "<redacted>" in records[0]["error"]
    _no_key_anywhere(out)


@pytest.mark.parametrize("refusal", [
    "This model's maximum context length is 8192 tokens. However, your request has 8266 input tokens.",  # vLLM
    "context_length_exceeded",                                                                             # OpenAI
])
def test_a_conversation_that_outgrows_the_context_is_the_agents_outcome_not_the_endpoints(tmp_path, refusal):
    """The first turn is answered, the second refused with a 400 context-length error (the agent's long turns
    outgrew the model): the env ends the episode as at its turn limit (no job ran: invalid or unparsable, a
    reward that counts), never ``endpoint_failed``. A 400 on the first turn is still the endpoint's."""
    turns: list[int] = []

    def answer(h: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        turns.append(len(body["messages"]))
        if len([m for m in body["messages"] if m["role"] == "assistant"]) == 0:
            _send(h, 200, json.dumps(_completion('<tool_call>{"name": "list_files", "arguments": {}}</tool_call>'
                                                 )).encode())
        else:
            _send(h, 400, json.dumps({"error": {"message": refusal, "type": "BadRequestError",
                                                "code": "context_length_exceeded" if "_" in refusal else 400}}).encode())

    records, _ = _run(tmp_path, answer, episodes=1)
    (rec,) = records
    assert rec["status"] not in ("endpoint_failed", "") and rec["reward"] is not None, rec
    assert "outgrew the model's context" in rec["error"] and rec["turns"] == 1

    first = lambda h, b: _send(h, 400, json.dumps({"error": {"message": refusal}}).encode())  # noqa: E731
    records, _ = _run(tmp_path / "first", first, episodes=1)
    assert records[0]["status"] == "endpoint_failed"
