"""Framework-free pieces of an outer-loop adapter: chat messages to the env's text actions, the env's
system prompt for a stack that declares the tools itself, and thread safety for blocking env calls.

An outer loop (verifiers, Tinker, ...) samples OpenAI-style assistant messages whose tool calls its
parser already split out; ``AIT/JobWriting-v0`` takes one text action per turn. :func:`action_text`
writes the turn back as the env reads it: the visible text, then one
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` block per parsed call
(:func:`env_arguments` gives the arguments the env's tools take), then the raw text of each call the
parser could not read, so that the env explains the problem. No import of any outer-loop library here:
:mod:`ait_env.integrations.verifiers_env` uses it; the Tinker adapter keeps its own copy of the same
rules for now (``message_to_action``, ``strip_tool_sections``, ``serialize_ast_parse`` in
:mod:`ait_env.integrations.tinker`).
"""

from __future__ import annotations

import ast
import json
import logging
import threading
from collections.abc import Iterable
from typing import Any

from ait_env.toolcalls import CLOSE, OPEN

__all__ = ["action_text", "call_block", "env_arguments", "serialize_ast_parse", "strip_tool_sections"]

logger = logging.getLogger(__name__)


def env_arguments(raw: Any) -> Any:
    """A parsed call's ``arguments`` as the env's tools take them.

    JSON text is decoded; in an object, every value that is not a string goes back to its JSON text
    (each argument of the env's tools is a string, and a parser may have decoded ``"3"`` as ``3``).
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
        return {k: v if isinstance(v, str) else json.dumps(v, ensure_ascii=False) for k, v in args.items()}
    return args


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


def strip_tool_sections(system_text: str) -> str:
    """The env's system prompt without its "# Tools" and "# How to call tools" sections, for a stack
    that declares the tools itself (a chat template's tool section, an API's ``tools`` field)."""
    start = system_text.find("\n# Tools")
    rules = system_text.find("\n# Rules")
    if start < 0 or rules < start:
        logger.warning("the env's system prompt has no '# Tools' ... '# Rules' sections; keeping it whole")
        return system_text
    return system_text[:start].rstrip() + "\n" + system_text[rules:]


_AST_LOCK = threading.Lock()


def serialize_ast_parse() -> None:
    """Serialize ``ast.parse`` process-wide (idempotent), before env steps run in threads.

    The validation probe parses the agent's Python with ``ast.parse``; with many episodes stepping in
    threads, CPython 3.11 sometimes fails with ``SystemError: AST constructor recursion depth
    mismatch`` (its AST constructor is not thread-safe; measured here by the Tinker adapter's offline
    run, see :func:`ait_env.integrations.tinker.serialize_ast_parse`)."""
    if getattr(ast.parse, "_ait_serialized", False):
        return
    original = ast.parse

    def parse(*args: Any, **kwargs: Any) -> Any:
        with _AST_LOCK:
            return original(*args, **kwargs)

    parse._ait_serialized = True  # type: ignore[attr-defined]
    ast.parse = parse  # type: ignore[assignment]
