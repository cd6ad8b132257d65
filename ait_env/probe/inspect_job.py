"""The validation probe's sandbox job (``inspect``). It runs INSIDE the sandbox, loaded by
:mod:`ait_env.sandbox.zygote` from a copy of this file; standard library and the adapter only, never
``ait_env``.

:func:`run` imports the job's package the way prime-rl does, calls ``load_environment(**args)``,
describes the dataset, tools and rubric, and scores a correct and a wrong transcript of each dev
example with the environment's own rubric; for a stateful family it runs whole scripted rollouts of each
dev example instead (``req["rollouts"]``: verifiers' own rollout code, the replies from scripts, several
rollouts of one example concurrently), reporting each rollout's reward and the tool results it was shown. The orchestrator side (:mod:`ait_env.probe.dynamic`)
turns the answer into probe failures.
"""

from __future__ import annotations

import json
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
    # every other text the prompts are built from (a supplied prompt column, system prompt, few-shot): the
    # leak check reads them all, outside the sandbox
    out["prompt_texts"], out["prompt_texts_cut"] = adapter.prompt_texts(
        env, set(out["questions"]), int(req.get("max_prompt_chars", 4_000_000)))
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
    ctx.send({"stage": "rubric"})
    scores = []
    for ex in req.get("dev", []):
        pair: dict[str, Any] = {}
        for label in ("good", "bad"):
            try:
                reward, metrics, errors = adapter.score_completion(env, ex["row"], ex[label])
                pair[label] = {"reward": reward, "metrics": metrics, "errors": errors}
            except MemoryError:
                return {"status": "error", "stage": "rubric", "kind": "memory", "error": "MemoryError in the rubric"}
            except BaseException as exc:  # noqa: BLE001
                pair[label] = {"reward": None, "metrics": {}, "errors": [f"{type(exc).__name__}: {exc}"],
                               "traceback": ctx.traceback()}
        scores.append(pair)
    out["scores"] = scores
    rollouts = []
    for ex in req.get("rollouts", []):
        try:
            rollouts.append(adapter.run_scripted(env, ex["row"], ex["scripts"]))
        except MemoryError:
            return {"status": "error", "stage": "rollout", "kind": "memory", "error": "MemoryError in a rollout"}
        except BaseException as exc:  # noqa: BLE001
            rollouts.append([{"reward": None, "tool_results": [], "errors": [],
                              "error": f"{type(exc).__name__}: {exc}", "traceback": ctx.traceback()}])
    out["rollouts"] = rollouts
    return out
