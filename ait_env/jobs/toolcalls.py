"""Tool calls in model text: the one reader of the ``<tool_call>`` format.

The format is Qwen/Hermes: ``<tool_call>{"name": "...", "arguments": {...}}</tool_call>``, one block
per call, possibly after reasoning in ``<think>...</think>``. This module owns the tags, the block
scanner, the JSON decoding of a call and the rule for ``arguments``, and gives each caller its
reader:

- :func:`parse_action`: the env reads an agent's turn (:class:`ParsedAction`: valid calls, errors
  that say how to fix the call, the prose);
- :func:`parse_text_tool_calls` and :func:`structured_tool_calls`: the hidden-eval harness reads a
  reply's calls, written in ``content`` or sent as OpenAI ``tool_calls`` (:class:`CallAttempt`: a
  malformed call is an attempt with an ``error`` the model reads back as its tool result);
  :func:`final_text` is what the checker sees;
- :func:`split_completion`: the local endpoint turns generated text into ``content`` and OpenAI
  ``tool_calls``, as vLLM's tool parser does on pods.

Shared by all: blocks are found by :func:`find_blocks`; a call is a JSON object with a ``"name"``
string; ``arguments`` go through :func:`decode_arguments` (an object, a JSON string holding an
object, or null / missing / blank for no arguments; ``"parameters"`` is read when ``"arguments"`` is
missing). The readers differ only where their callers need it, and each difference is pinned by
``tests/test_toolcalls.py``:

=================  ==========================  ===========================  ==========================
                   parse_action (env)          parse_text_tool_calls        split_completion
                                               (hidden eval)                (local endpoint)
=================  ==========================  ===========================  ==========================
reasoning          the leading ``<think>``     :func:`strip_think`: up to   kept (the tiny models do
                   block; tags inside a call   the last ``</think>``, and   not think)
                   are file content            an unclosed ``<think>`` tail
block end          the first ``</tool_call>``  the first ``</tool_call>``   the first ``</tool_call>``
                   after which the JSON        (vLLM's hermes parser)
                   parses (file content may
                   hold the tag)
unclosed block     an error                    a call attempt (cut off by   stays in ``content``
                                               ``max_tokens``)
no block           one bare JSON object, or    no call                      no call
                   one in a code fence
name               a non-empty string          a string                     a string
arguments          :func:`decode_arguments`    :func:`decode_arguments`     an object or missing;
                                                                            ``"parameters"`` ignored;
                                                                            anything else stays in
                                                                            ``content``
=================  ==========================  ===========================  ==========================

The harness and the endpoint keep their rules because they decide what a model's calls mean, and
so the measured hidden-eval scores and the calls a verifiers rollout executes during training. No
reader raises on bad text: every JSON a model or an agent wrote is read by :func:`ait_env.jobs.guard.loads`
(bounded digits, nesting, sizes; no NaN, infinity or lone surrogates), and what it refuses is a call error
that says what to change.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from ait_env.jobs import guard
from task_families.base import strip_think

__all__ = [
    "CALL_FORMAT", "Block", "CallAttempt", "ParseError", "ParsedAction", "ToolCall", "decode_arguments",
    "final_text", "find_blocks", "parse_action", "parse_text_tool_calls", "split_completion", "strip_think",
    "strip_tool_calls", "structured_tool_calls",
]

OPEN, CLOSE = "<tool_call>", "</tool_call>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

#: A well-formed call, shown to an agent whose turn had none.
CALL_FORMAT = ('<tool_call>\n{"name": "write_file", "arguments": {"path": "job.toml", '
               '"content": "..."}}\n</tool_call>')

_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


# ------------------------------------------------------------------------------------------ blocks
@dataclass(frozen=True)
class Block:
    """One ``<tool_call>`` block: ``text[start:end]``; ``body`` is the text between the tags."""

    start: int
    end: int      # just past ``</tool_call>``, or ``len(text)`` when the block is not closed
    body: str
    closed: bool


def find_blocks(text: str, ends_at: Callable[[str], bool] | None = None) -> list[Block]:
    """The ``<tool_call>`` blocks of ``text``, in order.

    A block ends at its first ``</tool_call>``; with ``ends_at``, at the first one whose body
    ``ends_at`` accepts (the first one when it accepts none). A block without a closing tag runs to
    the end of the text (``closed=False``) and is the last one."""
    blocks: list[Block] = []
    pos = 0
    while (start := text.find(OPEN, pos)) >= 0:
        inner = start + len(OPEN)
        close = text.find(CLOSE, inner)
        if close < 0:
            blocks.append(Block(start, len(text), text[inner:], closed=False))
            break
        if ends_at is not None:
            later = close
            while later >= 0 and not ends_at(text[inner:later]):
                later = text.find(CLOSE, later + len(CLOSE))
            close = close if later < 0 else later
        end = close + len(CLOSE)
        blocks.append(Block(start, end, text[inner:close], closed=True))
        pos = end
    return blocks


def _outside(text: str, blocks: list[Block]) -> str:
    """``text`` without the blocks."""
    parts, pos = [], 0
    for b in blocks:
        parts.append(text[pos:b.start])
        pos = b.end
    parts.append(text[pos:])
    return "".join(parts)


def strip_tool_calls(text: str) -> str:
    """``text`` without its ``<tool_call>`` blocks (an unclosed one runs to the end)."""
    text = text or ""
    return _outside(text, find_blocks(text))


def final_text(content: str) -> str:
    """What a family's checker sees of a reply: no reasoning, no tool-call blocks, stripped."""
    return strip_tool_calls(strip_think(content)).strip()


