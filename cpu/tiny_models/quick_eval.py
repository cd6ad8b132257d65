"""Fast in-process evaluation (and rollouts) of a local tiny model on a task family: no HTTP.

It reproduces what :mod:`ait_env.hidden.evaluation` (the hidden-eval harness) gets from the local
OpenAI-compatible endpoint (:mod:`cpu.tiny_models.endpoint`), turn by turn:

1. the conversation (``family.eval_messages`` + the family's tool schemas) is rendered with the chat
   template and tokenized (:meth:`ChatTokenizer.encode_chat`, generation prompt added), exactly as the
   endpoint does for every request (no KV reuse across turns: each turn re-renders the whole
   conversation, so re-serialised tool calls are what the model sees next, as over HTTP);
2. a prompt that leaves no room in the context (``max_model_len``, default the model's
   ``max_position_embeddings``) is the endpoint's HTTP 400: on the first turn an error (score 0), on a
   later turn ``stop_reason="context_length"`` with an empty response (score 0), as in the harness;
   ``max_tokens`` is clipped to the room left;
3. :func:`cpu.tiny_models.model.generate` samples all open conversations as one batch (greedy at
   temperature 0) until ``<|im_end|>``; the text is decoded with special tokens and split by
   :func:`cpu.tiny_models.chat.parse_output` into content and structured tool calls (the endpoint's
   reply);
4. the harness's rules: structured calls are executed with the family's tools (on the conversation's own
   world, ``family.new_world``, for a stateful family); without them, text
   ``<tool_call>`` blocks (malformed or cut off) become ``error:`` tool results
   (:func:`ait_env.jobs.toolcalls.parse_text_tool_calls` and the harness's own ``_run_call``); no call ends
   the conversation; after ``max_turns`` the last reply is scored as it is;
5. score = ``family.score(instance, final_text(content), world)``, clipped to [0, 1]; the mean gets the
   harness's 95% interval (:func:`ait_env.hidden.evaluation.confidence_interval`).

The only intended difference from HTTP is batching: the endpoint batches whatever requests arrive
together, this module batches all open conversations (rows of similar prompt length together), so
float round-off can differ in the last bits; greedy choices agree except for exact near-ties.

Rollouts: :func:`run_conversations` at temperature > 0 returns each conversation's per-turn
(prompt ids, completion ids, logprobs); :func:`cpu.grpo.rollout_sequences` turns them into
training sequences the way the local trainer does.

CLI::

    python -m cpu.tiny_models.quick_eval --model ait-tiny-s [--families arithmetic,units] [--limit 100]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from ait_env.hidden.evaluation import _run_call, confidence_interval
from ait_env.jobs.toolcalls import CallAttempt as _Call, final_text, parse_text_tool_calls
from cpu.tiny_models.chat import parse_output
from cpu.tiny_models.kv_reuse import TurnCache, generate_cached
from cpu.tiny_models.model import TinyLM, generate
from cpu.tiny_models.tokenizer import ChatTokenizer
from task_families import FAMILY_NAMES, get_family
from task_families.base import Instance, TaskFamily

#: Max new tokens per model turn for the local models (a local setting: the families' eval_max_tokens
#: of 256 is far more than any correct turn needs; the longest correct turn, a calendar scratchpad
#: turn, is ~147 tokens; 160 is also the local runner's ``eval_max_tokens``).
LOCAL_MAX_TOKENS = 160


@dataclass
class Turn:
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: str


@dataclass
class Conversation:
    instance: Instance
    messages: list[dict[str, Any]]
    turns: list[Turn] = field(default_factory=list)
    response: str = ""
    final_text: str = ""
    score: float = 0.0
    stop_reason: str = "max_turns"
    n_tool_errors: int = 0
    error: str | None = None
    done: bool = False
    #: the episode's world (a stateful family's; None otherwise)
    world: Any = None


@dataclass
class EvalSummary:
    family: str
    n: int
    score: float
    ci_low: float
    ci_high: float
    ci95: float
    seconds: float
    stop_reasons: dict[str, int]
    mean_turns: float
    mean_tool_errors: float

    def __str__(self) -> str:
        return (f"{self.family}: {self.score:.3f} ± {self.ci95:.3f} (n={self.n}, {self.seconds:.1f}s, "
                f"turns {self.mean_turns:.1f}, stops {self.stop_reasons})")


def _structured(calls: list[dict[str, Any]], turn: int) -> list[_Call]:
    out = []
    for j, tc in enumerate(calls):
        raw = tc["function"].get("arguments") or "{}"
        try:
            args = json.loads(raw)
        except ValueError:
            args = None
        out.append(_Call(id=tc.get("id") or f"call_{turn}_{j}", source="structured", name=tc["function"]["name"],
                         raw_arguments=raw, arguments=args if isinstance(args, dict) else None,
                         error=None if isinstance(args, dict) else "tool call arguments are not a JSON object"))
    return out


@torch.inference_mode()
def run_conversations(model: TinyLM, tok: ChatTokenizer, family: str | TaskFamily, instances: list[Instance], *,
                      temperature: float = 0.0, max_tokens: int = LOCAL_MAX_TOKENS, max_turns: int | None = None,
                      max_model_len: int | None = None, generator: torch.Generator | None = None,
                      batch_rows: int = 96, keep_turns: bool = False, reuse_kv: bool = True,
                      prefill: Callable[[Instance], str] | None = None) -> list[Conversation]:
    """Run every instance through the multi-turn tool loop (see the module docstring).

    ``prefill`` (for research tools such as ``research/calendar_errors.py``, not for evals or training)
    gives each instance a text that the model's first reply is forced to start with; the model continues
    it and the reply keeps it.

    ``reuse_kv`` keeps each conversation's keys/values across turns (:class:`TurnCache`: only new tokens
    are prefilled, 2-3x faster); ``reuse_kv=False`` prefills every turn from scratch with
    :func:`cpu.tiny_models.model.generate`, exactly like the endpoint."""
    fam = get_family(family) if isinstance(family, str) else family
    tools = fam.tool_schemas()
    max_turns = max_turns or fam.eval_max_turns
    max_len = max_model_len or model.cfg.max_position_embeddings
    stop = {tok.im_end_id}
    convs = [Conversation(inst, [dict(m) for m in fam.eval_messages(inst)], world=fam.new_world(inst))
             for inst in instances]
    model.eval()
    caches: list[TurnCache] = []
    chunk_of: dict[int, int] = {}
    if reuse_kv:  # fixed chunks of conversations, each with its cache (rows of similar question length)
        order0 = sorted(range(len(convs)), key=lambda i: len(convs[i].instance.question))
        for b in range(0, len(order0), batch_rows):
            caches.append(TurnCache())
            for i in order0[b:b + batch_rows]:
                chunk_of[i] = len(caches) - 1
    forced: dict[int, str] = {}
    for turn in range(1, max_turns + 1):
        open_ = [c for c in convs if not c.done]
        if not open_:
            break
        prompts: dict[int, list[int]] = {}
        for i, c in enumerate(convs):
            if c.done:
                continue
            ids = tok.encode_chat(c.messages, tools, add_generation_prompt=True)
            if max_len - len(ids) < 1:
                c.done = True
                if turn == 1:
                    c.error, c.stop_reason = "prompt longer than the context", "error"
                else:
                    c.stop_reason, c.response, c.final_text = "context_length", "", ""
                continue
            if turn == 1 and prefill is not None:
                forced[i] = prefill(c.instance)
                ids = ids + tok.encode(forced[i])
            prompts[i] = ids
        if reuse_kv:
            for ci, tc in enumerate(caches):
                rows = [i for i in sorted(prompts) if chunk_of[i] == ci]
                if not rows:
                    continue
                limits = [min(max_tokens, max_len - len(prompts[i])) for i in rows]
                outs = generate_cached(model, tc, rows, [prompts[i] for i in rows], limits, temperature,
                                        tok.im_end_id, generator)
                for i, (toks, lps, finish) in zip(rows, outs):
                    _apply_reply(fam, convs[i], turn, max_turns, forced.pop(i, "") + tok.decode(toks))
                    if keep_turns:
                        convs[i].turns.append(Turn(prompts[i], toks, lps, finish))
            continue
        # rows of similar length share a batch (less left padding)
        order = sorted(prompts, key=lambda i: len(prompts[i]))
        for b in range(0, len(order), batch_rows):
            rows = order[b:b + batch_rows]
            limits = [min(max_tokens, max_len - len(prompts[i])) for i in rows]
            gens = generate(model, [prompts[i] for i in rows], max_new_tokens=max(limits), temperature=temperature,
                            stop_ids=stop, generator=generator)
            for i, g, lim in zip(rows, gens, limits):
                toks, lps, finish = g.tokens, g.logprobs, g.finish_reason
                if len(toks) > lim:
                    toks, lps, finish = toks[:lim], lps[:lim], "length"
                _apply_reply(fam, convs[i], turn, max_turns, forced.pop(i, "") + tok.decode(toks))
                if keep_turns:
                    convs[i].turns.append(Turn(prompts[i], toks, lps, finish))
    for c in convs:
        if c.error is None:
            s = float(fam.score(c.instance, c.final_text, c.world))
            c.score = min(1.0, max(0.0, s)) if math.isfinite(s) else 0.0
    return convs


def _apply_reply(fam: TaskFamily, c: Conversation, turn: int, max_turns: int, text: str) -> None:
    """The endpoint's reply (``parse_output``) handled by the harness's rules."""
    content, calls = parse_output(text)
    if calls:
        parsed = _structured(calls, turn)
        c.messages.append({"role": "assistant", "content": content, "tool_calls": [
            {"id": p.id, "type": "function", "function": {"name": p.name or "", "arguments":
             p.raw_arguments if p.arguments is not None and p.raw_arguments.strip() else "{}"}} for p in parsed]})
    else:
        parsed = parse_text_tool_calls(content, turn)
        c.messages.append({"role": "assistant", "content": content})
    c.response = content
    c.final_text = final_text(content)
    if not parsed:
        c.stop_reason, c.done = "answer", True
        return
    if turn == max_turns:
        c.stop_reason, c.done = "max_turns", True
        return
    for p in parsed:
        result, err = _run_call(fam, p, c.world)
        if err is not None or result.startswith("error:"):
            c.n_tool_errors += 1
        c.messages.append({"role": "tool", "tool_call_id": p.id, "content": result})


def summarize(family: str, convs: list[Conversation], seconds: float) -> EvalSummary:
    scores = [c.score for c in convs]
    lo, hi, _ = confidence_interval(scores)
    stops: dict[str, int] = {}
    for c in convs:
        stops[c.stop_reason] = stops.get(c.stop_reason, 0) + 1
    n = max(1, len(convs))
    return EvalSummary(family, len(convs), sum(scores) / n, lo, hi, (hi - lo) / 2, seconds, stops,
                       sum(len([m for m in c.messages if m["role"] == "assistant"]) for c in convs) / n,
                       sum(c.n_tool_errors for c in convs) / n)


def score_in_process(model: TinyLM, tok: ChatTokenizer, family: str, instances: list[Instance] | None = None, *,
             limit: int | None = None, max_tokens: int = LOCAL_MAX_TOKENS,
             return_conversations: bool = False, prefill: Callable[[Instance], str] | None = None,
             ) -> EvalSummary | tuple[EvalSummary, list[Conversation]]:
    """Greedy score of ``model`` on ``family``'s hidden set (or ``instances``), mean ± 95% CI."""
    if instances is None:
        from ait_env.hidden.secrets import hidden_set

        instances = hidden_set(family)
    if limit is not None:
        instances = instances[:limit]
    t0 = time.perf_counter()
    convs = run_conversations(model, tok, family, instances, temperature=0.0, max_tokens=max_tokens,
                              prefill=prefill)
    summary = summarize(family, convs, time.perf_counter() - t0)
    return (summary, convs) if return_conversations else summary


