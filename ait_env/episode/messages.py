"""Framework-free piece of every outer-loop adapter: chat messages to the env's text actions.

An outer loop (verifiers, Tinker, ...) samples OpenAI-style assistant messages whose tool calls its
parser already split out; ``AIT/JobWriting-v0`` takes one text action per turn. :func:`action_text`
writes the turn back as the env reads it: the visible text, then one
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` block per parsed call
(:func:`env_arguments` gives the arguments the env's tools take), then the raw text of each call the
parser could not read, so that the env explains the problem. None of them raises, whatever the model
wrote: arguments are read by :mod:`ait_env.jobs.guard`, and a call whose arguments it refuses or cannot
serialise reaches the env as a call the env refuses with the reason. No import of any outer-loop library here:
the verifiers environment, the Tinker adapter and the LLM agent runner use it (the system prompt without
its text tool sections is :func:`ait_env.episode.spec.strip_tool_sections`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from ait_env.jobs import guard
from ait_env.jobs.toolcalls import CLOSE, OPEN

__all__ = ["action_text", "call_block", "env_arguments"]


def env_arguments(raw: Any) -> Any:
    """A parsed call's ``arguments`` as the env's tools take them.

    JSON text is decoded; in an object, every value that is not a string or a list of strings goes back to
    its JSON text (the env's tools take strings, and ``submit_jobs`` a list of folder names; a parser may
    have decoded ``"3"`` as ``3``).
    Empty or missing arguments are ``{}``. Anything else (invalid JSON, a list, a value past the guard's
    bounds) is passed on as it is: the env answers the call with an error that says how to fix it."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    try:
        args = guard.loads(raw, what="the arguments") if isinstance(raw, str) else \
            guard.check(raw, what="the arguments")
    except guard.Refused:
        return raw
    if isinstance(args, dict):
        return {k: v if isinstance(v, str) or _strings(v) else json.dumps(v, ensure_ascii=False)
                for k, v in args.items()}
    return args


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def call_block(name: Any, arguments: Any) -> str:
    """One call in the env's format: ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``. Arguments
    JSON cannot write (an integer past Python's int-string limit, nesting past the recursion limit, an
    object that is not JSON data) are written as a string saying so, which the env refuses as arguments."""
    try:
        body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError) as exc:
        try:
            guard.check(arguments, what="the arguments")
            why = f"{type(exc).__name__}: {str(exc)[:200]}"
        except guard.Refused as refused:
            why = str(refused)
        body = json.dumps({"name": name if isinstance(name, str) else str(type(name).__name__),
                           "arguments": f"(not sent: {why})"}, ensure_ascii=False)
    return f"{OPEN}\n{body}\n{CLOSE}"


def action_text(text: str | None, calls: Iterable[tuple[str, Any]], unparsed: Iterable[str] = ()) -> str:
    """The env's text action for one assistant turn: ``text`` (stripped; thinking is the caller's to
    drop), a block per ``(name, raw arguments)`` call, then the ``unparsed`` raw call texts."""
    parts = [text.strip()] if isinstance(text, str) and text.strip() else []
    parts += [call_block(name, env_arguments(raw)) for name, raw in calls]
    parts += [u for u in unparsed if isinstance(u, str) and u]
    return "\n".join(parts)
