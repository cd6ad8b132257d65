"""The validation probe's scripted model: an OpenAI-compatible chat endpoint on a Unix socket, served by the
orchestrator, outside the sandbox, that plays the model in the probe's rollouts of the dev examples.

Why it exists: every validation decision must come from something the process that imported the agent's code
cannot forge (issue 46, item 3: code found the probe's adapter through ``gc`` and patched the function that
scored the probe's transcripts, so a constant rubric passed). So the sandbox runs no probe-only code on the
transcripts: it rolls the dev examples out with **the call training uses**
(:func:`ait_env.integrations.verifiers_v0.run_groups`, against this endpoint where training has the model's)
and returns raw results; this module and :mod:`ait_env.probe.dynamic` make every decision:

- **which rollout is which** is decided here, when each conversation first reaches the endpoint: the
  example's scripts (a correct episode, a wrong answer, ...) are dealt to its conversations in an order drawn
  from the operating system's random source, and every reply carries a fresh response id and fresh
  tool-call ids (nonces); a rollout's rewards are matched back to its script by the response ids it
  reports, so the agent's code learns which rollout was the correct one only by reading the replies, as
  its rubric would in training;
- **the tool results** the environment showed the model are read here, from the requests the environment
  sends (outside the sandbox, as the training audit reads the trainer's endpoint), and compared by the
  probe with what the family's own tools return on a fresh world of the example;
- **the tools offered** (their names, from each request's ``tools``) are read here too.

Patching the adapter, verifiers or the rubric inside the sandbox changes training exactly as it changes the
probe (they run the same call); an environment that tells the probe from training by other means (its
dev questions are public) is the training audit's and the outcome check's to catch.

Contract: :class:`ScriptedModel` is a context manager serving ``POST /v1/chat/completions`` (and
``GET /v1/models``) on ``path``. Requests are untrusted (the agent's environment builds them): bounded in
size and parsed by :func:`ait_env.jobs.guard.loads`; whatever they hold is an answer (an HTTP error the
rollout reports), never an exception here. :attr:`ScriptedModel.conversations` holds what was seen.
"""

from __future__ import annotations

import json
import random
import secrets
import socketserver
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from ait_env.jobs import guard
from ait_env.probe.leak import content_text

#: the largest request body read (the local endpoint's own bound)
MAX_BODY = 8 * 1024 * 1024


@dataclass
class Conversation:
    """One rollout as the endpoint saw it: the dev example and script it was dealt, the ids of the replies
    and tool calls it was given (in order), the tool results the environment showed for each call, and the
    tool names it offered."""

    example: int
    label: str
    replies: list[dict[str, Any]]
    response_ids: list[str] = field(default_factory=list)
    call_ids: list[str] = field(default_factory=list)
    results: dict[str, list[str]] = field(default_factory=dict)
    tools: set[str] = field(default_factory=set)
    turns: int = 0

    def shown_results(self) -> list[str | None]:
        """The tool result shown for each call, in call order (None: never shown; a call shown with two
        different results reads as the first and the marker ``<changed>``)."""
        out: list[str | None] = []
        for cid in self.call_ids:
            seen = self.results.get(cid) or []
            out.append(None if not seen else seen[0] if len(set(seen)) == 1 else f"{seen[0]} <changed>")
        return out


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    owner: "ScriptedModel"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        return None

    def address_string(self) -> str:
        return "sandbox"

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path.rstrip("/").endswith("/models"):
            model = {"id": self.server.owner.model_name, "object": "model"}
            self._send(200, {"object": "list", "data": [model]})
        else:
            self._send(404, {"error": {"message": f"no route {self.path[:100]}"}})

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        try:
            size = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            size = -1
        if not 0 <= size <= MAX_BODY:
            self._send(413, {"error": {"message": f"request body over {MAX_BODY} bytes"}})
            self.close_connection = True
            return
        raw = self.rfile.read(size)
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._send(404, {"error": {"message": f"no route {self.path[:100]}"}})
            return
        try:
            body = guard.loads(raw, what="the chat request")
        except guard.Refused as exc:
            self._send(400, {"error": {"message": str(exc)[:500]}})
            return
        status, reply = self.server.owner.answer(body)
        self._send(status, reply)


