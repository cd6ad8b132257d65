"""The hidden-eval harness: score a served model on a task family's hidden set.

One harness for every backend: vLLM on GPU pods, the local tiny-model endpoint, and the scripted
test server (``tests/fakes/openai_server.py``) all speak the OpenAI chat-completions API, and this
module drives them the same way.

Contract
--------
For each instance (the family's hidden set, or the first ``limit`` of it):

1. The conversation starts from ``family.eval_messages(instance)`` (system prompt + question); the
   request carries ``family.tool_schemas()`` as ``tools``, ``temperature=0`` and
   ``max_tokens=family.eval_max_tokens``, plus any ``extra_body`` (e.g.
   ``{"chat_template_kwargs": {"enable_thinking": False}}``) and ``tool_choice`` when given.
2. Tool loop, at most ``family.eval_max_turns`` model turns (one turn = one request; calls are read
   by :func:`ait_env.jobs.toolcalls.structured_tool_calls` and :func:`ait_env.jobs.toolcalls.parse_text_tool_calls`):
   - structured ``tool_calls`` in the reply are executed with ``family.call_tool`` on the episode's world
     (``family.new_world(instance)``, one per instance: a stateful family's tools change it; None otherwise);
   - when the reply has no structured calls, ``<tool_call>{"name": .., "arguments": {..}}</tool_call>``
     blocks in ``content`` (outside ``<think>`` blocks) are executed instead (a server without a tool
     parser; the assistant content goes back verbatim, results as ``role: tool`` messages);
   - a malformed call (invalid JSON, arguments not an object or past :mod:`ait_env.jobs.guard`'s bounds:
     integers of hundreds of digits, deep nesting, NaN; an unknown tool) becomes an ``error: ...`` tool
     result for the model to read, never an exception (whatever the model writes is its score, not an
     error record);
   - the loop stops when a reply has no tool call (the answer) or the turns run out
     (``stop_reason="max_turns"``; the last reply is scored as it is).
3. Score = ``family.score(instance, text, world)`` (the checker, and a stateful family's final state) where ``text`` is the final assistant content with
   ``<think>`` blocks and ``<tool_call>`` blocks removed and its digit runs bounded
   (:func:`ait_env.jobs.guard.bound_digits`: a 5,000-digit answer is a wrong answer, never a checker
   exception), clipped to [0, 1].

Infrastructure vs. model
------------------------
Connection errors, timeouts (``request_timeout`` per request) and HTTP 408/409/429/5xx are retried
``max_retries`` times with exponential backoff. A request that still fails, any other HTTP error
(400 on the first turn, 401, 404, ...), or a harness/checker exception makes the instance an
**error record**: score 0, ``error`` set, counted in ``n_errors``. One exception: an HTTP 400 about the
context length on a later turn is the model's doing (it talked too long); the instance stops with
``stop_reason="context_length"`` and is scored on what it has (no answer: 0), not as an error.
The eval is **failed** (``EvalResult.failed``) when ``n_errors > max_error_rate * n``; with
``abort_on_failure`` the remaining instances are then skipped as ``aborted`` errors. A failed eval
says nothing about the model: callers must treat it as an infrastructure failure (retry, or mark
the job ``infra_failed``), never as a score. ``EvalResult.raise_if_failed()`` raises
:class:`EvalInfraError`.

Statistics
----------
``score`` is the mean over all ``n`` instances (errors count as 0; ``score_excluding_errors`` leaves
them out). The 95% confidence interval is the **Wilson score interval** when every per-instance
score is 0 or 1 (``ci_method="wilson"``), otherwise the **normal approximation**
``mean ± 1.96·s/√n`` with the sample standard deviation ``s``, clipped to [0, 1]
(``ci_method="normal"``). ``ci95`` is the half-width ``(ci_high - ci_low) / 2``.

This module imports only :mod:`task_families`, :mod:`ait_env.hidden.secrets`, :mod:`ait_env.jobs.toolcalls`,
:mod:`ait_env.jobs.guard` (never agent code or an agent-written environment module), ``openai`` and
``pydantic``. The API key defaults to ``"EMPTY"`` (vLLM ignores it); ``OPENAI_API_KEY`` is deliberately not
read, so a real key never goes to a pod.

CLI::

    python -m ait_env.hidden.evaluation --family arithmetic --base-url http://127.0.0.1:8000/v1 \\
        --model NAME [--limit N] [--out records.jsonl] [--concurrency 32]

prints the summary as JSON and exits 0, or 2 when the eval failed (infrastructure).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

import openai
from openai.types.chat import ChatCompletion
from pydantic import BaseModel

from ait_env.jobs.guard import bound_digits
from ait_env.jobs.toolcalls import CallAttempt, final_text, parse_text_tool_calls, strip_think, structured_tool_calls
from task_families import get_family
from task_families.base import Instance, TaskFamily, instances_hash
from ait_env.hidden.eval_records import (EvalInfraError, EvalRecord, EvalResult, ToolCallRecord,  # noqa: F401
                                         confidence_interval, wilson_interval)

__all__ = [
    "EvalInfraError", "EvalRecord", "EvalResult", "ToolCallRecord", "confidence_interval", "evaluate",
    "evaluate_async", "parse_text_tool_calls", "strip_think", "wilson_interval",
]

_RETRY_STATUS = {408, 409, 429}
_CONTEXT_HINTS = ("context length", "context_length", "maximum context", "too long", "max_model_len",
                  "maximum model length")


def _run_call(family: TaskFamily, call: CallAttempt, world: Any = None) -> tuple[str, str | None]:
    """(tool message content, harness error) of one call on the episode's ``world``; never raises."""
    if call.error is not None:
        return f"error: {call.error}", call.error
    names = family.tool_names
    if call.name not in names:
        err = f"unknown tool {call.name!r}; available tools: {', '.join(names)}"
        return f"error: {err}", err
    try:
        return str(family.call_tool(call.name, call.arguments or {}, world)), None
    except Exception as exc:  # noqa: BLE001 - a tool crash is an observation for the model
        return f"error: {type(exc).__name__}: {exc}", None


