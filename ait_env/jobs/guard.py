"""The one guard on agent-controlled data: bounds every parse of it goes through, so nothing an agent
writes can raise inside our code.

What an agent (its tool calls, its files, the code of its job, the model its job trained) produces reaches
us as text, or as values a parser made of text: tool-call arguments, the dataset and prompts the probe's
sandbox reports, the rollout worker's results, the requests the model endpoint records, the replies the
hidden eval reads. Plain Python raises on some of them where our code expects a value: an integer of more
than 4,300 digits (``ValueError``: the int-string limit, in ``json.loads``, ``str()`` and ``int()``),
nesting deeper than the recursion limit (``RecursionError``), a float past 1.8e308 (``OverflowError`` in
``int()``, ``round()`` and ``**``), a lone surrogate (``UnicodeEncodeError`` when the text is written), a
number or a list where a string was meant (``TypeError``). Each such exception would escape as *our*
failure (``infra_failed``: dropped, so the agent escapes its own bad score). The bounds here turn every one
into :class:`Refused`, a ``ValueError`` whose message tells the agent what to change; the caller makes it
the agent's fault (an observation, ``invalid``, ``job_failed``).

Contract:

- :func:`loads`: JSON text to a value within :class:`Limits`, or :class:`Refused`; it raises nothing else
  (a syntax error is :class:`NotJSON`, with its position).
- :func:`check`: the same bounds on a value that is already parsed (by a library, across a pipe, in
  process): JSON types only (``dict`` with ``str`` keys, ``list``/``tuple``, ``str``, ``int``, ``float``,
  ``bool``, ``None``). A value :func:`check` accepts goes through ``json.dumps``, ``str()`` and ``float()``
  without raising (every integer has at most :data:`MAX_DIGITS` digits, so it is below ``1e300``).
- :func:`dumps`: :func:`check`, then the JSON text.
- :func:`bound_digits`: free text whose runs of digits are at most :data:`MAX_DIGITS` long, for the parsers
  that read numbers out of prose (the families' checkers and instance parsers, which live below this layer
  and take text as it is given): a longer run loses its leading zeros, then whatever is still past the bound.
- :func:`number`: a finite ``float`` within ±:data:`MAX_MAGNITUDE`, or ``None`` (a reward, a metric: values
  our arithmetic squares and sums).

The walk is iterative and stops at the first bound crossed, so a check costs at most its limits;
:func:`loads` counts the brackets of its text before parsing, so a text of many tiny objects is refused
before it becomes millions of Python objects. Defaults are far above what an honest job sends (its tool
arguments are a few strings; a message nests five levels; a reward is 0..1); a caller with a byte budget of
its own passes tighter :class:`Limits`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT", "Limits", "MAX_DEPTH", "MAX_DIGITS", "MAX_MAGNITUDE", "NotJSON", "Refused", "bound_digits",
           "check", "dumps", "loads", "number"]

#: levels of nesting (a message nests five: messages, message, tool_calls, call, function)
MAX_DEPTH = 32
#: digits of an integer; every bounded integer converts to a finite float (< 1e300)
MAX_DIGITS = 300
#: magnitude of a number our arithmetic takes from agent code (a reward, a metric)
MAX_MAGNITUDE = 1e6
_TEN_TO_MAX = 10 ** MAX_DIGITS
_SURROGATE = re.compile("[\ud800-\udfff]")
_DIGIT_RUN = re.compile(r"\d{%d,}" % (MAX_DIGITS + 1))


class Refused(ValueError):
    """Agent-controlled data outside the bounds; ``str()`` says what is wrong and how to fix it, worded for
    the agent."""


class NotJSON(Refused):
    """The text is not JSON at all (a syntax error); ``reason`` is the parser's, with its position."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Limits:
    """Bounds of one kind of agent-controlled data (the defaults suit a tool call or a chat request)."""

    max_depth: int = MAX_DEPTH
    max_digits: int = MAX_DIGITS
    #: entries of every list and object, all together
    max_items: int = 1_000_000
    #: characters of every string and key, all together (and of the JSON text :func:`loads` reads)
    max_chars: int = 32 * 2**20
    #: refuse NaN and ±infinity (``NaN``, ``Infinity``, ``1e999`` in JSON)
    finite: bool = True
    #: accept lone surrogates (``"\\ud800"``); refused by default (no UTF-8 file, socket or tokenizer takes them)
    surrogates: bool = False


DEFAULT = Limits()


def _digits_of(n: int) -> int:
    """About how many decimal digits ``n`` has, without converting it (which is what raises)."""
    return max(1, int(abs(n).bit_length() * 0.30103) + 1)


def _refuse_int(what: str, digits: int, limits: Limits) -> Refused:
    return Refused(f"{what}: an integer of {digits} digits (at most {limits.max_digits} are accepted); write a "
                   "long number as a string")