# ------------------------------------------------------------------------------------------ decoding
def _load(raw: str, what: str = "the tool call") -> tuple[Any, guard.Refused | None]:
    """The JSON value of ``raw``, or why not (a syntax error, or a value past :mod:`ait_env.jobs.guard`'s bounds)."""
    try:
        return guard.loads(raw, what=what), None
    except guard.Refused as exc:
        return None, exc


def _as_text(raw: Any) -> str:
    """``raw`` as JSON text for a record of the call (a value the guard refused is described, not dumped)."""
    if isinstance(raw, str):
        return raw
    try:
        return guard.dumps(raw)
    except guard.Refused as exc:
        return f"(unreadable arguments: {exc})"


def _is_call(obj: Any) -> bool:
    return isinstance(obj, dict) and isinstance(obj.get("name"), str)


def _written_arguments(obj: dict[str, Any]) -> Any:
    return obj.get("arguments", obj.get("parameters", {}))


def decode_arguments(raw: Any) -> tuple[dict[str, Any] | None, str | None]:
    """``(arguments, None)`` or ``(None, why not)`` for the ``arguments`` a model wrote.

    Accepted: an object; a string holding a JSON object (OpenAI APIs send that); ``None`` or a blank
    string for no arguments. The reason is worded for the model that made the call."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}, None
    if not isinstance(raw, (str, dict)):
        return None, f"tool call arguments are not valid JSON (a {type(raw).__name__}); send a JSON object"
    try:
        val = guard.check(raw, what="the tool call arguments") if isinstance(raw, dict) else \
            guard.loads(raw, what="the tool call arguments")
    except guard.NotJSON as exc:
        return None, f"tool call arguments are not valid JSON ({exc.reason}); send a JSON object"
    except guard.Refused as exc:
        return None, f"{exc}"
    if not isinstance(val, dict):
        return None, f"tool call arguments must be a JSON object, got {type(val).__name__}"
    return val, None


# ------------------------------------------------------------------------------------------ the env's reader
@dataclass
class ToolCall:
    """A valid call of an agent's turn."""

    name: str
    arguments: dict[str, Any]
    id: str = ""


@dataclass
class ParseError:
    """What was wrong with a call, and how to fix it (shown to the agent)."""

    message: str


@dataclass
class ParsedAction:
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[ParseError] = field(default_factory=list)
    text: str = ""  # the turn's prose with think blocks and tool calls removed

    @property
    def ok(self) -> bool:
        return bool(self.calls) and not self.errors


