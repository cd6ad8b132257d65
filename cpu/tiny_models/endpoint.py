"""A local OpenAI-compatible chat endpoint for the tiny models (loopback TCP and/or a Unix socket).

Routes (the subset of vLLM's API that verifiers and the hidden-eval harness use):

- ``GET /health`` (200 once serving, as vLLM's) and ``GET /v1/models``;
- ``POST /v1/chat/completions``: messages + tools rendered with the model's chat template
  (:mod:`cpu.tiny_models.chat`), sampling (``temperature``, ``top_p``, ``max_tokens`` /
  ``max_completion_tokens``; ``n`` must be 1), ``<tool_call>`` output parsed into ``tool_calls``.
  With ``logprobs: true`` the choice carries ``logprobs.content``; with ``return_token_ids: true``
  (vLLM's extension, usually sent in ``extra_body``) the response carries ``prompt_token_ids`` and the
  choice ``token_ids`` — the fields verifiers' clients parse. A prompt that leaves no room in the
  context gets vLLM's 400 "maximum context length" error; ``max_tokens`` is clipped to the room left.
- ``GET /ait/work`` and ``POST /ait/results``: the step barrier of a training run (see
  :class:`StepChannel`): the sandboxed rollout worker long-polls for the next step's work and posts
  its rollout results back; its only network is this endpoint.

Concurrent requests are batched continuously (:class:`cpu.tiny_models.engine.Engine`): a worker thread
admits requests as they arrive into one running decode batch, and each leaves it as soon as it is done,
so the next turns of multi-turn conversations join while other rows are still decoding. Admission
waits for a few arrivals (``admit_wait_s``, or a quarter of the running rows) because each admission
is a prefill call. A request that continues an earlier reply (the next turn of a multi-turn rollout)
reuses that reply's keys/values and prefills only its new tokens
(:class:`cpu.tiny_models.kv_reuse.PrefixStore`); requests with ``top_p < 1`` are sampled apart with
:func:`cpu.tiny_models.model.generate`. Requests carrying ``ait_record: true`` (training
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
from pathlib import Path
from typing import Any

import torch
from aiohttp import web

from cpu.tiny_models.endpoint_routes import MAX_BODY, Record, SpokenTokens, _Req, _Routes
from cpu.tiny_models.engine import Engine, EngineRequest
from cpu.tiny_models.kv_reuse import PrefixStore
from cpu.tiny_models.model import Generation, TinyLM, generate
from cpu.tiny_models.step_channel import MAX_RESULT_BYTES, RESULT_LIMITS, StepChannel, WorkerGone
from cpu.tiny_models.tokenizer import ChatTokenizer

__all__ = ["MAX_BODY", "MAX_RESULT_BYTES", "RESULT_LIMITS", "LocalEndpoint", "Record", "SpokenTokens", "StepChannel",
           "WorkerGone"]


class LocalEndpoint(_Routes):
    """The endpoint (the module docstring): its lifecycle, records and batching worker here; its HTTP routes in
    :mod:`cpu.tiny_models.endpoint_routes`, the rollout worker's step barrier in
    :mod:`cpu.tiny_models.step_channel`."""

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

