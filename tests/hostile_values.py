"""Hypothesis strategies of hostile agent-controlled data, shared by the property tests that feed it through
every entry point (``tests/test_hostile_values.py``, ``tests/test_fuzz.py``, ``tests/jobs/test_guard.py``).

Two forms, as our code meets them: **JSON text** (what a model writes as tool-call arguments, what the
sandboxed worker posts, a line of a trace) and **Python values** (what a library already parsed: TRL's tool
arguments, a verifiers message, a sandbox report). Both carry the classes the guard bounds
(:mod:`ait_env.jobs.guard`): integers past Python's int-string limit and past a float's range, nesting past
the recursion limit, NaN and infinities, floats that overflow, lone surrogates, enormous strings, millions of
tiny objects, odd types where strings or lists belong — mixed with ordinary values so they sit where an
honest value would."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st


def deep(depth: int, leaf: Any = 1) -> Any:
    """``leaf`` inside ``depth`` nested lists (built iteratively: deeper than the recursion limit is fine)."""
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


#: JSON fragments, each a value of its own
JSON_FRAGMENTS = [
    "9" * 5000, "-" + "9" * 400, "1" + "0" * 300, "1e999", "-1e999", "1e308", "NaN", "Infinity", "-Infinity",
    "0." + "1" * 5000, '"\\ud800"', '"a\\udfffb"', '"\\u0000"', "[" * 5000 + "]" * 5000, "[" * 40 + "]" * 40,
    '{"a":' * 40 + "1" + "}" * 40, '"' + "x" * 120_000 + '"', "[" + "{}," * 40_000 + "{}]", '"' + "9" * 5000 + '"',
    '"' + "nine " * 3000 + 'minutes"', '"' + "9" * 5000 + ' minutes"', '"' + "7" * 400 + '.5 hours"',
    "true", "null", "{}", "[]", '"ok"', "3", "-0.0", '"job.toml"', '[1, "two", {"3": [4]}]',
    '"' + "[" * 5000 + '"', '"[' + "9" * 5000 + ']"',  # JSON text inside a string (a list some parsers pass)
]
_fragment = st.sampled_from(JSON_FRAGMENTS)
_key = st.sampled_from(["path", "content", "old_text", "new_text", "folders", "expression", "x", "\\ud800", ""])

#: JSON text: fragments, lists and objects of them, sometimes cut short
json_text = st.recursive(
    _fragment,
    lambda inner: st.lists(inner, max_size=3).map(lambda xs: "[" + ",".join(xs) + "]")
    | st.lists(st.tuples(_key, inner), max_size=3).map(
        lambda kv: "{" + ",".join(f'"{k}": {v}' for k, v in kv) + "}"),
    max_leaves=4,
)
json_text = json_text | st.builds(lambda t, n: t[:n], json_text, st.integers(0, 60))

#: an object's JSON text (tool-call arguments), its values hostile
json_object_text = st.lists(st.tuples(_key, json_text), max_size=3).map(
    lambda kv: "{" + ",".join(f'"{k}": {v}' for k, v in kv) + "}")


class _Odd:
    """An object of no JSON type, whose ``str`` raises."""

    def __str__(self) -> str:
        raise RuntimeError("no str")

    def __repr__(self) -> str:
        return "_Odd()"


#: Python values no JSON parser gives an honest caller, by name (built by :func:`build`: Hypothesis never
#: prints them, some cannot be printed)
SPECIAL_VALUES: dict[str, Any] = {
    "int 5000 digits": lambda: 10 ** 5000, "int -401 digits": lambda: -(10 ** 400), "int 302 digits": lambda: 10 ** 301,
    "nan": lambda: float("nan"), "inf": lambda: float("inf"), "-inf": lambda: -float("inf"), "1e308": lambda: 1e308,
    "-1e308": lambda: -1e308, "tiny": lambda: 5e-324, "surrogate": lambda: "\ud800", "surrogate inside": lambda: "a\udfffb",
    "2M chars": lambda: "x" * 2_000_000, "5000 digits text": lambda: "9" * 5000,
    "5000 digits minutes": lambda: "9" * 5000 + " minutes", "nested 5000": lambda: deep(5000),
    "nested 40": lambda: deep(40), "int key": lambda: {1: 2}, "set": lambda: {"a": {1, 2}}, "bytes": lambda: b"bytes",
    "tuple": lambda: (1, 2), "odd object": _Odd, "True": lambda: True, "None": lambda: None, "list": list,
    "dict": dict, "empty": str, "job.toml": lambda: "job.toml",
}


class Special:
    """A marker for one of :data:`SPECIAL_VALUES` in a recipe."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Special({self.name!r})"


def build(recipe: Any) -> Any:
    """The value a recipe of :data:`python_values` stands for (markers replaced by their values)."""
    if isinstance(recipe, Special):
        return SPECIAL_VALUES[recipe.name]()
    if isinstance(recipe, list):
        return [build(r) for r in recipe]
    if isinstance(recipe, dict):
        return {k: build(v) for k, v in recipe.items()}
    return recipe


_scalar = (st.sampled_from(sorted(SPECIAL_VALUES)).map(Special) | st.none() | st.booleans() | st.integers()
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20))

#: recipes of Python values (:func:`build` makes them): specials and ordinary scalars, in lists and objects
python_values = st.recursive(
    _scalar,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=5,
)
