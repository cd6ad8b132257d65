"""Adapter for the pinned inner stack: verifiers 0.2.0, classic ("v0") API, as prime-rl v0.7.0 uses it.

Every line that depends on the verifiers version lives here, so a verifiers v1 / newer prime-rl
adapter can be added beside it. Contract:

- :func:`import_env_package` imports a job's package (laid out by
  :func:`ait_env.jobs.bundle.write_env_package`) the way prime-rl's ``load_environment(env_id)`` does;
- :func:`load_environment` calls its ``load_environment(**args)`` and checks the result is a classic
  ``vf.Environment``;
- :func:`dataset_len`, :func:`dataset_columns`, :func:`dataset_column`, :func:`tool_functions`,
  :func:`max_turns`, :func:`system_prompt` read what the probe and the rollout worker need from the
  environment;
- :func:`run_groups` rolls groups out and scores them with verifiers' own rollout code: the call the local
  trainer's rollout worker makes, and the one the validation probe makes (against its scripted model, served
  outside the sandbox: :mod:`ait_env.probe.scripted_model`), so the probe runs no code of its own here;
- :func:`score_completion` scores one completion (OpenAI-style message dicts) with the
  environment's own rubric, exactly as a rollout would be scored, and reports reward-function
  errors that verifiers would otherwise swallow (tests);
- :func:`run_scripted` runs whole rollouts with verifiers' own rollout code (``setup_state``, the env's tool
  calls and ``update_tool_args``, the rubric on the final state) where the model's replies come from a
  script (:func:`scripted_client`), in process (tests).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import math
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

VERIFIERS_VERSION = "0.2.0"


class AdapterError(RuntimeError):
    """The environment does not meet the classic verifiers contract; message says how to fix it."""


def _vf() -> Any:
    import verifiers as vf

    return vf


def import_env_package(parent: Path, env_id: str) -> ModuleType:
    """Import the job package ``env_id`` from the folder ``parent`` exactly the way prime-rl's
    ``verifiers.load_environment(env_id)`` does (``verifiers/utils/env_utils.py``:
    ``importlib.import_module(env_id)`` once the package is importable), so the code that is validated
    is the code that trains. The package comes from :func:`ait_env.jobs.bundle.write_env_package`.

    In a long-lived process (tests), modules of the same names imported from another job's package
    (its ``family_tools``, its helpers) are dropped first; installed modules are never touched, so an
    agent file named like one resolves the way it would under prime-rl."""
    parent = Path(parent).resolve()
    pkg = parent / env_id
    if not (pkg / "__init__.py").is_file():
        raise AdapterError(f"package {env_id!r} not found in {parent}")
    stale = {env_id, *(p.stem for p in pkg.glob("*.py")), *(p.name for p in pkg.iterdir() if p.is_dir())}
    for name in [n for n in sys.modules if n.split(".")[0] in stale]:
        origin = Path(getattr(sys.modules[name], "__file__", "") or "/").resolve()
        from_a_job = any(part.startswith("ait_job_") for part in origin.parts)
        if from_a_job and parent not in origin.parents:
            del sys.modules[name]
    for folder in (str(pkg), str(parent)):
        if folder in sys.path:
            sys.path.remove(folder)
    sys.path.insert(0, str(parent))
    importlib.invalidate_caches()
    return importlib.import_module(env_id)


def load_environment(module: ModuleType, args: dict[str, Any]) -> Any:
    fn = getattr(module, "load_environment", None)
    if not callable(fn):
        raise AdapterError("the module has no callable load_environment(**kwargs)")
    env = fn(**args)
    if not isinstance(env, _vf().Environment):
        raise AdapterError(f"load_environment returned {type(env).__name__}, not a verifiers Environment "
                           "(use vf.ToolEnv(dataset=..., tools=TOOLS, rubric=...))")
    return env


def is_tool_env(env: Any) -> bool:
    return isinstance(env, _vf().ToolEnv)


def dataset_column(env: Any, name: str, limit: int | None = None) -> list[Any]:
    """One column of the training dataset (fast columnar access)."""
    ds = getattr(env, "dataset", None)
    if ds is None or name not in ds.column_names:
        return []
    if limit is not None and limit < len(ds):
        ds = ds.select(range(limit))
    return list(ds[name])


def dataset_len(env: Any) -> int:
    ds = getattr(env, "dataset", None)
    return 0 if ds is None else len(ds)


def dataset_columns(env: Any) -> list[str]:
    ds = getattr(env, "dataset", None)
    return [] if ds is None else list(ds.column_names)


def tool_functions(env: Any) -> dict[str, Any]:
    return dict(getattr(env, "tool_map", {}) or {})


def max_turns(env: Any) -> int:
    return int(getattr(env, "max_turns", 1) or 1)


def system_prompt(env: Any) -> str:
    return str(getattr(env, "system_prompt", "") or "")


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def score_completion(env: Any, row: dict[str, Any], completion: list[dict[str, Any]]) -> tuple[float, dict[str, float], list[str]]:
    """Score ``completion`` (OpenAI-style messages) for dataset ``row`` with the env's rubric.

    Returns ``(reward, metrics, errors)``; ``errors`` lists reward-function exceptions (verifiers
    logs them and scores 0.0, which would hide a broken rubric).
    """
    from verifiers.types import State
    from verifiers.utils.message_utils import normalize_messages

    state = State(input={"prompt": row.get("prompt") or [], "answer": row.get("answer", ""),
                         "info": row.get("info") or {}, "example_id": row.get("example_id", 0)})
    state["completion"] = normalize_messages(completion)
    state["trajectory"] = []
    state["is_completed"] = True
    state["is_truncated"] = False
    state["stop_condition"] = None
    state["error"] = None
    handler = _Capture()
    logger = logging.getLogger("verifiers")
    logger.addHandler(handler)
    try:
        asyncio.run(env.rubric.score_rollout(state))
    finally:
        logger.removeHandler(handler)
    reward = float(state.get("reward") or 0.0)
    metrics = {k: float(v) for k, v in (state.get("metrics") or {}).items()}
    errors = [m for m in handler.messages if "reward function" in m.lower()]
    return reward, metrics, errors


# ---------------------------------------------------------------------- rollouts (training)
def make_client(uds: str | None = None, base_url: str = "http://localhost/v1", timeout: float = 600.0) -> Any:
    """A verifiers chat-completions client for an OpenAI-compatible endpoint (optionally over a Unix socket)."""
    import httpx
    from openai import AsyncOpenAI
    from verifiers.clients import OpenAIChatCompletionsClient

    transport = httpx.AsyncHTTPTransport(uds=uds) if uds else None
    http = httpx.AsyncClient(transport=transport, timeout=timeout)
    return OpenAIChatCompletionsClient(AsyncOpenAI(base_url=base_url, api_key="local", http_client=http,
                                                   max_retries=0))


def rollout_inputs(env: Any, indices: list[int], group_size: int) -> list[list[dict[str, Any]]]:
    """Groups of ``group_size`` identical rollout inputs for the dataset rows ``indices``."""
    ds = env.get_dataset()
    groups = []
    for idx in indices:
        row = ds[int(idx) % len(ds)]
        inp = {"prompt": row["prompt"], "example_id": int(idx), "answer": row.get("answer", ""),
               "info": row.get("info") or {}}
        groups.append([dict(inp) for _ in range(group_size)])
    return groups


def _number(value: Any) -> float | None:
    """A rubric's value as a float (``None`` when it is not a number at all)."""
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError, OverflowError):
        return None


