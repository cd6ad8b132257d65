from ait_env.actions import parse_action


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
    import json
    content = 'text = msg.rsplit("</think>", 1)[-1]  # <think> and </tool_call> inside code\n'
    action = "<think>plan</think>" + "<tool_call>" + json.dumps(
        {"name": "write_file", "arguments": {"path": "e.py", "content": content}}) + "</tool_call>"
    p = parse_action(action)
    assert p.ok and p.calls[0].arguments["content"] == content