class ScriptedModel:
    """See the module docstring. ``examples``: per dev example, its question (how a conversation's first
    request is told apart) and its scripts (label -> the assistant messages to reply, turn by turn, each
    ``{"content": ..., "tool_calls": [...]}``: tool-call ids are replaced by nonces); ``model_name``: the name
    it answers as (the job's base model, as in training)."""

    def __init__(self, path: Path, examples: list[tuple[str, dict[str, list[dict[str, Any]]]]],
                 model_name: str = "model") -> None:
        self.path = Path(path)
        self.model_name = model_name  # the job's base model's name, as in training
        self.examples = examples
        rng = random.SystemRandom()
        self._deck: list[list[str]] = []
        for _, scripts in examples:
            labels = list(scripts)
            rng.shuffle(labels)  # which conversation gets which script: unpredictable in the sandbox
            self._deck.append(labels)
        self.conversations: list[Conversation] = []
        self._by_call: dict[str, Conversation] = {}
        self._by_response: dict[str, Conversation] = {}
        self.refused: list[str] = []     # why requests were answered with an error (for the probe's message)
        self._lock = threading.RLock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> "ScriptedModel":
        server = _Server(str(self.path), _Handler)
        server.owner = self
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="ait-probe-model", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            self.path.unlink()
        except OSError:
            pass

    # ------------------------------------------------------------------ reading rollouts back
    def conversation_of(self, response_ids: Any) -> Conversation | None:
        """The conversation whose replies carried ``response_ids`` (as a rollout reports them), or None when
        they are not all of one conversation's."""
        if not isinstance(response_ids, list) or not response_ids:
            return None
        convs = {id(c): c for c in (self._by_response.get(str(r)) for r in response_ids) if c is not None}
        if len(convs) != 1 or any(str(r) not in self._by_response for r in response_ids):
            return None
        return next(iter(convs.values()))

    # ------------------------------------------------------------------ serving
    def answer(self, body: Any) -> tuple[int, dict[str, Any]]:
        """(HTTP status, JSON body) for one chat request."""
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return self._refuse("a chat request without a list of messages")
        messages = [m for m in body["messages"] if isinstance(m, dict)]
        with self._lock:
            conv = self._conversation(messages)
            if isinstance(conv, str):
                return self._refuse(conv)
            for m in messages:
                cid = m.get("tool_call_id")
                if m.get("role") == "tool" and isinstance(cid, str) and cid in conv.results:
                    text = content_text(m.get("content"))
                    if text not in conv.results[cid]:
                        conv.results[cid].append(text)
            tools = body.get("tools")
            for t in tools if isinstance(tools, list) else []:
                fn = t.get("function") if isinstance(t, dict) and isinstance(t.get("function"), dict) else t
                if isinstance(fn, dict):
                    conv.tools.add(str(fn.get("name")))
            reply = conv.replies[conv.turns] if conv.turns < len(conv.replies) else {"content": ""}
            conv.turns += 1
            rid = f"probe-{secrets.token_hex(8)}"
            conv.response_ids.append(rid)
            self._by_response[rid] = conv
            calls = []
            for call in reply.get("tool_calls") or []:
                cid = f"call_{secrets.token_hex(8)}"
                conv.call_ids.append(cid)
                conv.results[cid] = []
                self._by_call[cid] = conv
                fn = call["function"]
                args = fn["arguments"] if isinstance(fn["arguments"], str) else json.dumps(fn["arguments"])
                calls.append({"id": cid, "type": "function",
                              "function": {"name": fn["name"], "arguments": args}})
        message: dict[str, Any] = {"role": "assistant", "content": reply.get("content") or ""}
        if calls:
            message["tool_calls"] = calls
        return 200, {"id": rid, "object": "chat.completion", "created": 0, "model": self.model_name,
                     "choices": [{"index": 0, "message": message, "logprobs": None,
                                  "finish_reason": "tool_calls" if calls else "stop"}],
                     "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}}

    def _refuse(self, why: str) -> tuple[int, dict[str, Any]]:
        with self._lock:
            if len(self.refused) < 20:
                self.refused.append(why)
        return 400, {"error": {"message": f"the probe's scripted model cannot answer: {why}",
                               "type": "probe"}}

    def _conversation(self, messages: list[dict[str, Any]]) -> Conversation | str:
        """The conversation a request continues (by the tool-call ids it echoes), or else a new one, dealt the
        next script of the dev example its prompt asks (few-shot assistant turns of the prompt carry none of
        the model's ids); a string says why there is none."""
        for m in reversed(messages):
            calls = m.get("tool_calls") if m.get("role") == "assistant" else None
            for call in calls if isinstance(calls, list) else []:
                cid = call.get("id") if isinstance(call, dict) else None
                if isinstance(cid, str) and cid in self._by_call:
                    return self._by_call[cid]
        # the row's question is in the last user message (few-shot examples before it may quote other dev
        # questions); else anywhere in the prompt
        users = [content_text(m.get("content")) for m in messages if m.get("role") == "user"]
        matches: list[int] = []
        whole = "\n".join(content_text(m.get("content")) for m in messages)
        for text in ([users[-1]] if users else []) + [whole]:
            matches = [k for k, (question, _) in enumerate(self.examples) if question in text]
            if len(matches) == 1:
                break
        if len(matches) != 1:
            return ("a prompt that does not ask exactly one of the dev examples' questions (the probe hands "
                    "the environment rows whose prompt is the question: keep the row's prompt in what you "
                    "send)")
        k = matches[0]
        if not self._deck[k]:
            return f"more conversations for dev example {k + 1} than the probe rolled out"
        label = self._deck[k].pop()
        conv = Conversation(example=k, label=label, replies=self.examples[k][1][label])
        self.conversations.append(conv)
        return conv