def _arguments_problem(raw: Any, why: str) -> str:
    """The env's wording of why :func:`decode_arguments` refused ``raw`` (``why``: its reason)."""
    if isinstance(raw, str):
        try:
            raw = guard.loads(raw)
        except guard.NotJSON:
            return f"is a string that is not JSON ({raw[:160]!r}); pass a JSON object."
        except guard.Refused:
            return f"cannot be used ({why})."
    if isinstance(raw, dict):  # an object the guard refused
        return f"cannot be used ({why})."
    return f"must be a JSON object, got {type(raw).__name__}."


def _decode_call(raw: str, where: str) -> ToolCall | ParseError:
    raw = raw.strip()
    m = _FENCE.match(raw)
    if m:
        raw = m.group(1)
    obj, exc = _load(raw, what=where)
    if isinstance(exc, guard.NotJSON):
        snippet = raw[:80].replace("\n", "\\n")
        return ParseError(f"{where}: not valid JSON ({exc.reason}); "
                          f"got: {snippet!r}. Remember to escape newlines and quotes inside strings.")
    if exc is not None:
        return ParseError(f"{exc}.")
    if not isinstance(obj, dict):
        return ParseError(f"{where}: expected a JSON object with 'name' and 'arguments', "
                          f"got {type(obj).__name__}.")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ParseError(f"{where}: missing the tool 'name' (a string).")
    written = _written_arguments(obj)
    args, why = decode_arguments(written)
    if args is None:
        return ParseError(f"{where}: 'arguments' of {name!r} {_arguments_problem(written, why or '')}")
    return ToolCall(name=name, arguments=args)


def _parses(body: str) -> bool:
    return isinstance(_decode_call(body, ""), ToolCall)


def _drop_reasoning(text: str, blocks: list[Block]) -> str | None:
    """``text`` without its leading reasoning, or None when there is none. Only think tags outside
    tool-call blocks count (tags inside a call's JSON are file content)."""
    def outside(idx: int) -> bool:
        return all(not (b.start <= idx < b.end) for b in blocks)

    closes = [m.start() for m in re.finditer(THINK_CLOSE, text) if outside(m.start())]
    opens = [m.start() for m in re.finditer(THINK_OPEN, text) if outside(m.start())]
    if not closes and not opens:
        return None
    if closes and (not opens or opens[0] > closes[0]):
        return text[closes[0] + len(THINK_CLOSE):]  # dangling close: the template opened the block
    o = opens[0]
    after = [c for c in closes if c > o]
    return text[:o] + ("" if not after else text[after[0] + len(THINK_CLOSE):])


def parse_action(action: Any) -> ParsedAction:
    """Parse one agent turn (see the module docstring). Never raises.

    Several blocks are read in order; a valid call is kept even when another block of the turn is
    malformed. Without blocks, the turn may be one bare JSON call, optionally in a code fence."""
    if not isinstance(action, str):
        return ParsedAction(errors=[ParseError(f"the action must be a string, got {type(action).__name__}.")])
    return _parse_action(action)


def _parse_action(body: str) -> ParsedAction:
    blocks = find_blocks(body, ends_at=_parses)
    without_reasoning = _drop_reasoning(body, blocks)
    if without_reasoning is not None:
        body = without_reasoning
        blocks = find_blocks(body, ends_at=_parses)
    out = ParsedAction()
    if blocks:
        for i, b in enumerate(blocks, 1):
            if not b.closed:
                out.errors.append(ParseError(f"tool call {i}: missing the closing </tool_call> tag."))
                break
            res = _decode_call(b.body, f"tool call {i}")
            (out.errors if isinstance(res, ParseError) else out.calls).append(res)  # type: ignore[arg-type]
        last = blocks[-1]
        prose = _outside(body, blocks) if last.closed else _outside(body[:last.start], blocks[:-1])
        out.text = prose.strip()
        return out
    stripped = body.strip()
    fenced = _FENCE.match(stripped)
    candidate = fenced.group(1) if fenced else stripped
    if candidate.startswith("{") and candidate.endswith("}"):
        res = _decode_call(candidate, "bare JSON call")
        (out.errors if isinstance(res, ParseError) else out.calls).append(res)  # type: ignore[arg-type]
        return out
    out.text = stripped
    if CLOSE in body:
        out.errors.append(ParseError(f"found {CLOSE} without an opening {OPEN} tag."))
    else:
        out.errors.append(ParseError("no tool call found in your message."))
    return out


