"""The tool-call reader of the env, the hidden-eval harness and the local endpoint (ait_env/jobs/toolcalls.py)."""

import json
from types import SimpleNamespace

from ait_env.jobs.toolcalls import (
    decode_arguments, final_text, find_blocks, parse_action, parse_text_tool_calls, split_completion,
    strip_think, strip_tool_calls, structured_tool_calls,
)
from task_families import base


def test_single_block_with_think_and_prose():
    p = parse_action('<think>plan {"name": "x"}</think>Let me look.\n<tool_call>\n{"name": "list_files", '
                     '"arguments": {}}\n</tool_call>')
    assert p.ok and [c.name for c in p.calls] == ["list_files"]
    assert p.text == "Let me look."


def test_several_blocks_in_order():
    p = parse_action('<tool_call>{"name": "read_file", "arguments": {"path": "a"}}</tool_call> and '
                     '<tool_call>{"name": "read_file", "arguments": {"path": "b"}}</tool_call>')
    assert [c.arguments["path"] for c in p.calls] == ["a", "b"]


def test_bare_json_and_fenced_json():
    assert parse_action('{"name": "list_files", "arguments": {}}').calls[0].name == "list_files"
    assert parse_action('```json\n{"name": "list_files"}\n```').calls[0].arguments == {}


def test_arguments_as_json_string_accepted():
    p = parse_action('<tool_call>{"name": "read_file", "arguments": "{\\"path\\": \\"x\\"}"}</tool_call>')
    assert p.calls[0].arguments == {"path": "x"}


def test_malformed_inputs_give_errors_not_exceptions():
    for bad in ["", "hello", "<tool_call>{not json}</tool_call>", "<tool_call>[1,2]</tool_call>",
                '<tool_call>{"arguments": {}}</tool_call>', '<tool_call>{"name": "x", "arguments": [1]}</tool_call>',
                '<tool_call>{"name": "x"', "</tool_call>", None, 42, '{"name": 3}']:
        p = parse_action(bad)
        assert not p.ok and p.errors, bad


def test_dangling_think_close_hides_reasoning():
    p = parse_action('reasoning <tool_call>{"name":"evil"}</tool_call></think><tool_call>{"name": "list_files"}'
                     '</tool_call>')
    assert [c.name for c in p.calls] == ["list_files"]


def test_partial_errors_keep_valid_calls():
    p = parse_action('<tool_call>{"name": "list_files"}</tool_call><tool_call>{oops}</tool_call>')
    assert [c.name for c in p.calls] == ["list_files"] and len(p.errors) == 1


def test_think_and_tool_call_tags_inside_file_content_survive():
    content = 'text = msg.rsplit("</think>", 1)[-1]  # <think> and </tool_call> inside code\n'
    action = "<think>plan</think>" + "<tool_call>" + json.dumps(
        {"name": "write_file", "arguments": {"path": "e.py", "content": content}}) + "</tool_call>"
    p = parse_action(action)
    assert p.ok and p.calls[0].arguments["content"] == content


def test_unreadable_json_gives_errors_not_exceptions():
    assert not parse_action("<tool_call>" + "[" * 100_000 + "</tool_call>").ok
    p = parse_action('<tool_call>{"name": "x", "arguments": {"n": ' + "1" * 5000 + "}}</tool_call>")
    assert not p.ok and "an integer of 5000 digits" in p.errors[0].message  # what to fix, not a bare "invalid"


# ---------------------------------------------------------------- the pieces every reader shares
def test_find_blocks_ends_at_the_first_accepted_closing_tag():
    text = "a<tool_call>x</tool_call>y</tool_call>b<tool_call>z"
    assert [(b.body, b.closed) for b in find_blocks(text)] == [("x", True), ("z", False)]
    blocks = find_blocks(text, ends_at=lambda body: body.endswith("y"))
    assert [(b.body, b.closed) for b in blocks] == [("x</tool_call>y", True), ("z", False)]
    assert text[blocks[0].start:blocks[0].end] == "<tool_call>x</tool_call>y</tool_call>"
    assert find_blocks("no calls") == []


def test_decode_arguments():
    assert decode_arguments({"a": 1}) == ({"a": 1}, None)
    assert decode_arguments('{"a": 1}') == ({"a": 1}, None)
    for empty in (None, "", "  "):
        assert decode_arguments(empty) == ({}, None)
    for bad, why in (("{oops", "not valid JSON"), ("[1]", "got list"), ("null", "got NoneType"),
                     ([1], "not valid JSON"), (5, "not valid JSON")):
        args, err = decode_arguments(bad)
        assert args is None and err is not None and why in err, bad


def test_final_text_and_strip_tool_calls():
    assert final_text("<think>7</think>Answer: 3 <tool_call>{}</tool_call>") == "Answer: 3"
    assert final_text("Answer: 4 <tool_call>cut off") == "Answer: 4"
    assert strip_tool_calls("a<tool_call>x</tool_call>b") == "ab"
    assert strip_tool_calls(None) == ""  # type: ignore[arg-type]
    assert strip_think is base.strip_think  # one reasoning rule for the checkers and the harness


# ---------------------------------------------------------------- where the readers differ (module docstring)
def _endpoint_calls(text: str) -> list[tuple[str, dict]]:
    calls = split_completion(text)[1]
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def _harness_calls(text: str) -> list[tuple[str | None, dict | None, bool]]:
    return [(c.name, c.arguments, c.error is None) for c in parse_text_tool_calls(text)]


CALC = '{"name": "calculator", "arguments": {"expression": "1+2"}}'


