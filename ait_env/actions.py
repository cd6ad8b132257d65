"""Parse an agent's raw assistant turn into tool calls.

Accepted forms (several calls per turn allowed, in order):
- Qwen/Hermes blocks ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``;
- when no block is present, one bare JSON object ``{"name": ..., "arguments": {...}}``
  (optionally inside a fenced code block).
Text around the calls and ``<think>...</think>`` sections are ignored. ``arguments`` must be a JSON
object (a JSON-encoded string holding an object is also accepted, as OpenAI APIs send it).

:func:`parse_action` never raises: problems come back as :class:`ParseError` entries that say what
was wrong; the caller turns them into an observation.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

CALL_FORMAT = ('<tool_call>\n{"name": "write_file", "arguments": {"path": "job.toml", '
               '"content": "..."}}\n</tool_call>')

_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str = ""


@dataclass
class ParseError:
    message: str


@dataclass
class ParsedAction:
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[ParseError] = field(default_factory=list)
    text: str = ""  # the turn's prose with think blocks and tool calls removed

    @property
    def ok(self) -> bool:
        return bool(self.calls) and not self.errors


def _decode_call(raw: str, where: str) -> ToolCall | ParseError:
    raw = raw.strip()
    m = _FENCE.match(raw)
    if m:
        raw = m.group(1)
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        snippet = raw[:80].replace("\n", "\\n")
        return ParseError(f"{where}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
                          f"got: {snippet!r}. Remember to escape newlines and quotes inside strings.")
    if not isinstance(obj, dict):
        return ParseError(f"{where}: expected a JSON object with 'name' and 'arguments', got {type(obj).__name__}.")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ParseError(f"{where}: missing the tool 'name' (a string).")
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return ParseError(f"{where}: 'arguments' of {name!r} is a string that is not JSON; "
                              "pass a JSON object.")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return ParseError(f"{where}: 'arguments' of {name!r} must be a JSON object, got {type(args).__name__}.")
    return ToolCall(name=name, arguments=args)


def _scan(body: str) -> tuple[list[tuple[int, int, ToolCall | ParseError]], list[str]]:
    """Find ``<tool_call>`` blocks: (start, end, call-or-error) spans, and the prose between them.

    The JSON of a call may itself contain ``</tool_call>`` (file content), so each block ends at the
    first closing tag after which the JSON parses."""
    spans: list[tuple[int, int, ToolCall | ParseError]] = []
    prose: list[str] = []
    pos, i = 0, 0
    while True:
        start = body.find("<tool_call>", pos)
        if start < 0:
            prose.append(body[pos:])
            break
        prose.append(body[pos:start])
        i += 1
        inner = start + len("<tool_call>")
        ends = [m.start() + inner for m in re.finditer("</tool_call>", body[inner:])]
        if not ends:
            spans.append((start, len(body), ParseError(f"tool call {i}: missing the closing </tool_call> tag.")))
            break
        chosen, result = ends[0], None
        for e in ends:
            res = _decode_call(body[inner:e], f"tool call {i}")
            if isinstance(res, ToolCall):
                chosen, result = e, res
                break
            if result is None:
                result = res
        assert result is not None
        end = chosen + len("</tool_call>")
        spans.append((start, end, result))
        pos = end
    return spans, prose


def _outside(spans: list[tuple[int, int, object]], idx: int) -> bool:
    return all(not (a <= idx < b) for a, b, _ in spans)


def _drop_reasoning(body: str, spans: list[tuple[int, int, object]]) -> str | None:
    """Text without the leading reasoning, or None when there is none. Only think tags outside
    tool-call blocks count (tags inside a call's JSON are file content)."""
    closes = [m.start() for m in re.finditer("</think>", body) if _outside(spans, m.start())]
    opens = [m.start() for m in re.finditer("<think>", body) if _outside(spans, m.start())]
    if not closes and not opens:
        return None
    if closes and (not opens or opens[0] > closes[0]):
        return body[closes[0] + len("</think>"):]  # dangling close: the template opened the block
    o = opens[0]
    after = [c for c in closes if c > o]
    return body[:o] + ("" if not after else body[after[0] + len("</think>"):])


def parse_action(action: Any) -> ParsedAction:
    """Parse one assistant turn. Never raises."""
    if not isinstance(action, str):
        return ParsedAction(errors=[ParseError(f"the action must be a string, got {type(action).__name__}.")])
    body = action
    spans, prose = _scan(body)
    stripped_body = _drop_reasoning(body, spans)
    if stripped_body is not None:
        body = stripped_body
        spans, prose = _scan(body)
    out = ParsedAction()
    if spans:
        for _, _, res in spans:
            (out.errors if isinstance(res, ParseError) else out.calls).append(res)  # type: ignore[arg-type]
        out.text = "".join(prose).strip()
        return out
    stripped = body.strip()
    fenced = _FENCE.match(stripped)
    candidate = fenced.group(1) if fenced else stripped
    if candidate.startswith("{") and candidate.endswith("}"):
        res = _decode_call(candidate, "bare JSON call")
        (out.errors if isinstance(res, ParseError) else out.calls).append(res)  # type: ignore[arg-type]
        return out
    out.text = stripped
    if "</tool_call>" in body:
        out.errors.append(ParseError("found </tool_call> without an opening <tool_call> tag."))
    else:
        out.errors.append(ParseError("no tool call found in your message."))
    return out
