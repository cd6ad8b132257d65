"""A scripted OpenAI-compatible chat server for tests and benchmarks.

Serves ``POST /v1/chat/completions`` (a JSON answer, or server-sent events with ``stream``) and ``GET /v1/models`` on 127.0.0.1 at a free
port, from an aiohttp app in a background thread. Replies come from a **policy**::

    policy(messages: list[dict], tools: list[dict]) -> dict   # an assistant message

The returned dict has ``content`` and/or ``tool_calls`` (OpenAI format; ``arguments`` may be a dict,
it is JSON-encoded, or any string, sent as it is). A policy raises :class:`PolicyHTTPError` to
answer with an HTTP error or :class:`DropConnection` to close the connection without an answer (counted
as status 0), and may add ``"_delay": seconds`` to answer late.

Like vLLM, the server JSON-decodes the ``arguments`` of assistant ``tool_calls`` echoed back in the
request (vLLM does so to render the chat template) and answers 400 when they are not valid JSON.

Usage::

    with openai_server(correct_policy("arithmetic")) as base_url:      # just the URL
        ...
    with ScriptedOpenAIServer(no_tool_policy) as server:              # URL + request log
        server.base_url, server.requests, server.status_counts

Policies: :func:`correct_policy`, :data:`no_tool_policy`, :func:`malformed_tool_policy`,
:func:`think_policy`, :func:`error_policy`, :func:`slow_policy`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import threading
import time
import uuid
from collections import Counter
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from aiohttp import web

from task_families import get_family
from task_families.base import Instance, TaskFamily, question_key

Policy = Callable[[list[dict[str, Any]], list[dict[str, Any]]], dict[str, Any]]

__all__ = [
    "DropConnection", "Policy", "PolicyHTTPError", "ScriptedOpenAIServer", "correct_policy", "error_policy",
    "malformed_tool_policy", "no_tool_policy", "openai_server", "slow_policy", "think_policy",
]


class DropConnection(Exception):
    """Raised by a policy: the server closes the connection without answering (a dropped connection)."""


class PolicyHTTPError(Exception):
    """Raised by a policy: the server answers with this HTTP status."""

    def __init__(self, status: int = 500, message: str = "scripted server error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# ------------------------------------------------------------------------------------------ server
def _normalise_tool_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for i, c in enumerate(calls):
        fn = dict(c.get("function") or {})
        args = fn.get("arguments", "{}")
        if not isinstance(args, str):
            args = json.dumps(args)
        out.append({"id": c.get("id") or f"call_{uuid.uuid4().hex[:8]}_{i}", "type": c.get("type", "function"),
                    "function": {"name": fn.get("name", ""), "arguments": args}})
    return out


async def _stream(request: web.Request, head: dict[str, Any], message: dict[str, Any], finish: str,
                  usage: dict[str, int], options: dict[str, Any]) -> web.StreamResponse:
    """The answer as OpenAI's server-sent events: one ``chat.completion.chunk`` with the whole message as its
    delta (tool calls with their ``index``), a usage chunk when ``stream_options.include_usage``, ``[DONE]``."""
    delta = {k: v for k, v in message.items() if v is not None}
    if "tool_calls" in delta:
        delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(delta["tool_calls"])]
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    chunks = [{**head, "object": "chat.completion.chunk",
               "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}]
    if options.get("include_usage"):
        chunks.append({**head, "object": "chat.completion.chunk", "choices": [], "usage": usage})
    for chunk in chunks:
        await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "scripted_error", "code": status}},
                             status=status)


class ScriptedOpenAIServer:
    """Context manager: starts the server on enter, stops it on exit."""

    def __init__(self, policy: Policy, model: str = "scripted-model", host: str = "127.0.0.1") -> None:
        self.policy = policy
        self.model = model
        self.host = host
        self.port: int | None = None
        self.requests: list[dict[str, Any]] = []
        self.status_counts: Counter[int] = Counter()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def n_requests(self) -> int:
        return len(self.requests)

    # ---------------------------------------------------------------- handlers
    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.model, "object": "model", "created": 0, "owned_by": "scripted"}]})

    def _count(self, status: int) -> None:
        with self._lock:
            self.status_counts[status] += 1

    async def _chat(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except Exception:  # noqa: BLE001
            self._count(400)
            return _error(400, "request body is not JSON")
        messages, tools = body.get("messages"), body.get("tools") or []
        if not isinstance(messages, list) or not messages:
            self._count(400)
            return _error(400, "messages must be a non-empty list")
        with self._lock:
            self.requests.append(body)
        for m in messages:  # what vLLM does before rendering the chat template
            for tc in (m.get("tool_calls") or []) if m.get("role") == "assistant" else []:
                args = (tc.get("function") or {}).get("arguments")
                if isinstance(args, str) and args:
                    try:
                        json.loads(args)
                    except ValueError:
                        self._count(400)
                        return _error(400, f"assistant tool call arguments are not valid JSON: {args!r}")
        try:
            reply = dict(self.policy(messages, tools))
        except PolicyHTTPError as exc:
            self._count(exc.status)
            return _error(exc.status, exc.message)
        except DropConnection:
            self._count(0)
            if request.transport is not None:
                request.transport.close()
            return web.Response(status=500)  # never delivered: the connection is gone
        except Exception as exc:  # noqa: BLE001 - a policy bug is a 500, like a server crash
            self._count(500)
            return _error(500, f"policy raised {type(exc).__name__}: {exc}")
        delay = float(reply.pop("_delay", 0) or 0)
        if delay:
            await asyncio.sleep(delay)
        message: dict[str, Any] = {"role": "assistant", "content": reply.get("content")}
        calls = _normalise_tool_calls(reply.get("tool_calls") or [])
        if calls:
            message["tool_calls"] = calls
        prompt_chars = sum(len(str(m.get("content") or "")) for m in messages)
        completion_chars = len(message["content"] or "") + sum(len(json.dumps(c)) for c in calls)
        self._count(200)
        head = {"id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "created": int(time.time()),
                "model": body.get("model", self.model)}
        usage = {"prompt_tokens": prompt_chars // 4, "completion_tokens": completion_chars // 4,
                 "total_tokens": (prompt_chars + completion_chars) // 4}
        finish = "tool_calls" if calls else "stop"
        if body.get("stream"):
            return await _stream(request, head, message, finish, usage, body.get("stream_options") or {})
        return web.json_response({**head, "object": "chat.completion",
                                  "choices": [{"index": 0, "message": message, "logprobs": None,
                                               "finish_reason": finish}], "usage": usage})

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> ScriptedOpenAIServer:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, 0))
        self.port = sock.getsockname()[1]
        started = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                app = web.Application(client_max_size=64 * 1024 * 1024)
                app.router.add_post("/v1/chat/completions", self._chat)
                app.router.add_get("/v1/models", self._models)
                self._runner = web.AppRunner(app, access_log=None)
                loop.run_until_complete(self._runner.setup())
                loop.run_until_complete(web.SockSite(self._runner, sock, backlog=1024).start())
            except BaseException as exc:  # noqa: BLE001
                failure.append(exc)
                started.set()
                return
            started.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=run, name=f"scripted-openai-{self.port}", daemon=True)
        self._thread.start()
        started.wait(30)
        if failure:
            raise RuntimeError(f"scripted server failed to start: {failure[0]!r}")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)
        self._thread = None

    def __enter__(self) -> ScriptedOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def openai_server(policy: Policy, model: str = "scripted-model") -> Iterator[str]:
    """Run a scripted server for the ``with`` block; yields its base URL (``http://127.0.0.1:PORT/v1``)."""
    with ScriptedOpenAIServer(policy, model=model) as server:
        yield server.base_url


# ------------------------------------------------------------------------------------------ helpers
def _content_text(content: Any) -> str:
    if isinstance(content, list):  # content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content or "")


def _last_user_index(messages: list[dict[str, Any]]) -> int:
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "user":
            return i
    return -1


def _question(messages: list[dict[str, Any]]) -> str:
    i = _last_user_index(messages)
    return _content_text(messages[i].get("content")) if i >= 0 else ""


def _n_tool_results(messages: list[dict[str, Any]]) -> int:
    return sum(1 for m in messages[_last_user_index(messages) + 1:] if m.get("role") == "tool")


def _resolve(family: str | TaskFamily) -> TaskFamily:
    return get_family(family) if isinstance(family, str) else family


class _Plans:
    """Instances by question key, and their correct transcripts as (tool results before, reply)."""

    def __init__(self, family: str | TaskFamily, instances: list[Instance] | None) -> None:
        self.family = _resolve(family)
        if instances is None:
            from ait_env.hidden.secrets import hidden_set
            instances = hidden_set(self.family.name) + self.family.dev_pool()
        self.by_key = {inst.key: inst for inst in instances}
        self._plans: dict[str, list[tuple[int, dict[str, Any]]]] = {}
        self._lock = threading.Lock()

    def instance(self, messages: list[dict[str, Any]]) -> Instance | None:
        return self.by_key.get(question_key(_question(messages)))

    def plan(self, inst: Instance) -> list[tuple[int, dict[str, Any]]]:
        with self._lock:
            if inst.key not in self._plans:
                steps, before = [], 0
                for m in self.family.transcript(inst, correct=True):
                    if m["role"] == "assistant":
                        steps.append((before, m))
                    elif m["role"] == "tool":
                        before += 1
                self._plans[inst.key] = steps
            return self._plans[inst.key]

    def reply(self, messages: list[dict[str, Any]], n_results: int | None = None) -> dict[str, Any] | None:
        inst = self.instance(messages)
        if inst is None:
            return None
        steps = self.plan(inst)
        k = _n_tool_results(messages) if n_results is None else n_results
        for before, msg in steps:
            if before >= k:
                return json.loads(json.dumps(msg))
        return json.loads(json.dumps(steps[-1][1]))


# ------------------------------------------------------------------------------------------ policies
def correct_policy(family: str | TaskFamily, instances: list[Instance] | None = None) -> Policy:
    """Replays ``family.transcript(instance)`` step by step (structured tool calls).

    The instance is found by the user question among ``instances`` (default: the family's hidden
    set and dev pool); the step is chosen by how many tool results the conversation already has."""
    plans = _Plans(family, instances)

    def policy(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
        reply = plans.reply(messages)
        return reply if reply is not None else {"content": "I do not know. Answer: 0"}

    return policy


def no_tool_policy(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
    """Answers at once with a fixed guess, never calling a tool."""
    return {"content": "I think the answer is 42.\nAnswer: 42"}


def malformed_tool_policy(then: Policy | None = None) -> Policy:
    """Four malformed tool calls (one per turn), then an answer.

    1. structured call to the first tool with invalid JSON arguments,
    2. structured call to an unknown tool,
    3. structured call whose arguments are a JSON list, not an object,
    4. ``<tool_call>`` text block that is not JSON.

    The answer comes from ``then`` (given the conversation without the malformed exchanges, so a
    :func:`correct_policy` replays a full correct solution) or is ``Answer: 0``."""
    n_steps = 4

    def policy(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
        k = _n_tool_results(messages)
        first = (tools[0].get("function") or {}).get("name", "tool") if tools else "tool"
        if k == 0:
            return {"content": "", "tool_calls": [{"id": "bad_0", "type": "function", "function": {
                "name": first, "arguments": '{"expression": "1+'}}]}
        if k == 1:
            return {"content": "", "tool_calls": [{"id": "bad_1", "type": "function", "function": {
                "name": "no_such_tool", "arguments": "{}"}}]}
        if k == 2:
            return {"content": "", "tool_calls": [{"id": "bad_2", "type": "function", "function": {
                "name": first, "arguments": "[1, 2]"}}]}
        if k == 3:
            return {"content": "<tool_call>{not json at all</tool_call>"}
        if then is None:
            return {"content": "Answer: 0"}
        u = _last_user_index(messages)
        return then(messages[:u + 1] + messages[u + 1 + 2 * n_steps:], tools)

    return policy


def think_policy(family: str | TaskFamily, instances: list[Instance] | None = None) -> Policy:
    """A correct solution written like a model behind a server without a tool parser: every reply
    starts with a ``<think>`` block, tool calls are ``<tool_call>{json}</tool_call>`` text in
    ``content`` (no structured ``tool_calls``), and the final reasoning contains a decoy
    ``<tool_call>`` and a decoy number that must not be executed nor scored."""
    plans = _Plans(family, instances)

    def policy(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
        reply = plans.reply(messages)
        if reply is None:
            return {"content": "<think>No idea.</think>Answer: 0"}
        calls = reply.get("tool_calls") or []
        if calls:
            blocks = "\n".join(
                "<tool_call>" + json.dumps({"name": c["function"]["name"],
                                            "arguments": json.loads(c["function"]["arguments"])}) + "</tool_call>"
                for c in calls)
            return {"content": f"<think>Next I call {calls[0]['function']['name']}.</think>\n{blocks}"}
        first = (tools[0].get("function") or {}).get("name", "tool") if tools else "tool"
        decoy = "<tool_call>" + json.dumps({"name": first, "arguments": {}}) + "</tool_call>"
        return {"content": f"<think>Should I call {decoy} once more? No: 987654321 is not it; I am done."
                           f"</think>\n\n{reply.get('content') or ''}"}

    return policy


def error_policy(inner: Policy, *, status: int = 500, fail_attempts: int | None = 1,
                 fail_fraction: float = 1.0) -> Policy:
    """HTTP ``status`` on some requests, otherwise ``inner``.

    A question fails when a hash of it falls below ``fail_fraction`` (deterministic). For those, each
    distinct request fails its first ``fail_attempts`` times (a flaky server that a retry fixes), or
    always when ``fail_attempts`` is None (a dead server)."""
    seen: Counter[str] = Counter()
    lock = threading.Lock()

    def policy(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
        qkey = question_key(_question(messages))
        if int(qkey[:8], 16) / 16 ** 8 < fail_fraction:
            fp = hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()
            with lock:
                attempts = seen[fp]
                seen[fp] += 1
            if fail_attempts is None or attempts < fail_attempts:
                raise PolicyHTTPError(status, f"scripted failure (attempt {attempts + 1})")
        return inner(messages, tools)

    return policy


def slow_policy(inner: Policy, delay: float) -> Policy:
    """``inner``'s replies, each sent after ``delay`` seconds."""

    def policy(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
        return {**inner(messages, tools), "_delay": delay}

    return policy
