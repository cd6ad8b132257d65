"""Property-based fuzz: no exception escapes step, whatever the agent sends."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ait_env.episode.tools import TOOL_NAMES
from tests.hostile_values import json_object_text, json_text

json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=40),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                           max_leaves=8)
paths = st.sampled_from(["job.toml", "environment.py", "family_tools.py", "../x", "/etc/passwd", "a/b/c.txt",
                         "INSTRUCTIONS.md", "", ".", "..", "x/../../y", "\x00", "dir/", "é.txt"]) | st.text(max_size=30)
tool_calls = st.builds(
    lambda name, args: "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>",
    st.sampled_from(list(TOOL_NAMES) + ["nope", ""]),
    st.fixed_dictionaries({}, optional={"path": paths | json_values, "content": st.text(max_size=200) | json_values,
                                        "old_text": st.text(max_size=10), "new_text": st.text(max_size=10),
                                        "extra": json_values}))
raw = st.text(max_size=300) | st.sampled_from(["<tool_call>", "</tool_call>", "<think>", "{", '{"name": "submit_job"}'])
actions = st.lists(tool_calls | raw | st.builds(lambda a, b: a + b, raw, tool_calls), min_size=1, max_size=6)


#: tool calls whose JSON carries the values the guard bounds (:mod:`tests.hostile_values`: 5,000-digit integers,
#: nesting past the recursion limit, NaN, lone surrogates, ...), as a model would write them
hostile_calls = st.builds(lambda name, args: '<tool_call>{"name": "%s", "arguments": %s}</tool_call>' % (name, args),
                          st.sampled_from(list(TOOL_NAMES) + ["submit_jobs", "finish", "nope"]),
                          json_object_text | json_text)


def _play(env, seq) -> None:
    obs, info = env.reset(seed=0)
    for action in seq:
        obs, reward, terminated, truncated, info = env.step(action)
        assert isinstance(obs, str) and env.observation_space.contains(obs)
        assert isinstance(reward, float)
        assert "on our side" not in obs  # a tool that raised inside the env: our bug, whatever the agent sent
        if terminated or truncated:
            assert info["reward"]["status"] != "infra_failed"
            break
    # the workspace root never gained files outside itself
    ws = env.unwrapped.workspace
    for f in ws.files():
        assert ".." not in f.split("/")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(actions)
def test_random_actions_never_raise(make_env, seq):
    _play(make_env(family="arithmetic", overrides={"env": {"max_turns": 5}}), seq)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(hostile_calls | raw, min_size=1, max_size=4), st.booleans())
def test_hostile_json_in_tool_calls_never_raises(make_env, seq, research):
    """Issue 46, item 5: every value is answered with what to fix (an observation), never an exception."""
    _play(make_env(family="arithmetic", overrides={"env": {"max_turns": 5,
                                                           "max_jobs_per_episode": 2 if research else 1}}), seq)
