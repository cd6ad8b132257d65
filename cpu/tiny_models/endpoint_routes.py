"""The HTTP surface of :class:`cpu.tiny_models.endpoint.LocalEndpoint` (its module docstring lists the
routes): the aiohttp app on loopback TCP and/or a Unix socket, the OpenAI-compatible chat route that renders,
queues a request for the batching worker and shapes its answer, and the step channel's two routes for the
sandboxed rollout worker (whose queries and bodies are untrusted: short numbers, bounded posts). A mixin over
the endpoint's state, kept apart from its batching worker."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from cpu.tiny_models.chat import IM_END, parse_output

if TYPE_CHECKING:
    import queue
    import threading

    from cpu.tiny_models.step_channel import StepChannel
    from cpu.tiny_models.tokenizer import ChatTokenizer

#: the largest request body the endpoint reads
MAX_BODY = 8 * 1024 * 1024


@dataclass
class _Req:
    prompt_ids: list[int]
    temperature: float
    top_p: float
    max_tokens: int
    seed: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]


@dataclass
class Record:
    """One recorded sampling (a training rollout's turn): exactly what the model saw and produced."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    #: the request's messages and tools, as sent (the training audit reads them: :mod:`ait_env.probe.training_audit`)
    messages: list[Any] | None = None
    tools: list[Any] | None = None


class SpokenTokens:
    """The model's own tokens for the conversations it took part in (token in, token out).

    A client sends a conversation back as text; re-tokenizing the model's earlier replies can give other ids
    than it sampled (BPE has many spellings of one text). When a rendered prompt starts with the text of a
    finished reply (its prompt and sampled text up to the end-of-turn token), the prompt's ids reuse that reply's
    ids and only the rest is tokenized: the model reads its own sampled tokens, the reply's keys/values are
    reusable, and a training rollout is one sequence whose turns extend each other
    (:func:`cpu.grpo.rollout_sequences`). Safe where the end-of-turn token is a special token (the
    text after it tokenizes the same alone as in the whole). Bounded: the oldest replies are forgotten."""

    def __init__(self, max_entries: int = 512) -> None:
        self.max_entries = max_entries
        self._by_text: OrderedDict[str, list[int]] = OrderedDict()

    def put(self, text: str, ids: list[int]) -> None:
        self._by_text[text] = ids
        self._by_text.move_to_end(text)
        while len(self._by_text) > self.max_entries:
            self._by_text.popitem(last=False)

    def encode(self, rendered: str, encode: Callable[[str], list[int]]) -> list[int]:
        best = max((t for t in self._by_text if rendered.startswith(t)), key=len, default=None)
        if best is None:
            return encode(rendered)
        return self._by_text[best] + encode(rendered[len(best):])


class _Routes:
    """The endpoint's HTTP app and handlers (the module docstring)."""

    tok: "ChatTokenizer"
    model_name: str
    host: str | None
    port: int
    uds: str | None
    max_model_len: int
    parse_tool_calls: bool
    records: dict[str, "Record"]
    channel: "StepChannel"
    _spoken: "SpokenTokens"
    _q: "queue.Queue[_Req | None]"
    _loop: asyncio.AbstractEventLoop | None
    _runner: web.AppRunner | None
    _started: "threading.Event"

    def _request_seed(self, prompt_ids: list[int]) -> int:  # pragma: no cover - the endpoint's
        raise NotImplementedError

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/ait/work", self._work)
        app.router.add_post("/ait/results", self._results)
        self._runner = web.AppRunner(app, access_log=None)
        loop.run_until_complete(self._runner.setup())
        if self.host is not None:
            site = web.TCPSite(self._runner, self.host, self.port)
            loop.run_until_complete(site.start())
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        if self.uds is not None:
            loop.run_until_complete(web.UnixSite(self._runner, self.uds).start())
            Path(self.uds).chmod(0o777)
        self._started.set()
        loop.run_forever()

    # ------------------------------------------------------------------ handlers
    async def _health(self, request: web.Request) -> web.Response:  # noqa: ARG002
        return web.Response(status=200)

    async def _models(self, request: web.Request) -> web.Response:  # noqa: ARG002
        return web.json_response({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "owned_by": "ai-trains-ai", "max_model_len": self.max_model_len}]})

    @staticmethod
    def _error(status: int, message: str) -> web.Response:
        return web.json_response({"error": {"message": message, "type": "BadRequestError", "code": status}},
                                 status=status)

    async def _chat(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            return self._error(400, "request body is not JSON")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return self._error(400, "messages must be a non-empty list")
        if int(body.get("n", 1) or 1) != 1:
            return self._error(400, "only n=1 is supported")
        try:
            rendered = self.tok.render(messages, body.get("tools") or None, add_generation_prompt=True)
            prompt_ids = self._spoken.encode(rendered, self.tok.encode)
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            return self._error(400, f"could not render messages: {exc}")
        want = body.get("max_completion_tokens") or body.get("max_tokens") or 256
        room = self.max_model_len - len(prompt_ids)
        if room < 1:
            return self._error(400, f"This model's maximum context length is {self.max_model_len} tokens. However, "
                                    f"your request has {len(prompt_ids)} input tokens. Please reduce the length of "
                                    "the input messages.")
        temperature = float(body.get("temperature", 1.0) if body.get("temperature") is not None else 1.0)
        top_p = float(body.get("top_p", 1.0) if body.get("top_p") is not None else 1.0)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self._q.put(_Req(prompt_ids, temperature, top_p, max(1, min(int(want), room)), self._request_seed(prompt_ids),
                         loop, fut))
        gen = await fut
        text = self.tok.decode(gen.tokens)
        content, calls = parse_output(text) if self.parse_tool_calls else (text.split(IM_END, 1)[0], [])
        finish = gen.finish_reason
        if calls and finish == "stop":
            finish = "tool_calls"
        rid = "chatcmpl-" + uuid.uuid4().hex
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": content or None,
                                                          "tool_calls": calls or None},
                                  "finish_reason": finish, "logprobs": None}
        if body.get("logprobs"):
            choice["logprobs"] = {"content": [{"token": self.tok.tok.id_to_token(t) or "", "logprob": lp,
                                               "bytes": None, "top_logprobs": []}
                                              for t, lp in zip(gen.tokens, gen.logprobs)]}
        resp: dict[str, Any] = {"id": rid, "object": "chat.completion", "created": int(time.time()),
                                "model": self.model_name, "choices": [choice],
                                "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(gen.tokens),
                                          "total_tokens": len(prompt_ids) + len(gen.tokens)}}
        if body.get("return_token_ids"):
            resp["prompt_token_ids"] = prompt_ids
            choice["token_ids"] = gen.tokens
        if body.get("ait_record"):
            self.records[rid] = Record(prompt_ids, gen.tokens, gen.logprobs, gen.finish_reason, messages,
                                       body.get("tools") or None)
        if gen.finish_reason == "stop" and not self.parse_tool_calls:
            self._spoken.put(rendered + text, prompt_ids + gen.tokens)
        return web.json_response(resp)

    async def _work(self, request: web.Request) -> web.Response:
        after_text, timeout_text = request.query.get("after", "-1"), request.query.get("timeout", "60")
        try:  # the query comes from the sandboxed worker: short numbers only
            if len(after_text) > 20 or len(timeout_text) > 20:
                raise ValueError("too long")
            after, timeout = max(-1, int(after_text)), float(timeout_text)
            if timeout != timeout or abs(timeout) == float("inf"):
                raise ValueError("not finite")
        except ValueError:
            return self._error(400, "after must be an integer step and timeout a number of seconds")
        timeout = min(max(timeout, 0.0), 600.0)
        work = await asyncio.to_thread(self.channel.next_work, after, timeout)
        return web.json_response(work or {"wait": True})

    async def _results(self, request: web.Request) -> web.Response:
        """Rollout results from the sandboxed worker: read one post at a time, at most the channel's
        ``max_result_bytes``, then :meth:`StepChannel.post_json` decides."""
        ch = self.channel
        limit = ch.max_result_bytes
        if request.content_length is not None and request.content_length > limit:
            status, why = ch.post_json(None, request.content_length)
            return self._error(status, why)
        async with ch.reading:
            raw = bytearray()
            async for chunk in request.content.iter_chunked(1 << 16):
                raw += chunk
                if len(raw) > limit:
                    status, why = ch.post_json(None)
                    return self._error(status, why)
            status, why = ch.post_json(bytes(raw))
        return web.json_response({"ok": True}) if status == 200 else self._error(status, why)