async def run_groups(env: Any, client: Any, model: str, groups: list[list[dict[str, Any]]],
                     sampling_args: dict[str, Any], max_concurrent_groups: int = 64) -> list[list[dict[str, Any]]]:
    """Roll out and score each group with verifiers' own rollout code (``Environment._run_group_states``:
    rollouts, then the rubric's group scoring). Returns per rollout: reward (``None`` when the rubric's
    reward was NaN or infinite, with ``reward_raw`` its repr: JSON cannot carry it, and the trainer
    fails the job on it), finite metrics, the ids of the model responses of each turn, the number of
    turns, the stop condition and any error."""
    sem = asyncio.Semaphore(max_concurrent_groups)

    async def one(group: list[dict[str, Any]]) -> list[dict[str, Any]]:
        async with sem:
            states = await env._run_group_states(group, client, model, sampling_args)
        out = []
        for st in states:
            traj = st.get("trajectory") or []
            ids = []
            for step in traj:
                resp = step.get("response") if isinstance(step, dict) else None
                rid = getattr(resp, "id", None)
                if rid:
                    ids.append(rid)
            err = st.get("error")
            reward = _number(st.get("reward"))
            out.append({"reward": 0.0 if reward is None else reward if math.isfinite(reward) else None,
                        "reward_raw": None if reward is None or math.isfinite(reward) else repr(reward),
                        "response_ids": ids, "turns": len(traj), "stop": st.get("stop_condition"),
                        "metrics": {k: v for k, v in ((k, _number(v)) for k, v in (st.get("metrics") or {}).items())
                                    if v is not None and math.isfinite(v)},
                        "error": None if err is None else f"{type(err).__name__}: {err}"[:500]})
        return out

    return list(await asyncio.gather(*(one(g) for g in groups)))


