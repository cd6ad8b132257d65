"""Framework-free piece of every outer-loop adapter: chat messages to the env's text actions.

An outer loop (verifiers, Tinker, ...) samples OpenAI-style assistant messages whose tool calls its
parser already split out; ``AIT/JobWriting-v0`` takes one text action per turn. :func:`action_text`
writes the turn back as the env reads it: the visible text, then one
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` block per parsed call
(:func:`env_arguments` gives the arguments the env's tools take), then the raw text of each call the
parser could not read, so that the env explains the problem. No import of any outer-loop library here:
the verifiers environment, the Tinker adapter and the LLM agent runner use it (the system prompt without
its text tool sections is :func:`ait_env.episode.spec.strip_tool_sections`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from ait_env.jobs.toolcalls import CLOSE, OPEN

__all__ = ["action_text", "call_block", "env_arguments"]


def env_arguments(raw: Any) -> Any:
    """A parsed call's ``arguments`` as the env's tools take them.

    JSON text is decoded; in an object, every value that is not a string or a list of strings goes back to
    its JSON text (the env's tools take strings, and ``submit_jobs`` a list of folder names; a parser may
    have decoded ``"3"`` as ``3``).
    Empty or missing arguments are ``{}``. Anything else (invalid JSON, a list) is passed on as it is:
    the env answers the call with an error that says how to fix it."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    args = raw
    if isinstance(raw, str):
        try:
            args = json.loads(raw)
        except json.JSONDecodeError:
            return raw
    if isinstance(args, dict):
        return {k: v if isinstance(v, str) or _strings(v) else json.dumps(v, ensure_ascii=False)
                for k, v in args.items()}
    return args


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def call_block(name: str, arguments: Any) -> str:
    """One call in the env's format: ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``."""
    return f"{OPEN}\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + f"\n{CLOSE}"


def action_text(text: str | None, calls: Iterable[tuple[str, Any]], unparsed: Iterable[str] = ()) -> str:
    """The env's text action for one assistant turn: ``text`` (stripped; thinking is the caller's to
    drop), a block per ``(name, raw arguments)`` call, then the ``unparsed`` raw call texts."""
    parts = [text.strip()] if text and text.strip() else []
    parts += [call_block(name, env_arguments(raw)) for name, raw in calls]
    parts += [u for u in unparsed if u]
    return "\n".join(parts)
