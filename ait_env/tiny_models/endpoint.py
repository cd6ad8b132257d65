"""A local OpenAI-compatible chat endpoint for the tiny models (loopback TCP and/or a Unix socket).

Routes (the subset of vLLM's API that verifiers and the hidden-eval harness use):

- ``GET /v1/models``;
- ``POST /v1/chat/completions``: messages + tools rendered with the model's chat template
  (:mod:`ait_env.tiny_models.chat`), sampling (``temperature``, ``top_p``, ``max_tokens`` /
  ``max_completion_tokens``; ``n`` must be 1), ``<tool_call>`` output parsed into ``tool_calls``.
  With ``logprobs: true`` the choice carries ``logprobs.content``; with ``return_token_ids: true``
  (vLLM's extension, usually sent in ``extra_body``) the response carries ``prompt_token_ids`` and the
  choice ``token_ids`` — the fields verifiers' clients parse. A prompt that leaves no room in the
  context gets vLLM's 400 "maximum context length" error; ``max_tokens`` is clipped to the room left.
- ``GET /ait/work`` and ``POST /ait/results``: the step barrier of a training run (see
  :class:`StepChannel`): the sandboxed rollout worker long-polls for the next step's work and posts
  its rollout results back; its only network is this endpoint.

Concurrent requests are batched continuously (:class:`ait_env.tiny_models.engine.Engine`): a worker thread
admits requests as they arrive into one running decode batch, and each leaves it as soon as it is done,
so the next turns of multi-turn conversations join while other rows are still decoding. Admission
waits for a few arrivals (``admit_wait_s``, or a quarter of the running rows) because each admission
is a prefill call. A request that continues an earlier reply (the next turn of a multi-turn rollout)
reuses that reply's keys/values and prefills only its new tokens
(:class:`ait_env.tiny_models.kv_reuse.PrefixStore`); requests with ``top_p < 1`` are sampled apart with
:func:`ait_env.tiny_models.model.generate`. Requests carrying ``ait_record: true`` (training
rollouts) have their exact prompt ids, sampled ids and logprobs kept in :attr:`records` by response
id, so the trainer learns from exactly what was sampled. :attr:`lock` serialises sampling with
weight updates: hold it while changing the model's parameters.
"""

from __future__ import annotations

import asyncio
import hashlib
import queue
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from aiohttp import web

from ait_env.jobs import guard
from ait_env.tiny_models.chat import IM_END, parse_output
from ait_env.tiny_models.engine import Engine, EngineRequest
from ait_env.tiny_models.kv_reuse import PrefixStore
from ait_env.tiny_models.model import Generation, TinyLM, generate
from ait_env.tiny_models.tokenizer import ChatTokenizer

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


class WorkerGone(RuntimeError):
    """The rollout worker ended before posting the awaited results."""


#: the most bytes of JSON one post of rollout results may have (a step of the local backend's largest batch,
#: 128 rollouts, is well under 1 MB; the rest is room for long errors and many metrics)
MAX_RESULT_BYTES = 2 * 2**20
#: the bounds of a post of rollout results (:mod:`ait_env.jobs.guard`)
RESULT_LIMITS = guard.Limits(max_chars=MAX_RESULT_BYTES, max_items=200_000)