# ------------------------------------------------------------------------------------------ requests
class _RequestFailed(Exception):
    def __init__(self, message: str, status: int | None = None, retryable: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable


def _classify(exc: BaseException) -> _RequestFailed:
    if isinstance(exc, openai.APITimeoutError):
        return _RequestFailed(f"timeout: {exc}", retryable=True)
    if isinstance(exc, openai.APIConnectionError):
        return _RequestFailed(f"connection error: {exc}", retryable=True)
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        retry = status in _RETRY_STATUS or status >= 500
        return _RequestFailed(f"HTTP {status}: {exc.message}", status=status, retryable=retry)
    return _RequestFailed(f"{type(exc).__name__}: {exc}", retryable=False)


class _Settings(BaseModel):
    model: str
    max_turns: int
    max_tokens: int
    temperature: float
    request_timeout: float
    max_retries: int
    retry_backoff: float
    extra_body: dict[str, Any] | None
    tool_choice: str | None
    keep_messages: bool


async def _complete(client: openai.AsyncOpenAI, s: _Settings, messages: list[dict[str, Any]],
                    tools: list[dict[str, Any]], abort: asyncio.Event) -> Any:
    # The request body goes through ``client.post`` as it is: ``chat.completions.create`` would
    # re-walk the whole (growing) conversation against its TypedDicts, ~7 ms of CPU per request.
    body: dict[str, Any] = {"model": s.model, "messages": messages, "tools": tools,
                            "temperature": s.temperature, "max_tokens": s.max_tokens}
    if s.tool_choice is not None:
        body["tool_choice"] = s.tool_choice
    if s.extra_body:
        body.update(s.extra_body)
    attempt = 0
    while True:
        try:
            resp = await client.post("/chat/completions", cast_to=ChatCompletion, body=body,
                                     options={"timeout": s.request_timeout})
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - classified below
            failure = _classify(exc)
            if not failure.retryable or attempt >= s.max_retries or abort.is_set():
                if failure.retryable and attempt:
                    failure.args = (f"{failure.args[0]} (after {attempt} retries)",)
                raise failure from exc
            await asyncio.sleep(min(s.retry_backoff * 2 ** attempt, 10.0))
            attempt += 1
            continue
        if not getattr(resp, "choices", None):
            raise _RequestFailed("server returned no choices")
        return resp


def _is_context_error(failure: _RequestFailed) -> bool:
    msg = str(failure).lower()
    return failure.status == 400 and any(h in msg for h in _CONTEXT_HINTS)


async def _run_instance(client: openai.AsyncOpenAI, family: TaskFamily, inst: Instance, index: int,
                        s: _Settings, tools: list[dict[str, Any]], abort: asyncio.Event) -> EvalRecord:
    rec = EvalRecord(index=index, key=inst.key, question=inst.question, answer=inst.answer)
    t0 = time.perf_counter()
    messages: list[dict[str, Any]] = [dict(m) for m in family.eval_messages(inst)]
    try:
        world = family.new_world(inst)  # this episode's own world (stateful families), never shared
        for turn in range(1, s.max_turns + 1):
            if abort.is_set():
                raise _RequestFailed("aborted: too many errors in this eval")
            try:
                resp = await _complete(client, s, messages, tools, abort)
            except _RequestFailed as failure:
                if turn > 1 and _is_context_error(failure):
                    rec.stop_reason = "context_length"
                    rec.response, rec.final_text = "", ""
                    break
                raise
            rec.turns = turn
            usage = getattr(resp, "usage", None)
            if usage is not None:
                rec.prompt_tokens += int(getattr(usage, "prompt_tokens", 0) or 0)
                rec.completion_tokens += int(getattr(usage, "completion_tokens", 0) or 0)
            msg = resp.choices[0].message
            content = msg.content or ""
            calls = structured_tool_calls(msg)
            if calls:
                tool_calls = []
                for c in calls:
                    # vLLM json-decodes echoed arguments for the chat template: send only valid objects.
                    args = c.raw_arguments if c.arguments is not None and c.raw_arguments.strip() else "{}"
                    tool_calls.append({"id": c.id, "type": "function",
                                       "function": {"name": c.name or "", "arguments": args}})
                messages.append({"role": "assistant", "content": content, "tool_calls": tool_calls})
            else:
                calls = parse_text_tool_calls(content, turn)
                messages.append({"role": "assistant", "content": content})
            rec.response = content
            rec.final_text = final_text(content)
            if not calls:
                rec.stop_reason = "answer"
                break
            if turn == s.max_turns:
                rec.stop_reason = "max_turns"
                break
            for c in calls:
                result, err = _run_call(family, c, world)
                rec.tool_calls.append(ToolCallRecord(turn=turn, source=c.source, name=c.name,
                                                     arguments=c.raw_arguments, result=result, error=err))
                if err is not None or result.startswith("error:"):
                    rec.n_tool_errors += 1
                messages.append({"role": "tool", "tool_call_id": c.id, "content": result})
        score = float(family.score(inst, bound_digits(rec.final_text), world))
        if not math.isfinite(score):
            raise ValueError(f"checker returned {score!r}")
        rec.score = min(1.0, max(0.0, score))
    except _RequestFailed as failure:
        rec.error, rec.score, rec.stop_reason = str(failure), 0.0, "error"
    except Exception as exc:  # noqa: BLE001 - a harness/checker bug is an error record, not a crash
        rec.error, rec.score, rec.stop_reason = f"harness error: {type(exc).__name__}: {exc}", 0.0, "error"
    rec.seconds = time.perf_counter() - t0
    if s.keep_messages:
        rec.messages = messages
    return rec


# ------------------------------------------------------------------------------------------ entry points
async def discover_model(base_url: str, api_key: str = "EMPTY", timeout: float = 30.0) -> str:
    """The first model the server lists (``GET /models``)."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, timeout=timeout, max_retries=2)
    try:
        page = await client.models.list()
        ids = [m.id for m in page.data]
    except Exception as exc:  # noqa: BLE001
        raise EvalInfraError(f"cannot list models at {base_url}: {exc}") from exc
    finally:
        await client.close()
    if not ids:
        raise EvalInfraError(f"server at {base_url} serves no models")
    return ids[0]


async def evaluate_async(
    family: str | TaskFamily,
    *,
    base_url: str,
    model: str | None = None,
    api_key: str = "EMPTY",
    instances: list[Instance] | None = None,
    limit: int | None = None,
    concurrency: int = 32,
    request_timeout: float = 120.0,
    max_retries: int = 3,
    retry_backoff: float = 0.5,
    max_error_rate: float = 0.1,
    abort_on_failure: bool = True,
    extra_body: dict[str, Any] | None = None,
    tool_choice: str | None = None,
    temperature: float = 0.0,
    max_turns: int | None = None,
    max_tokens: int | None = None,
    keep_messages: bool = False,
    out: str | Path | None = None,
    on_record: Callable[[EvalRecord], None] | None = None,
) -> EvalResult:
    """Score ``model`` served at ``base_url`` on ``family``'s hidden set (see the module docstring).

    ``instances`` replaces the hidden set (tests, dev sets); ``limit`` scores the first N.
    ``max_turns`` / ``max_tokens`` default to the family's ``eval_max_turns`` / ``eval_max_tokens``.
    ``model=None`` uses the first model the server lists. ``out`` writes the records as JSONL."""
    fam = get_family(family) if isinstance(family, str) else family
    if instances is None:
        from ait_env.hidden.secrets import hidden_set, hidden_set_hash
        instances, set_hash = hidden_set(fam.name), hidden_set_hash(fam.name)
    else:
        instances = list(instances)
        set_hash = instances_hash(instances)
    if limit is not None:
        instances = instances[: max(0, int(limit))]
    if model is None:
        model = await discover_model(base_url, api_key)
    s = _Settings(model=model, max_turns=max_turns or fam.eval_max_turns,
                  max_tokens=max_tokens or fam.eval_max_tokens, temperature=temperature,
                  request_timeout=request_timeout, max_retries=max_retries, retry_backoff=retry_backoff,
                  extra_body=extra_body, tool_choice=tool_choice, keep_messages=keep_messages)
    tools = fam.tool_schemas()
    n = len(instances)
    allowed_errors = max_error_rate * n
    abort = asyncio.Event()
    sem = asyncio.Semaphore(max(1, concurrency))
    n_errors = 0
    started_at, t0 = time.time(), time.perf_counter()
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, timeout=request_timeout, max_retries=0)

    async def one(i: int, inst: Instance) -> EvalRecord:
        nonlocal n_errors
        async with sem:
            if abort.is_set():
                rec = EvalRecord(index=i, key=inst.key, question=inst.question, answer=inst.answer,
                                 error="aborted: too many errors in this eval")
            else:
                rec = await _run_instance(client, fam, inst, i, s, tools, abort)
        if rec.error is not None:
            n_errors += 1
            if abort_on_failure and n_errors > allowed_errors:
                abort.set()
        if on_record is not None:
            on_record(rec)
        return rec

    try:
        records = list(await asyncio.gather(*(one(i, inst) for i, inst in enumerate(instances))))
    finally:
        await client.close()
    wall = time.perf_counter() - t0

    scores = [r.score for r in records]
    n_err = sum(r.error is not None for r in records)
    scored = [r.score for r in records if r.error is None]
    lo, hi, method = confidence_interval(scores)
    failed, reason = False, None
    if n == 0:
        failed, reason = True, "no instances to score"
    elif n_err > allowed_errors:
        first = next(r.error for r in records if r.error is not None)
        failed = True
        reason = (f"{n_err}/{n} instances errored (max_error_rate={max_error_rate}); first error: {first}")
    result = EvalResult(
        family=fam.name, model=model, base_url=base_url, hidden_set_hash=set_hash, n=n, n_errors=n_err,
        n_scored=len(scored), score=sum(scores) / n if n else 0.0,
        score_excluding_errors=sum(scored) / len(scored) if scored else None,
        ci_low=lo, ci_high=hi, ci95=(hi - lo) / 2, ci_method=method, failed=failed, failure_reason=reason,
        max_error_rate=max_error_rate, wall_seconds=wall, seconds_per_instance=wall / n if n else 0.0,
        concurrency=concurrency, limit=limit,
        settings={"max_turns": s.max_turns, "max_tokens": s.max_tokens, "temperature": s.temperature,
                  "request_timeout": request_timeout, "max_retries": max_retries,
                  "extra_body": extra_body, "tool_choice": tool_choice},
        started_at=started_at, records=records)
    if out is not None:
        result.write_jsonl(out)
    return result


def evaluate(family: str | TaskFamily, **kwargs: Any) -> EvalResult:
    """Synchronous :func:`evaluate_async` (runs in a worker thread when an event loop is running)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(evaluate_async(family, **kwargs))
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        return ex.submit(lambda: asyncio.run(evaluate_async(family, **kwargs))).result()


def evaluate_subprocess(family: str, *, base_url: str, model: str, limit: int | None = None,
                        concurrency: int = 32, max_tokens: int | None = None, timeout_s: float = 1800.0,
                        keep: str | Path | None = None, instances: list[Instance] | None = None) -> EvalResult:
    """:func:`evaluate` in a child process (this module's CLI), for a caller that serves the model itself.

    The local backend's endpoint samples in the caller's process; the harness's own work (HTTP client,
    tool calls, rendering replies) then competes with it for one interpreter lock. In a child it runs
    on its own core: 9.9 s vs 17.0 s in a thread for the 300-instance arithmetic set at concurrency 300
    on 2 cores (``python benchmarks/bench_local_endpoint.py``). The child gets this process's environment and import path;
    ``keep`` keeps its per-instance records (JSONL) there; ``instances`` replaces the hidden set (the outcome
    check's fresh questions, :mod:`ait_env.hidden.outcome`). Raises :class:`EvalInfraError` when the child
    cannot produce a result (its eval may still have ``failed``, which the caller checks)."""
    import subprocess
    import tempfile

    root = str(Path(__file__).resolve().parents[2])   # the checkout (ait_env/hidden/evaluation.py)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    with tempfile.TemporaryDirectory(prefix="ait-eval-") as tmp:
        out = Path(keep) if keep is not None else Path(tmp) / "records.jsonl"
        cmd = [sys.executable, "-m", "ait_env.hidden.evaluation", "--family", family, "--base-url", base_url,
               "--model", model, "--concurrency", str(concurrency), "--out", str(out), "--quiet"]
        if limit is not None:
            cmd += ["--limit", str(limit)]
        if max_tokens is not None:
            cmd += ["--max-tokens", str(max_tokens)]
        if instances is not None:
            rows = Path(tmp) / "instances.jsonl"
            rows.write_text("".join(i.model_dump_json() + "\n" for i in instances), encoding="utf-8")
            cmd += ["--instances", str(rows)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s, cwd=root, check=False)
        except subprocess.TimeoutExpired:
            raise EvalInfraError(f"the hidden eval of {model!r} on {family!r} took over {timeout_s:.0f} s") from None
        summary = out.with_suffix(".summary.json")
        if not summary.exists():
            raise EvalInfraError(f"the hidden-eval process exited {proc.returncode} without a result: "
                                 f"{proc.stderr.strip()[-1500:]}")
        return EvalResult.model_validate(json.loads(summary.read_text(encoding="utf-8")))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ait_env.hidden.evaluation",
                                 description="Score a served model on a task family's hidden eval set.")
    ap.add_argument("--family", required=True)
    ap.add_argument("--base-url", required=True, help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")
    ap.add_argument("--model", default=None, help="served model name (default: the first one the server lists)")
    ap.add_argument("--limit", type=int, default=None, help="score only the first N hidden instances")
    ap.add_argument("--instances", default=None, help="score these instances (JSONL of Instance) instead of the "
                                                      "hidden set")
    ap.add_argument("--out", default=None, help="write per-instance records as JSONL here")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=None, help="per-turn cap (default: the family's eval_max_tokens)")
    ap.add_argument("--timeout", type=float, default=120.0, help="per-request timeout (s)")
    ap.add_argument("--retries", type=int, default=3)
    ap.add_argument("--max-error-rate", type=float, default=0.1)
    ap.add_argument("--extra-body", default=None, help='JSON, e.g. \'{"chat_template_kwargs": {"enable_thinking": false}}\'')
    ap.add_argument("--tool-choice", default=None, help='e.g. "none" for a server without a tool parser')
    ap.add_argument("--api-key", default=os.environ.get("AIT_EVAL_API_KEY", "EMPTY"))
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)

    done = [0]

    def progress(rec: EvalRecord) -> None:
        done[0] += 1
        if not args.quiet and (done[0] % 25 == 0 or rec.error):
            print(f"[eval] {done[0]} done; #{rec.index} score={rec.score} error={rec.error}", file=sys.stderr)

    try:
        instances = None if args.instances is None else [
            Instance.model_validate_json(line) for line in Path(args.instances).read_text(encoding="utf-8").splitlines()
            if line.strip()]
        result = evaluate(args.family, base_url=args.base_url, model=args.model, api_key=args.api_key,
                          instances=instances, limit=args.limit, concurrency=args.concurrency, max_tokens=args.max_tokens, request_timeout=args.timeout,
                          max_retries=args.retries, max_error_rate=args.max_error_rate,
                          extra_body=json.loads(args.extra_body) if args.extra_body else None,
                          tool_choice=args.tool_choice, out=args.out, on_record=progress)
    except EvalInfraError as exc:
        print(f"[eval] FAILED: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result.summary(), indent=2))
    print(str(result), file=sys.stderr)
    return 2 if result.failed else 0


if __name__ == "__main__":
    # the canonical module's main, not this __main__ copy's: one class object per exception and type
    from ait_env.extras import missing_extras_exit

    with missing_extras_exit("python -m ait_env.hidden.evaluation"):  # a missing extra: one line, exit 3
        from ait_env.hidden.evaluation import main as _main

        raise SystemExit(_main())
