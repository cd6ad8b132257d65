"""The validation probe's sandbox job (``inspect``). It runs INSIDE the sandbox, loaded by
:mod:`ait_env.sandbox.zygote` from a copy of this file; standard library and the adapter only, never
``ait_env``.

:func:`run` imports the job's package the way prime-rl does, calls ``load_environment(**args)``, describes
the dataset (its questions, and every message its prompts are built from, raw), the tools and the system
prompt, then rolls the dev examples out (``req["rows"]``, ``req["group_size"]`` rollouts each, concurrently)
with the adapter's ``run_groups``, the call the local trainer's rollout worker makes, against the probe's
scripted model on the Unix socket ``req["uds"]`` (:mod:`ait_env.probe.scripted_model`, outside the sandbox).
It returns raw results only (rewards, response ids, errors, what verifiers logged): which rollout had which
script, what the tools answered and whether the rubric tells them apart is decided by the orchestrator
(:mod:`ait_env.probe.dynamic`). The one in-process check left (:func:`_not_the_familys`, a friendlier
message for a wrapped tool) is advisory: code in this process can defeat it, the parent's comparison of the
tool results cannot be.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any


def _openai_tool(t: Any) -> dict[str, Any]:
    """A verifiers tool definition (pydantic ``Tool`` or dict) as an OpenAI-style tool schema."""
    d = t.model_dump(exclude_none=True) if hasattr(t, "model_dump") else t
    if not isinstance(d, dict):
        return {"type": "function", "function": {"name": str(d), "parameters": {}}}
    return d if "function" in d else {"type": "function", "function": d}

def _not_the_familys(name: str, fn: Any, tools_file: str, module_name: str) -> str:
    """Why ``fn`` is not the family's own tool ``name`` as the bundle's ``family_tools.py`` defines it ("" when
    it is): the object the module defines, unwrapped, with the module's globals and the code compiled
    from the file. (The agent's code runs in this process and could still defeat an in-process check; the
    training audit compares the tool results the model is shown with the family's, outside the sandbox.)"""
    import os
    import sys

    mod = sys.modules.get(module_name)
    if mod is None or os.path.realpath(str(getattr(mod, "__file__", ""))) != os.path.realpath(tools_file):
        return f"{module_name} is not the family's module {os.path.basename(tools_file)}"
    if fn is not getattr(mod, name, None):
        return f"it is not the function {module_name}.{name}"
    if hasattr(fn, "__wrapped__") or getattr(fn, "__globals__", None) is not vars(mod):
        return "it is wrapped or rebound"
    try:
        with open(tools_file, encoding="utf-8") as f:
            source = compile(f.read(), tools_file, "exec")
    except (OSError, SyntaxError) as exc:
        return f"the family's module cannot be read ({exc})"
    fresh = next((c for c in source.co_consts if getattr(c, "co_name", None) == name), None)
    code = getattr(fn, "__code__", None)
    if fresh is None or code is None or (code.co_code, code.co_consts, code.co_names) != \
            (fresh.co_code, fresh.co_consts, fresh.co_names):
        return "its code is not the family's"
    return ""


def run(req: dict[str, Any], adapter: Any, ctx: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"status": "ok"}
    ctx.send({"stage": "import"})
    try:
        module = adapter.import_env_package(req["dir"], req["package"])
    except SystemExit as exc:
        return {"status": "error", "stage": "import", "kind": "exit", "error": f"sys.exit({exc.code}) at import"}
    except MemoryError:
        return {"status": "error", "stage": "import", "kind": "memory", "error": "MemoryError at import"}
    except BaseException as exc:  # noqa: BLE001
        return {"status": "error", "stage": "import", "kind": "exception",
                "error": f"{type(exc).__name__}: {exc}", "traceback": ctx.traceback()}
    ctx.send({"stage": "load_environment"})
    try:
        env = adapter.load_environment(module, req.get("args") or {})
    except SystemExit as exc:
        return {"status": "error", "stage": "load_environment", "kind": "exit",
                "error": f"sys.exit({exc.code}) in load_environment"}
    except MemoryError:
        return {"status": "error", "stage": "load_environment", "kind": "memory", "error": "MemoryError"}
    except adapter.AdapterError as exc:
        return {"status": "error", "stage": "load_environment", "kind": "contract", "error": str(exc)}
    except BaseException as exc:  # noqa: BLE001
        return {"status": "error", "stage": "load_environment", "kind": "exception",
                "error": f"{type(exc).__name__}: {exc}", "traceback": ctx.traceback()}
    ctx.send({"stage": "dataset"})
    out["is_tool_env"] = adapter.is_tool_env(env)
    out["columns"] = adapter.dataset_columns(env)
    n = adapter.dataset_len(env)
    out["rows"] = n
    cap = int(req.get("max_rows", 100_000))
    out["questions"] = [str(q) for q in adapter.dataset_column(env, "question", limit=min(n, cap))]
    answers = adapter.dataset_column(env, "answer", limit=min(n, cap))
    out["empty_answers"] = sum(1 for a in answers if not str(a if a is not None else "").strip())
    # every message the prompts are built from (a supplied prompt column, system prompt, few-shot), as raw
    # messages: the leak check reads them as the model would, outside the sandbox
    out["prompt_messages"], out["prompt_messages_cut"] = _prompt_messages(
        env, adapter, set(out["questions"]), int(req.get("max_prompt_chars", 4_000_000)))
    out["max_turns"] = adapter.max_turns(env)
    out["system_prompt"] = adapter.system_prompt(env)
    prompts = adapter.dataset_column(env, "prompt", limit=min(n, 2000))
    out["longest_prompt"] = max((json.dumps(p, default=str) for p in prompts), key=len, default="")
    tools = adapter.tool_functions(env)
    tools_file = f"{req['dir']}/{req['package']}/{req.get('tools_module', 'family_tools')}.py"
    out["tools"] = {name: {"module": getattr(fn, "__module__", ""),
                           "file": getattr(getattr(fn, "__code__", None), "co_filename", ""),
                           "not_own": _not_the_familys(name, fn, tools_file, req.get("tools_module", "family_tools"))}
                    for name, fn in tools.items()}
    out["tool_defs"] = json.dumps([_openai_tool(t) for t in getattr(env, "tool_defs", []) or []], default=str)
    ctx.send({"stage": "rollout"})
    # the dev examples rolled out with the call training makes (run_groups), against the probe's scripted model
    # outside the sandbox: only raw results go back, every decision is the orchestrator's
    capture = _Capture()
    logger = logging.getLogger("verifiers")
    logger.addHandler(capture)
    try:
        client = adapter.make_client(uds=req["uds"], timeout=float(req.get("request_timeout", 60)))
        groups = [[{"prompt": row.get("prompt") or [], "example_id": k, "answer": row.get("answer", ""),
                    "info": row.get("info") or {}} for _ in range(int(req.get("group_size", 2)))]
                  for k, row in enumerate(req.get("rows") or [])]
        loop = asyncio.new_event_loop()  # (asyncio.run would start a thread to shut its executor down)
        try:
            out["rollouts"] = loop.run_until_complete(adapter.run_groups(env, client, req.get("model", "probe"),
                                                                         groups, {}))
        finally:
            loop.close()
    except MemoryError:
        return {"status": "error", "stage": "rollout", "kind": "memory", "error": "MemoryError in a rollout"}
    except BaseException as exc:  # noqa: BLE001
        out["rollouts"] = []
        out["rollout_error"] = f"{type(exc).__name__}: {exc}"[:1500]
        out["traceback"] = ctx.traceback()
    finally:
        logger.removeHandler(capture)
    out["rubric_errors"] = list(dict.fromkeys(m for m in capture.messages if "reward function" in m.lower()))[:20]
    return out


class _Capture(logging.Handler):
    """The errors verifiers logs (a reward function that raised is scored 0.0 and only logged)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if len(self.messages) < 200:
            self.messages.append(record.getMessage()[:500])


def _prompt_messages(env: Any, adapter: Any, skip: set[str], max_chars: int) -> tuple[list[Any], bool]:
    """The distinct messages a rollout's prompt is built from: every message of the dataset's ``prompt``
    column (verifiers uses a supplied prompt as is; otherwise it holds the system prompt, few-shot messages
    and the question), the environment's system prompt and few-shot messages; a message whose content is
    one of the questions in ``skip`` (read already) is left out. Returns (messages, whether ``max_chars``
    cut them short)."""
    pool: list[Any] = []
    if getattr(env, "system_prompt", None):
        pool.append({"role": "system", "content": env.system_prompt})
    few_shot = getattr(env, "few_shot", None)
    pool += list(few_shot) if isinstance(few_shot, list) else []
    seen: set[str] = set()
    out: list[Any] = []
    total = 0
    rows = adapter.dataset_column(env, "prompt")
    for item in [pool, *rows]:
        for message in item if isinstance(item, list) else [item]:
            if isinstance(message, dict) and isinstance(message.get("content"), str) and message["content"] in skip:
                continue
            key = json.dumps(message, default=str, sort_keys=True)
            if key in seen:
                continue
            seen.add(key)
            total += len(key)
            if total > max_chars:
                return out, True
            out.append(json.loads(key))
    return out, False