class StepChannel:
    """Work items for the sandboxed rollout worker and the results it posts back, one step at a time.

    The worker runs the agent's code, so what it posts is untrusted, and what it can make this process hold
    is bounded (:meth:`post_json`): results are taken only for a step the trainer awaits — the worker's hello
    (step -1), then each published step until its results are taken — and only once; one post is at most
    ``max_result_bytes`` of JSON within :data:`RESULT_LIMITS`, and the results route reads one post at a time
    (:attr:`reading`). So the channel holds at most two results (the hello and one step's) and one body being
    read. A post for any other step is refused (409) and dropped. A post that cannot be read at all (too
    large, not JSON, past the bounds, no integer ``step``) is refused (413/400) and fails the step being
    awaited: the trainer gets an ``error`` result that says why (the job's fault, at once, not a timeout)."""

    def __init__(self, max_result_bytes: int = MAX_RESULT_BYTES) -> None:
        self._cond = threading.Condition()
        self._work: dict[str, Any] | None = None
        self._results: dict[int, Any] = {}
        self._done = False
        self._aborted: str | None = None
        self.max_result_bytes = max_result_bytes
        self._awaited: set[int] = {-1}   # steps whose results may still come
        self._fault: str | None = None   # why a post that could not be read was refused
        #: the results route holds it while it reads and parses a post (one body in memory at a time)
        self.reading = asyncio.Lock()

    def publish(self, work: dict[str, Any]) -> None:
        with self._cond:
            self._work = work
            self._awaited.add(int(work["step"]))
            self._cond.notify_all()

    def finish(self) -> None:
        with self._cond:
            self._done = True
            self._cond.notify_all()

    def next_work(self, after_step: int, timeout: float) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._done and (self._work is None or self._work["step"] <= after_step):
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
            return {"done": True} if self._done else dict(self._work or {})

    def abort(self, reason: str) -> None:
        """The rollout worker is gone: wake up whoever waits for results."""
        with self._cond:
            self._aborted = reason
            self._cond.notify_all()

    def post(self, step: int, results: Any) -> str | None:
        """Take ``results`` for ``step``; the reason when the step is not awaited (they are dropped)."""
        with self._cond:
            if step not in self._awaited or self._done:
                return (f"no results are awaited for step {step} (only the step the trainer published, once); "
                        "post each step's results once, after its work item")
            self._awaited.discard(step)
            self._results[step] = results
            self._cond.notify_all()
            return None

    def post_json(self, raw: bytes | None, length: int | None = None) -> tuple[int, str]:
        """A post of the results route: ``raw`` is its body (None: longer than :attr:`max_result_bytes`,
        ``length`` bytes if known). Returns the HTTP status and what it says (module contract above)."""
        if raw is None:
            size = f"{length:,} bytes" if length is not None else "more"
            return self._refuse(413, f"the rollout worker posted {size} of results; at most "
                                     f"{self.max_result_bytes:,} bytes are taken per post: return shorter errors "
                                     "and fewer metrics from the environment")
        try:
            body = guard.loads(raw, RESULT_LIMITS, what="the rollout worker's results")
        except guard.Refused as exc:
            return self._refuse(400, str(exc))
        step = body.get("step") if isinstance(body, dict) else None
        if not isinstance(step, int) or isinstance(step, bool):
            return self._refuse(400, "the rollout worker's results must be a JSON object with an integer 'step'")
        why = self.post(step, body)
        return (409, why) if why is not None else (200, "ok")

    def _refuse(self, status: int, why: str) -> tuple[int, str]:
        """Refuse a post that cannot be attributed to a step: the step being awaited fails with ``why``."""
        with self._cond:
            self._fault = self._fault or why
            self._cond.notify_all()
        return status, why

    def wait_results(self, step: int, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        with self._cond:
            while step not in self._results:
                if self._fault is not None:
                    self._awaited.discard(step)
                    why, self._fault = self._fault, None
                    return {"step": step, "error": why}
                if self._aborted is not None:
                    raise WorkerGone(self._aborted)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no rollout results for step {step} within {timeout:.0f} s")
                self._cond.wait(left)
            return self._results.pop(step)


class SpokenTokens:
    """The model's own tokens for the conversations it took part in (token in, token out).

    A client sends a conversation back as text; re-tokenizing the model's earlier replies can give other ids
    than it sampled (BPE has many spellings of one text). When a rendered prompt starts with the text of a
    finished reply (its prompt and sampled text up to the end-of-turn token), the prompt's ids reuse that reply's
    ids and only the rest is tokenized: the model reads its own sampled tokens, the reply's keys/values are
    reusable, and a training rollout is one sequence whose turns extend each other
    (:func:`ait_env.cpu_trainer.grpo.rollout_sequences`). Safe where the end-of-turn token is a special token (the
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


class LocalEndpoint:
    def __init__(self, model: TinyLM, tokenizer: ChatTokenizer, model_name: str, *, host: str | None = "127.0.0.1",
                 port: int = 0, uds: str | Path | None = None, max_batch: int = 512, batch_window_s: float = 0.004, admit_wait_s: float = 0.02,
                 seed: int = 0, max_model_len: int | None = None, reuse_kv: bool = True,
                 parse_tool_calls: bool = True, engine_slots: int = 64, held_tokens: int | None = None) -> None:
        """``parse_tool_calls``: split ``<tool_call>`` blocks out of the reply into ``tool_calls`` (the tiny
        models' format); ``False`` returns the reply's text unchanged as ``content`` (a model whose chat
        template has no tool calls: clients run it in text tool mode and parse the calls themselves).
        ``engine_slots``: decode rows allocated up front (they grow when needed); ``held_tokens``: a bound on
        the tokens whose keys/values are kept for the next turns (both matter for a model whose keys/values
        take tens of KB per token)."""
        self.parse_tool_calls = parse_tool_calls
        self.model = model
        self.tok = tokenizer
        self.model_name = model_name
        self.host, self.port, self.uds = host, port, (str(uds) if uds else None)
        self.max_batch = max_batch
        self.batch_window_s = batch_window_s
        self.admit_wait_s = admit_wait_s
        self.max_model_len = max_model_len or model.cfg.max_position_embeddings
        self.seed = seed
        self.generator = torch.Generator().manual_seed(seed)
        self._weights_version = 0
        self._seen: dict[bytes, int] = {}
        self.lock = threading.RLock()
        self.records: dict[str, Record] = {}
        self.channel = StepChannel()
        self.stats = {"requests": 0, "batches": 0, "generated_tokens": 0, "gen_seconds": 0.0}
        #: keys/values of finished turns, reused when the conversation continues (top_p 1 requests)
        self.reuse_kv = reuse_kv
        self.prefix_store = PrefixStore(tokenizer.im_end_id, max_tokens=held_tokens)
        self._spoken = SpokenTokens()
        self.engine = Engine(model, tokenizer.im_end_id, self.prefix_store if reuse_kv else None, slots=engine_slots)
        self._q: queue.Queue[_Req | None] = queue.Queue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._threads: list[threading.Thread] = []
        self._started = threading.Event()

    # ------------------------------------------------------------------ lifecycle
    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self) -> "LocalEndpoint":
        t = threading.Thread(target=self._serve, name="ait-endpoint-http", daemon=True)
        w = threading.Thread(target=self._worker, name="ait-endpoint-gen", daemon=True)
        self._threads = [t, w]
        w.start()
        t.start()
        if not self._started.wait(30):
            raise RuntimeError("the local endpoint did not start")
        return self

    def stop(self) -> None:
        self.channel.finish()
        self._q.put(None)
        if self._loop is not None and self._runner is not None:
            fut = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop)
            try:
                fut.result(10)
            except Exception:  # noqa: BLE001
                pass
            self._loop.call_soon_threadsafe(self._loop.stop)
        for t in self._threads:
            t.join(timeout=10)

    def __enter__(self) -> "LocalEndpoint":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        app = web.Application(client_max_size=MAX_BODY)
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

    # ------------------------------------------------------------------ batching worker
    def _collect(self, block: bool) -> list[_Req | None]:
        """What has arrived; when ``block``, wait for a first request and then ``batch_window_s`` for more."""
        items: list[_Req | None] = []
        if block:
            items.append(self._q.get())
            deadline = time.monotonic() + self.batch_window_s
            while items[-1] is not None and (left := deadline - time.monotonic()) > 0:
                try:
                    items.append(self._q.get(timeout=left))
                except queue.Empty:
                    break
        while not items or items[-1] is not None:
            try:
                items.append(self._q.get_nowait())
            except queue.Empty:
                break
        return items

    def _worker(self) -> None:
        """Drive the continuous-batching :class:`Engine`: admit arrivals, decode one token, repeat."""
        torch.set_grad_enabled(False)
        engine = self.engine
        pending: list[tuple[float, _Req]] = []
        while True:
            items = self._collect(block=engine.idle and not pending)
            stop = None in items
            now = time.monotonic()
            plain = [r for r in items if r is not None and not (r.top_p >= 1.0)]
            pending += [(now, r) for r in items if r is not None and r.top_p >= 1.0]
            if plain:
                self._run_plain(plain)
            if stop:
                exc = RuntimeError("the local endpoint is shutting down")
                engine.fail_all(exc)
                for _, r in pending:
                    r.loop.call_soon_threadsafe(_set_exc, r.future, exc)
                return
            # Admit when idle, when enough have gathered (each admission is one prefill call),
            # or when the oldest has waited long enough.
            room = self.max_batch - engine.alive
            if pending and room > 0 and (engine.idle or len(pending) >= max(1, engine.alive // 4)
                                         or now - pending[0][0] >= self.admit_wait_s):
                batch, pending = [r for _, r in pending[:room]], pending[room:]
                t0 = time.perf_counter()
                try:
                    with self.lock:
                        engine.admit([self._engine_request(r) for r in batch])
                except Exception as exc:  # noqa: BLE001 - answer every waiter, never kill the worker
                    for r in batch:
                        r.loop.call_soon_threadsafe(_set_exc, r.future, exc)
                    engine.fail_all(exc)
                self.stats["batches"] += 1
                self.stats["requests"] += len(batch)
                self.stats["gen_seconds"] += time.perf_counter() - t0
            if not engine.idle:
                t0 = time.perf_counter()
                try:
                    with self.lock:
                        engine.step()
                except Exception as exc:  # noqa: BLE001
                    engine.fail_all(exc)
                self.stats["gen_seconds"] += time.perf_counter() - t0

    def _engine_request(self, r: _Req) -> EngineRequest:
        def done(g: Generation) -> None:
            self.stats["generated_tokens"] += len(g.tokens)
            r.loop.call_soon_threadsafe(_set_result, r.future, g)

        def error(exc: BaseException) -> None:
            r.loop.call_soon_threadsafe(_set_exc, r.future, exc)

        return EngineRequest(r.prompt_ids, r.max_tokens, r.temperature, torch.Generator().manual_seed(r.seed),
                             done, error)

    def _run_plain(self, reqs: list[_Req]) -> None:
        """Requests with ``top_p < 1``: sampled apart, a batch per (temperature, top_p), to the end."""
        groups: dict[tuple[float, float], list[_Req]] = {}
        for r in reqs:
            groups.setdefault((r.temperature, r.top_p), []).append(r)
        for (temperature, top_p), group in groups.items():
            t0 = time.perf_counter()
            try:
                with self.lock:
                    outs = generate(self.model, [r.prompt_ids for r in group],
                                    max_new_tokens=max(r.max_tokens for r in group), temperature=temperature,
                                    top_p=top_p, stop_ids={self.tok.im_end_id}, generator=self.generator)
            except Exception as exc:  # noqa: BLE001
                for r in group:
                    r.loop.call_soon_threadsafe(_set_exc, r.future, exc)
                continue
            self.stats["batches"] += 1
            self.stats["requests"] += len(group)
            self.stats["gen_seconds"] += time.perf_counter() - t0
            for r, g in zip(group, outs):
                if len(g.tokens) > r.max_tokens:  # a longer request shared the batch
                    g.tokens, g.logprobs, g.finish_reason = g.tokens[:r.max_tokens], g.logprobs[:r.max_tokens], "length"
                self.stats["generated_tokens"] += len(g.tokens)
                r.loop.call_soon_threadsafe(_set_result, r.future, g)

    # ------------------------------------------------------------------ records
    def pop_records(self, ids: list[str]) -> list[Record | None]:
        return [self.records.pop(i, None) for i in ids]

    def clear_records(self) -> None:
        self.records.clear()

    def weights_updated(self) -> None:
        """Call (holding :attr:`lock`) after changing the model's parameters: drops cached keys/values."""
        self.prefix_store.clear()
        self._weights_version += 1
        self._seen.clear()

    def _request_seed(self, prompt_ids: list[int]) -> int:
        """The sampling seed of one request: a hash of the endpoint's seed, the weights version, the prompt
        and how many identical prompts came before it under these weights. A request's sample then does
        not depend on arrival order or on which requests share its batch, so a job rerun with the same
        seeds samples the same rollouts (up to float round-off of batched kernels)."""
        h = hashlib.blake2b(digest_size=16)
        h.update(f"{self.seed}:{self._weights_version}:".encode())
        h.update(b",".join(str(t).encode() for t in prompt_ids))
        key = h.digest()
        n = self._seen.get(key, 0)
        self._seen[key] = n + 1
        h.update(f":{n}".encode())
        return int.from_bytes(h.digest()[:8], "little") & ((1 << 63) - 1)


def _set_result(fut: asyncio.Future[Any], value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_exc(fut: asyncio.Future[Any], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)

