"""The one guard on agent-controlled data (:mod:`ait_env.jobs.guard`): whatever JSON text or value it is
given, it answers with a value within its bounds or :class:`~ait_env.jobs.guard.Refused` (a message that says
what to fix), never another exception; and what it accepts goes through ``json.dumps``, ``str()`` and
``float()`` without raising."""

from __future__ import annotations

import json
import math
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ait_env.jobs import guard
from tests.hostile_values import build, deep, json_text, python_values


def _within_bounds(value) -> None:
    """What the guard promises of a value it accepted."""
    json.dumps(value)
    stack = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        assert depth <= guard.MAX_DEPTH
        if isinstance(v, int) and not isinstance(v, bool):
            assert len(str(v).lstrip("-")) <= guard.MAX_DIGITS and math.isfinite(float(v))
        elif isinstance(v, float):
            assert math.isfinite(v)
        elif isinstance(v, str):
            v.encode("utf-8")
        elif isinstance(v, dict):
            stack += [(x, depth + 1) for kv in v.items() for x in kv]
        elif isinstance(v, list):
            stack += [(x, depth + 1) for x in v]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=json_text)
def test_loads_refuses_or_returns_a_value_within_bounds(text):
    try:
        value = guard.loads(text)
    except guard.Refused as exc:
        assert str(exc)
        return
    _within_bounds(value)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recipe=python_values)
def test_check_refuses_or_returns_the_value_itself(recipe):
    value = build(recipe)
    try:
        assert guard.check(value) is value
    except guard.Refused:
        return
    _within_bounds(value)


@pytest.mark.parametrize("text, says", [
    ("9" * 5000, "an integer of 5000 digits"),
    ("[" * 100_000, "nested deeper than 32"),
    ("[" * 33 + "]" * 33, "nested deeper than 32"),
    ("[NaN]", "NaN"),
    ("1e999", "beyond a float's range"),
    ('"\\ud800"', "lone surrogate"),
    ("[" + "{}," * 1_000_000 + "{}]", "more than 1,000,000 lists and objects"),
    ("{oops", "not valid JSON"),
    (b"\xff", "not valid JSON"),
])
def test_each_class_is_refused_with_what_to_change(text, says):
    with pytest.raises(guard.Refused) as err:
        guard.loads(text, what="the arguments")
    assert says in str(err.value) and str(err.value).startswith("the arguments: ")


def test_syntax_errors_are_not_json_and_bounds_are_not():
    with pytest.raises(guard.NotJSON) as err:
        guard.loads('{"a": }')
    assert "line 1 column 7" in err.value.reason
    with pytest.raises(guard.Refused) as bounded:
        guard.loads("9" * 400)
    assert not isinstance(bounded.value, guard.NotJSON)


def test_check_refuses_values_no_json_parser_makes():
    for value, says in [({1: "a"}, "key that is a int"), ({"a": {1}}, "a set"), (deep(40), "deeper than 32"),
                        (10 ** 301, "302 digits"), (float("inf"), "inf"), ("\udfff", "lone surrogate")]:
        with pytest.raises(guard.Refused, match=re.escape(says)):
            guard.check(value)
    assert guard.check([1, "a", {"b": None, "c": [1.5, True]}]) == [1, "a", {"b": None, "c": [1.5, True]}]
    assert guard.check(float("nan"), guard.Limits(finite=False)) != 0  # NaN passes where a caller names it


def test_limits_are_the_callers():
    tight = guard.Limits(max_chars=10, max_items=2, max_digits=3)
    for text in ('"' + "x" * 11 + '"', "[1, 2, 3]", "1234"):
        with pytest.raises(guard.Refused):
            guard.loads(text, tight)
    assert guard.loads("[123]", tight) == [123]


def test_bound_digits_makes_every_digit_run_parseable_and_keeps_small_numbers():
    text = "order 42 widgets, " + "0" * 5000 + "7 bolts and " + "9" * 5000 + " nuts at \u0663\u0664 each"
    out = guard.bound_digits(text)
    assert out.startswith("order 42 widgets, 7 bolts and 9") and out.endswith(" nuts at \u0663\u0664 each")
    for run in re.findall(r"\d+", out):
        assert len(run) <= guard.MAX_DIGITS and int(run) >= 0
    assert guard.bound_digits("3 + 4") == "3 + 4"


def test_number_is_a_finite_float_within_the_magnitude_or_none():
    assert guard.number(0.5) == 0.5 and guard.number(3) == 3.0 and guard.number(-1e6) == -1e6
    for bad in (1e308, -1e7, float("nan"), float("inf"), 10 ** 400, True, "1", None, [1]):
        assert guard.number(bad) is None


def test_dumps_checks_first():
    assert json.loads(guard.dumps({"a": [1, "b"]})) == {"a": [1, "b"]}
    with pytest.raises(guard.Refused):
        guard.dumps({"a": 10 ** 5000})
    with pytest.raises(guard.Refused):
        guard.dumps({"a": st})  # a module: not JSON data