def load_dir(model_dir: str | Path) -> tuple[TinyLM, ChatTokenizer]:
    return TinyLM.load(model_dir), ChatTokenizer.load(model_dir)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cpu.tiny_models.quick_eval")
    ap.add_argument("--model", required=True, help="catalog name (ait-tiny-s) or a model directory")
    ap.add_argument("--families", default=",".join(FAMILY_NAMES))
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--max-tokens", type=int, default=LOCAL_MAX_TOKENS)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--show", type=int, default=0, help="print N conversations per family")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    path = Path(args.model)
    if not path.is_dir():
        from cpu.tiny_models.catalog import built_dir

        path = built_dir(args.model)
    model, tok = load_dir(path)
    out = {}
    for fam in args.families.split(","):
        s, convs = score_in_process(model, tok, fam, limit=args.limit, max_tokens=args.max_tokens, return_conversations=True)
        print(s, flush=True)
        for c in convs[:args.show]:
            print("  Q:", c.instance.question, "| want", c.instance.answer, "| score", c.score)
            for m in c.messages[2:]:
                calls = "".join(f" {t['function']['name']}{t['function']['arguments']}" for t in m.get("tool_calls") or [])
                print(f"    {m['role']}: {(m.get('content') or '')!r}{calls}")
        out[fam] = {"score": s.score, "ci95": s.ci95}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    # the canonical module's main, not this __main__ copy's: one class object per exception and type
    from ait_env.extras import missing_extras_exit

    with missing_extras_exit("python -m cpu.tiny_models.quick_eval"):  # a missing extra: one line, exit 3
        from cpu.tiny_models.quick_eval import main as _main

        raise SystemExit(_main())