def check(value: Any, limits: Limits = DEFAULT, what: str = "the value") -> Any:
    """``value`` itself when it is JSON data within ``limits``, else :class:`Refused` (module docstring).
    ``what`` names the value in the message (e.g. ``"the arguments of write_file"``)."""
    items = chars = 0
    int_bound = _TEN_TO_MAX if limits.max_digits == MAX_DIGITS else 10 ** limits.max_digits
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, str):
            chars += len(v)
            if chars > limits.max_chars:
                raise Refused(f"{what}: more than {limits.max_chars:,} characters of text; send less")
            if not limits.surrogates and _SURROGATE.search(v):
                raise Refused(f"{what}: a lone surrogate character ({_SURROGATE.search(v).group()!a}); send "
                              "valid Unicode text (UTF-8 cannot encode it)")
        elif isinstance(v, bool) or v is None:
            pass
        elif isinstance(v, int):
            if not -int_bound < v < int_bound:
                raise _refuse_int(what, _digits_of(v), limits)
        elif isinstance(v, float):
            if limits.finite and not math.isfinite(v):
                raise Refused(f"{what}: the number {v!r}; send finite numbers (JSON has no NaN or infinity)")
        elif isinstance(v, (dict, list, tuple)):
            if depth >= limits.max_depth:
                raise Refused(f"{what}: lists and objects nested deeper than {limits.max_depth} levels; send "
                              "flatter data")
            items += len(v)
            if items > limits.max_items:
                raise Refused(f"{what}: more than {limits.max_items:,} list entries and object fields; send "
                              "less")
            if isinstance(v, dict):
                for k, inner in v.items():
                    if not isinstance(k, str):
                        raise Refused(f"{what}: an object key that is a {type(k).__name__}; keys must be strings")
                    stack.append((k, depth + 1))
                    stack.append((inner, depth + 1))
            else:
                stack.extend((inner, depth + 1) for inner in v)
        else:
            raise Refused(f"{what}: a {type(v).__name__}, which is not JSON data; send strings, numbers, "
                          "true/false/null, lists and objects")
    return value


def loads(text: str | bytes | bytearray, limits: Limits = DEFAULT, what: str = "the JSON text") -> Any:
    """The value of JSON ``text`` within ``limits``, or :class:`Refused` (never another exception)."""
    if isinstance(text, (bytes, bytearray)):
        if len(text) > 4 * limits.max_chars:
            raise Refused(f"{what}: longer than {limits.max_chars:,} characters; send less")
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            reason = f"not UTF-8: {exc.reason} at byte {exc.start}"
            raise NotJSON(f"{what}: not valid JSON ({reason})", reason) from None
    if not isinstance(text, str):
        raise Refused(f"{what}: a {type(text).__name__}, not JSON text")
    if len(text) > limits.max_chars:
        raise Refused(f"{what}: longer than {limits.max_chars:,} characters; send less")
    if text.count("{") + text.count("[") > limits.max_items:  # before parsing: the objects it would make
        raise Refused(f"{what}: more than {limits.max_items:,} lists and objects; send less")

    def parse_int(digits: str) -> int:
        n = len(digits) - digits.startswith("-")
        if n > limits.max_digits:
            raise _refuse_int(what, n, limits)
        return int(digits)

    def parse_float(literal: str) -> float:
        x = float(literal)
        if limits.finite and not math.isfinite(x):
            raise Refused(f"{what}: the number {literal[:40]} (beyond a float's range); send finite numbers")
        return x

    def parse_constant(name: str) -> float:
        if limits.finite:
            raise Refused(f"{what}: {name}, which is not JSON; send finite numbers")
        return float(name.replace("Infinity", "inf"))

    try:
        value = json.loads(text, parse_int=parse_int, parse_float=parse_float, parse_constant=parse_constant)
    except Refused:
        raise
    except json.JSONDecodeError as exc:
        reason = f"{exc.msg} at line {exc.lineno} column {exc.colno}"
        raise NotJSON(f"{what}: not valid JSON ({reason})", reason) from None
    except RecursionError:
        raise Refused(f"{what}: lists and objects nested deeper than {limits.max_depth} levels; send flatter "
                      "data") from None
    except (ValueError, TypeError, OverflowError, MemoryError) as exc:
        raise Refused(f"{what}: not readable as JSON ({type(exc).__name__}: {str(exc)[:120]})") from None
    return check(value, limits, what)


def dumps(value: Any, limits: Limits = DEFAULT, what: str = "the value", **kwargs: Any) -> str:
    """JSON text of ``value`` after :func:`check` (``kwargs`` go to ``json.dumps``); :class:`Refused` when
    ``value`` is outside ``limits``."""
    check(value, limits, what)
    return json.dumps(value, allow_nan=not limits.finite, **kwargs)


def bound_digits(text: str, max_digits: int = MAX_DIGITS) -> str:
    """``text`` with every run of more than ``max_digits`` digits (any script's) shortened: its leading
    zeros dropped, then the digits past ``max_digits`` (so ``int()``/``float()`` of any run never raises,
    a number that fits keeps its value, and one that does not stays a number far beyond any answer)."""
    pattern = _DIGIT_RUN if max_digits == MAX_DIGITS else re.compile(r"\d{%d,}" % (max_digits + 1))

    def shorten(m: re.Match[str]) -> str:
        run = m.group()
        kept = run.lstrip("0") or "0"
        if len(kept) > max_digits:
            kept = kept[:max_digits]
        return kept

    return pattern.sub(shorten, text)


def number(value: Any, bound: float = MAX_MAGNITUDE) -> float | None:
    """``value`` as a float when it is a real number (not a bool) within ±``bound``, else ``None``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int) and not -_TEN_TO_MAX < value < _TEN_TO_MAX:
        return None
    x = float(value)
    return x if math.isfinite(x) and abs(x) <= bound else None