def test_readers_agree_on_a_plain_call():
    text = f"Let me compute. <tool_call>{CALC}</tool_call>"
    assert [(c.name, c.arguments) for c in parse_action(text).calls] == [
        ("calculator", {"expression": "1+2"})]
    assert _harness_calls(text) == [("calculator", {"expression": "1+2"}, True)]
    assert _endpoint_calls(text) == [("calculator", {"expression": "1+2"})]
    assert split_completion(text)[0] == "Let me compute. "


def test_reasoning_rules_differ():
    text = (f"<think>maybe <tool_call>{CALC}</tool_call></think>"
            f"no<think>unfinished <tool_call>{CALC}</tool_call>")
    assert len(parse_action(text).calls) == 1      # the env drops the leading block only
    assert _harness_calls(text) == []               # up to the last </think>, and the unclosed tail
    assert len(_endpoint_calls(text)) == 2          # the endpoint does not read reasoning


def test_a_closing_tag_inside_the_json():
    call = json.dumps({"name": "calculator", "arguments": {"expression": "</tool_call>"}})
    text = f"<tool_call>{call}</tool_call>"
    assert parse_action(text).calls[0].arguments == {"expression": "</tool_call>"}
    assert [c.error is not None and "invalid JSON" in c.error for c in parse_text_tool_calls(text)] == [True]
    content, calls = split_completion(text)
    assert calls == [] and content == text


def test_an_unclosed_block():
    text = f"<tool_call>{CALC}"
    assert not parse_action(text).ok and "closing </tool_call>" in parse_action(text).errors[0].message
    assert _harness_calls(text) == [("calculator", {"expression": "1+2"}, True)]  # cut off by max_tokens
    assert split_completion(text) == (text, [])


def test_bare_json_is_a_call_for_the_env_only():
    assert parse_action(CALC).calls[0].name == "calculator"
    assert parse_text_tool_calls(CALC) == [] and split_completion(CALC) == (CALC, [])


def test_names():
    text = '<tool_call>{"name": "", "arguments": {}}</tool_call>'
    assert "missing the tool 'name'" in parse_action(text).errors[0].message
    assert _harness_calls(text) == [("", {}, True)]  # then "unknown tool ''" when run
    assert _endpoint_calls(text) == [("", {})]
    for bad in ('<tool_call>{"name": 3}</tool_call>', "<tool_call>[1]</tool_call>"):
        assert not parse_action(bad).calls and not _endpoint_calls(bad)
        assert parse_text_tool_calls(bad)[0].error


def test_arguments_rules():
    as_string = '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>'
    assert parse_action(as_string).calls[0].arguments == {"a": 1}
    assert _harness_calls(as_string) == [("f", {"a": 1}, True)]
    assert split_completion(as_string) == (as_string, [])  # left for the harness's text reader
    params = '<tool_call>{"name": "f", "parameters": {"a": 1}}</tool_call>'
    assert parse_action(params).calls[0].arguments == {"a": 1}
    assert _harness_calls(params) == [("f", {"a": 1}, True)]
    assert _endpoint_calls(params) == [("f", {})]
    null_string = '<tool_call>{"name": "f", "arguments": "null"}</tool_call>'
    assert "got NoneType" in parse_action(null_string).errors[0].message
    assert _harness_calls(null_string) == [("f", None, False)]
    assert split_completion(null_string) == (null_string, [])
    null = '<tool_call>{"name": "f", "arguments": null}</tool_call>'
    assert parse_action(null).calls[0].arguments == {} and _harness_calls(null) == [("f", {}, True)]
    assert split_completion(null) == (null, [])


def test_harness_attempts_keep_order_ids_and_raw_arguments():
    text = f'<tool_call>{{oops}}</tool_call><tool_call>{CALC}</tool_call>'
    first, second = parse_text_tool_calls(text, turn=4)
    assert (first.id, first.name, first.raw_arguments, first.source) == ("call_4_0", None, "{oops}", "text")
    assert (second.id, second.raw_arguments, second.error) == ("call_4_1", '{"expression": "1+2"}', None)


def test_structured_tool_calls():
    fn = SimpleNamespace(name="calculator", arguments='{"expression": "2*3"}')
    msg = SimpleNamespace(tool_calls=[SimpleNamespace(id="c1", type="function", function=fn),
                                      SimpleNamespace(id=None, type="custom", function=None),
                                      SimpleNamespace(id="c3", type="function",
                                                      function=SimpleNamespace(name="f", arguments="[1]"))])
    a, b, c = structured_tool_calls(msg)
    assert (a.id, a.source, a.name, a.error) == ("c1", "structured", "calculator", None)
    assert a.arguments == {"expression": "2*3"} and a.raw_arguments == '{"expression": "2*3"}'
    assert b.id == "call_1" and b.error == "only function tool calls are supported"
    assert c.arguments is None and "got list" in (c.error or "")
    assert structured_tool_calls(SimpleNamespace(tool_calls=None)) == []


def test_split_completion_serialises_arguments_and_keeps_what_it_cannot_read():
    text = 'a<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>b<tool_call>{bad}</tool_call>c'
    content, calls = split_completion(text)
    assert content == "a" + "b<tool_call>{bad}</tool_call>c"
    assert calls[0]["type"] == "function" and calls[0]["function"] == {"name": "f", "arguments": '{"x": 1}'}
    assert calls[0]["id"].startswith("call_")
    two = split_completion(f"<tool_call>{CALC}</tool_call><tool_call>{CALC}</tool_call>")[1]
    assert two[0]["id"] != two[1]["id"]
