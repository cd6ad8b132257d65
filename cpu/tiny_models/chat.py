"""The local models' chat format: rendering OpenAI-style messages (+ tools) to text, and splitting the
model's output back into content and tool calls (read by :mod:`ait_env.jobs.toolcalls`).

The same format is shipped as a Jinja ``chat_template`` in ``tokenizer_config.json`` so transformers
and vLLM can render it (no test here renders that template against this module). It is ChatML with
compact tool declarations (names and parameter names only, to keep prompts short for tiny models)::

    <|im_start|>system
    {system}<tools>calculator(expression)</tools><|im_end|>
    <|im_start|>user
    What is (3*8)+19?<|im_end|>
    <|im_start|>assistant
    <tool_call>{"name": "calculator", "arguments": {"expression": "3*8"}}</tool_call><|im_end|>
    <|im_start|>tool
    24<|im_end|>
    <|im_start|>assistant
    Answer: 43<|im_end|>
"""

from __future__ import annotations

import json
from typing import Any

from ait_env.jobs.toolcalls import split_completion

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
PAD = "<|endoftext|>"
SPECIAL_TOKENS = [PAD, IM_START, IM_END, "<tool_call>", "</tool_call>", "<tools>", "</tools>"]

CHAT_TEMPLATE = (
    "{%- set ns = namespace(sys='') -%}"
    "{%- if messages and messages[0]['role'] == 'system' -%}{%- set ns.sys = messages[0]['content'] or '' -%}{%- endif -%}"
    "{%- if ns.sys or tools -%}"
    "{{- '<|im_start|>system\\n' + ns.sys -}}"
    "{%- if tools -%}{{- '<tools>' -}}"
    "{%- for t in tools -%}{%- set f = t['function'] if 'function' in t else t -%}"
    "{{- f['name'] + '(' + ((f.get('parameters', {}) or {}).get('properties', {}) or {}).keys() | join(', ') + ')' -}}"
    "{%- if not loop.last -%}{{- ' ' -}}{%- endif -%}"
    "{%- endfor -%}{{- '</tools>' -}}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'system' -%}"
    "{%- elif m['role'] == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' + (m['content'] or '') -}}"
    "{%- for tc in (m.get('tool_calls') or []) -%}{%- set f = tc['function'] -%}"
    "{{- '<tool_call>{\"name\": \"' + f['name'] + '\", \"arguments\": ' -}}"
    "{%- if f['arguments'] is string -%}{{- f['arguments'] -}}{%- else -%}{{- f['arguments'] | tojson -}}{%- endif -%}"
    "{{- '}</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + (m['content'] or '') + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, list):  # OpenAI content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def _args_text(arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            return json.dumps(json.loads(arguments))
        except ValueError:
            return arguments
    return json.dumps(arguments)


def tool_signature(tool: dict[str, Any]) -> str:
    f = tool.get("function", tool)
    params = list(((f.get("parameters") or {}).get("properties") or {}).keys())
    return f"{f['name']}({', '.join(params)})"


def render(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
           add_generation_prompt: bool = False) -> str:
    """Render messages exactly like :data:`CHAT_TEMPLATE` (tool-call arguments re-serialised canonically)."""
    out: list[str] = []
    system = _text(messages[0].get("content")) if messages and messages[0].get("role") == "system" else ""
    if system or tools:
        out.append(f"{IM_START}system\n{system}")
        if tools:
            out.append("<tools>" + " ".join(tool_signature(t) for t in tools) + "</tools>")
        out.append(f"{IM_END}\n")
    for m in messages:
        role = m.get("role")
        if role == "system":
            continue
        if role == "assistant":
            calls = "".join(
                '<tool_call>{"name": "' + tc["function"]["name"] + '", "arguments": '
                + _args_text(tc["function"].get("arguments", {})) + "}</tool_call>"
                for tc in (m.get("tool_calls") or []))
            out.append(f"{IM_START}assistant\n{_text(m.get('content'))}{calls}{IM_END}\n")
        else:
            out.append(f"{IM_START}{role}\n{_text(m.get('content'))}{IM_END}\n")
    if add_generation_prompt:
        out.append(f"{IM_START}assistant\n")
    return "".join(out)


def parse_output(text: str) -> tuple[str, list[dict[str, Any]]]:
    """Split generated assistant text (up to ``<|im_end|>``) into (content, OpenAI tool_calls), by
    :func:`ait_env.jobs.toolcalls.split_completion`: unparsable calls stay in content."""
    return split_completion(text.split(IM_END, 1)[0])