# ---------------------------------------------------------------------- scripted rollouts (the probe)
def scripted_client(scripts: dict[int, list[dict[str, Any]]]) -> Any:
    """A verifiers ``Client`` whose reply to rollout ``example_id`` at turn ``t`` is ``scripts[example_id][t]``
    (an OpenAI-style assistant message: ``content`` and optional ``tool_calls``); past its script it answers
    with empty content (which ends a tool env's rollout). Each reply yields to the event loop first, so
    concurrent rollouts interleave their turns as they do against a real server."""
    import json

    from verifiers.clients.client import Client
    from verifiers.types import Response, ResponseMessage, ToolCall

    class _Scripted(Client):  # only get_response is used: the native hooks are never reached
        def setup_client(self, config: Any) -> Any:
            return None

        async def to_native_tool(self, tool: Any) -> Any:
            return tool

        async def to_native_prompt(self, messages: Any) -> Any:
            return messages, {}

        async def get_native_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

        async def raise_from_native_response(self, response: Any) -> None:
            return None

        async def from_native_response(self, response: Any) -> Any:
            return response

        async def close(self) -> None:
            return None

        async def get_response(self, prompt: Any, model: str, sampling_args: Any, tools: Any = None,
                               **kwargs: Any) -> Any:
            await asyncio.sleep(0)
            state = kwargs.get("state") or {}
            script = scripts.get(int(state.get("example_id") or 0), [])
            turn = len(state.get("trajectory") or [])
            msg = script[turn] if turn < len(script) else {"content": ""}
            calls = [ToolCall(id=str(c.get("id") or f"call_{turn}_{i}"), name=str(c["function"]["name"]),
                              arguments=c["function"]["arguments"] if isinstance(c["function"]["arguments"], str)
                              else json.dumps(c["function"]["arguments"]))
                     for i, c in enumerate(msg.get("tool_calls") or [])]
            return Response(id=f"scripted-{state.get('example_id')}-{turn}", created=0, model=model,
                            message=ResponseMessage(content=msg.get("content") or "", tool_calls=calls or None,
                                                    finish_reason="tool_calls" if calls else "stop",
                                                    is_truncated=False))

    return _Scripted(None)


def _message_dict(m: Any) -> dict[str, Any]:
    d = m.model_dump(exclude_none=True) if hasattr(m, "model_dump") else dict(m)
    return {k: d[k] for k in ("role", "content", "tool_calls", "tool_call_id") if k in d}


def run_scripted(env: Any, row: dict[str, Any], scripts: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Roll out ``row`` once per script, all concurrently in one group (verifiers' ``_run_group_states``:
    the rollouts, then the rubric's group scoring), the model's replies taken from the scripts. Returns per
    rollout: reward (``None`` when not a finite number), the tool results it was shown in order, any error,
    and the reward-function errors verifiers logged."""
    group = [{"prompt": row.get("prompt") or [], "example_id": i, "answer": row.get("answer", ""),
              "info": row.get("info") or {}} for i in range(len(scripts))]
    client = scripted_client(dict(enumerate(scripts)))
    handler = _Capture()
    logger = logging.getLogger("verifiers")
    logger.addHandler(handler)
    try:
        states = asyncio.run(env._run_group_states(group, client, "scripted", {}))
    finally:
        logger.removeHandler(handler)
    errors = [m for m in handler.messages if "reward function" in m.lower()]
    out = []
    for st in states:
        completion = [_message_dict(m) for m in (st.get("completion") or [])]
        reward = _number(st.get("reward"))
        err = st.get("error")
        out.append({"reward": reward if reward is not None and math.isfinite(reward) else None,
                    "tool_results": [str(m.get("content")) for m in completion if m.get("role") == "tool"],
                    "error": None if err is None else f"{type(err).__name__}: {err}"[:500],
                    "errors": errors})
    return out
