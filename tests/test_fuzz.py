"""Property-based fuzz: no exception escapes step, whatever the agent sends."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ait_env.episode.tools import TOOL_NAMES

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


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(actions)
def test_random_actions_never_raise(make_env, seq):
    env = make_env(family="arithmetic", overrides={"env": {"max_turns": 5}})
    obs, info = env.reset(seed=0)
    for action in seq:
        obs, reward, terminated, truncated, info = env.step(action)
        assert isinstance(obs, str) and env.observation_space.contains(obs)
        assert isinstance(reward, float)
        if terminated or truncated:
            assert "reward" in info
            break
    # the workspace root never gained files outside itself
    ws = env.unwrapped.workspace
    for f in ws.files():
        assert ".." not in f.split("/")