# ------------------------------------------------------------------------------------ the harness's reader
@dataclass
class CallAttempt:
    """One call a model made, as the hidden-eval harness runs it: ``error`` set means not executed."""

    id: str
    source: Literal["structured", "text"]
    name: str | None
    raw_arguments: str               # as the model wrote them (JSON text)
    arguments: dict[str, Any] | None = None
    error: str | None = None


def parse_text_tool_calls(content: str, turn: int = 0) -> list[CallAttempt]:
    """``<tool_call>{"name": .., "arguments": {..}}</tool_call>`` blocks outside ``<think>``.

    An unclosed trailing block (cut off by ``max_tokens``) counts as a call attempt."""
    calls: list[CallAttempt] = []
    for j, block in enumerate(find_blocks(strip_think(content))):
        raw = block.body.strip()
        cid = f"call_{turn}_{j}"
        obj, exc = _load(raw, what="the <tool_call> block")
        if exc is not None:
            why = exc.reason if isinstance(exc, guard.NotJSON) else str(exc)
            calls.append(CallAttempt(id=cid, source="text", name=None, raw_arguments=raw,
                                     error=f"invalid JSON in <tool_call> block ({why}); write "
                                           '<tool_call>{"name": "...", "arguments": {...}}</tool_call>'))
            continue
        if not _is_call(obj):
            calls.append(CallAttempt(id=cid, source="text", name=None, raw_arguments=raw,
                                     error='a <tool_call> block must be a JSON object with a "name" string '
                                           'and an "arguments" object'))
            continue
        written = _written_arguments(obj)
        args, err = decode_arguments(written)
        calls.append(CallAttempt(id=cid, source="text", name=obj["name"], arguments=args, error=err,
                                 raw_arguments=_as_text(written)))
    return calls


def structured_tool_calls(message: Any) -> list[CallAttempt]:
    """The OpenAI ``tool_calls`` of a chat-completion ``message`` (an object with attributes)."""
    calls: list[CallAttempt] = []
    for j, tc in enumerate(getattr(message, "tool_calls", None) or []):
        fn = getattr(tc, "function", None)
        cid = getattr(tc, "id", None) or f"call_{j}"
        if fn is None:
            calls.append(CallAttempt(id=cid, source="structured", name=getattr(tc, "type", None),
                                     raw_arguments="", error="only function tool calls are supported"))
            continue
        raw = getattr(fn, "arguments", None)
        args, err = decode_arguments(raw)
        name = getattr(fn, "name", None)
        calls.append(CallAttempt(id=cid, source="structured", name=name if isinstance(name, str) else None,
                                 arguments=args, error=err, raw_arguments=_as_text(raw)))
    return calls


# ----------------------------------------------------------------------------------- the endpoint's reader
def split_completion(text: str) -> tuple[str, list[dict[str, Any]]]:
    """Split generated assistant text into ``(content, OpenAI tool_calls)``.

    A closed block whose JSON is a call with an ``arguments`` object (or none) becomes a structured
    call (``arguments`` re-serialised as JSON text, a fresh ``call_...`` id) and leaves ``content``;
    every other block stays in ``content`` as written."""
    calls: list[dict[str, Any]] = []
    taken: list[Block] = []
    for block in find_blocks(text):
        if not block.closed:
            continue
        obj, _ = _load(block.body)
        if not _is_call(obj) or not isinstance(obj.get("arguments", {}), dict):
            continue
        taken.append(block)
        calls.append({"id": "call_" + uuid.uuid4().hex[:12], "type": "function",
                      "function": {"name": obj["name"], "arguments": json.dumps(obj.get("arguments", {}))}})
    return _outside(text, taken), calls
