"""``AIT/JobWriting-v0`` as a verifiers environment (pinned: verifiers 0.2.0, classic API): the open-source
outer loop, driven by prime-rl v0.7.0 (``[[orchestrator.train.env]] id = "ait-job-writing"``) or by
verifiers' own rollout code (``env.evaluate``, ``vf-eval``). Every verifiers-version-specific line of the
outer loop lives here (the inner jobs' adapter is :mod:`ait_env.integrations.verifiers_v0`).

Contract (details and sources: ``docs/verifiers.md``):

- :func:`load_environment` returns a :class:`JobWritingVerifiersEnv` (a ``vf.MultiTurnEnv``). The env
  id ``ait-job-writing`` is the package ``environments/ait_job_writing`` (``vf-install ait-job-writing``
  or ``pip install -e environments/ait_job_writing``), which re-exports it: verifiers resolves an id by
  importing the module of that name (``verifiers/utils/env_utils.py``).
- **Dataset**: one row per (family, instance), ``info = {"family", "instance"}``; ``prompt`` is the
  episode's opening (system prompt + task) exactly as ``reset`` writes it. Train rows cycle through
  ``families`` (default: those not held out), eval rows through ``eval_families`` (default: held out).
- **One JobWritingEnv per rollout**, made in ``setup_state`` and closed at the rollout's cleanup; all
  of them share the wrapper's **one backend** (``gym.make(..., backend=<Backend>)``). The wrapper
  builds it from a name and closes it at teardown, or uses the instance it is given and never closes
  it. Blocking env calls (``reset``; ``step``, where ``submit_job`` waits for the job) run in the
  wrapper's thread pool (``env_threads``), never on the event loop.
- **Turns**: each assistant message becomes the env's text action
  (:func:`ait_env.episode.messages.action_text`). ``tool_format="native"`` (default): the episode's
  tools go to the model as ``tool_defs`` (the env's own JSON schemas, :func:`ait_env.episode.spec.episode_tools`:
  the six, plus ``submit_jobs`` and ``finish`` when ``env.max_jobs_per_episode > 1`` in ``overrides``), the system prompt loses its
  text-format tool sections, and each structured call gets a ``tool`` message under its own id (the
  env's notes follow as a ``user`` message). ``"text"``: no ``tool_defs``, the env's whole system
  prompt, and each turn's observation comes back as a ``user`` message, as in the gym API.
- **End**: the env's ``terminated``/``truncated`` ends the rollout (``final_env_response``). The
  rubric's reward is ``info["reward"]["total"]``; metrics ``ait_infra_failed``, ``ait_scored``,
  ``ait_validated``, ``ait_attempts``; the breakdown and the job's result stay in the state
  (``state_columns=["ait_reward", "ait_job"]`` puts them in the outputs).
- **Missing is not zero**: an ``infra_failed`` episode raises :class:`JobInfraFailed` (a
  ``vf.InfraError``), which verifiers records as the rollout's ``error``, and its reward is NaN, never
  0. prime-rl v0.7.0 drops errored rollouts before advantages; verifiers' ``evaluate`` keeps them (with
  ``error`` set) and can retry them (``max_retries``). A reset that fails and a rollout timeout are
  errors too. An episode that verifiers stops before the env ends (context or token budget) gets
  ``unfinished_reward`` (default -0.1, like an episode without a parsable submission).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import verifiers as vf
from datasets import Dataset

import ait_env  # noqa: F401  (registers AIT/JobWriting-v0)
from ait_env.backends import Backend, make_backend
from ait_env.config import compose
from ait_env.episode.messages import action_text, env_arguments
from ait_env.episode.spec import episode_tools
from ait_env.integrations.episode_rows import GYM_ID, ToolFormat, episode_rows, opening, resolve_families
from ait_env.integrations.verifiers_v0 import VERIFIERS_VERSION

__all__ = ["ENV_ID", "JobInfraFailed", "JobRubric", "JobWritingVerifiersEnv", "load_environment", "opening",
           "resolve_families", "scored_rewards", "tool_replies"]

ENV_ID = "ait-job-writing"
NOT_RUN = "error: this call was not run; see the note below."
logger = logging.getLogger(__name__)


class JobInfraFailed(vf.InfraError):
    """The episode could not be scored because our side failed (``infra_failed``): drop it."""


# --------------------------------------------------------------------------- rubric
def scored_rewards(outputs: Sequence[dict[str, Any]]) -> list[float]:
    """The rewards of the episodes that count: errored (dropped) outputs left out, never read as 0."""
    return [float(o["reward"]) for o in outputs if o.get("error") is None and not math.isnan(o["reward"])]


class JobRubric(vf.Rubric):
    """Reads the episode's reward breakdown (``state["ait_reward"]``, the env's ``info["reward"]``)."""

    def __init__(self, unfinished_reward: float = -0.1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.unfinished_reward = unfinished_reward
        self.add_reward_func(self.job_reward)
        for metric in (self.ait_infra_failed, self.ait_scored, self.ait_validated, self.ait_attempts):
            self.add_metric(metric)

    async def job_reward(self, state: vf.State) -> float:
        """The env's reward; NaN when the rollout errored (dropped: never a zero)."""
        breakdown = state.get("ait_reward")
        if state.get("error") is not None or (breakdown or {}).get("drop"):
            return math.nan
        if breakdown is None:
            return self.unfinished_reward
        return float(breakdown["total"])

    async def ait_infra_failed(self, state: vf.State) -> float:
        return float(bool((state.get("ait_reward") or {}).get("drop")))

    async def ait_scored(self, state: vf.State) -> float:
        return float((state.get("ait_reward") or {}).get("status") == "scored")

    async def ait_validated(self, state: vf.State) -> float:
        return float((state.get("ait_reward") or {}).get("validated_attempt") is not None)

    async def ait_attempts(self, state: vf.State) -> float:
        return float((state.get("ait_reward") or {}).get("attempts") or 0)


# --------------------------------------------------------------------------- the environment
@dataclass
class Episode:
    """One rollout's gym env and its latest ``info``; ``pending`` is a step still running in a thread."""

    env: gym.Env
    info: dict[str, Any] = field(default_factory=dict)
    pending: Future[Any] | None = None


class JobWritingVerifiersEnv(vf.MultiTurnEnv):
    """``AIT/JobWriting-v0`` episodes as verifiers rollouts (see the module docstring)."""

    def __init__(self, backend: Backend, *, owns_backend: bool, overrides: list[str] | dict[str, Any] | None,
                 max_turns: int, tool_format: ToolFormat = "native", env_threads: int = 64,
                 unfinished_reward: float = -0.1, **kwargs: Any) -> None:
        if tool_format not in ("native", "text"):
            raise ValueError(f"tool_format must be 'native' or 'text', got {tool_format!r}")
        self.backend = backend
        self.owns_backend = owns_backend
        self.overrides = overrides
        self.tool_format: ToolFormat = tool_format
        self.executor = ThreadPoolExecutor(max_workers=env_threads, thread_name_prefix="ait-vf-env")
        tools = [vf.Tool(name=t["function"]["name"], description=t["function"]["description"],
                         parameters=t["function"]["parameters"]) for t in episode_tools(compose(overrides=overrides))]
        # the env truncates itself at its own turn limit; verifiers' limit is only a backstop (verifiers
        # checks it before the turn's message reaches the env, so it must be one more)
        super().__init__(max_turns=max_turns + 1, rubric=JobRubric(unfinished_reward),
                         tool_defs=tools if tool_format == "native" else None, **kwargs)

    async def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await asyncio.wrap_future(self.executor.submit(fn, *args, **kwargs))

    async def setup_state(self, state: vf.State) -> vf.State:
        info = state["info"]
        try:
            env = await self._call(gym.make, GYM_ID, backend=self.backend, overrides=self.overrides)
            state["ait_episode"] = episode = Episode(env)
            _, episode.info = await self._call(env.reset, seed=info["instance"], options={
                "family": info["family"], "instance": info["instance"], "episode_id": uuid.uuid4().hex[:12]})
        except Exception as exc:  # noqa: BLE001 - a reset that fails is ours, not the agent's
            raise JobInfraFailed(f"the episode could not start ({type(exc).__name__}: {exc})") from exc
        # the live opening is what the env judges against; it equals the dataset row's
        state["prompt"] = [vf.SystemMessage(content=m["content"]) if m["role"] == "system"
                           else vf.UserMessage(content=m["content"])
                           for m in opening(episode.info["messages"], self.tool_format)]
        return state

    async def env_response(self, messages: vf.Messages, state: vf.State, **kwargs: Any) -> vf.Messages:
        episode: Episode = state["ait_episode"]
        message = messages[-1]
        calls = list(getattr(message, "tool_calls", None) or [])
        action = action_text(_text(message.content), [(c.name, c.arguments) for c in calls])
        n_before = len(episode.info["messages"])
        episode.pending = self.executor.submit(episode.env.step, action)
        try:
            obs, _, terminated, truncated, episode.info = await asyncio.wrap_future(episode.pending)
        except Exception as exc:  # noqa: BLE001 - step never raises by contract: this is our bug
            raise JobInfraFailed(f"env.step failed ({type(exc).__name__}: {exc})") from exc
        episode.pending = None
        new = episode.info["messages"][n_before:]
        reply = (tool_replies(calls, new) if calls and self.tool_format == "native"
                 else [vf.UserMessage(content=obs)])
        if terminated or truncated:
            breakdown = episode.info.get("reward") or {}
            state["ait_reward"], state["ait_job"] = breakdown, episode.info.get("job")
            if breakdown.get("drop"):
                raise JobInfraFailed(f"episode {episode.info.get('episode_id')} infra_failed: "
                                     f"{breakdown.get('reason', '')}"[:500])
            state["final_env_response"] = reply
        return reply

    @vf.cleanup
    async def close_episode(self, state: vf.State) -> None:
        """Close the rollout's env (after a step still running, if the rollout timed out meanwhile)."""
        episode: Episode | None = state.pop("ait_episode", None)
        if state.get("timed_out") and state.get("ait_reward") is None and state.get("error") is None:
            state["error"] = JobInfraFailed("the rollout timed out before the episode ended (a slow job or "
                                            "backend); raise the rollout timeout to let jobs finish")
        if episode is None:
            return
        if episode.pending is not None and not episode.pending.done():
            episode.pending.add_done_callback(lambda _: episode.env.close())
        else:
            await self._call(episode.env.close)

    @vf.teardown
    async def close_backend(self) -> None:
        """Close the backend if the wrapper built it (never one it was given)."""
        if self.owns_backend and not self.backend.closed:
            self.backend.close()
        self.executor.shutdown(wait=False)


def _text(content: Any) -> str:
    """A message's text: a string, or the text of its content parts (parts without text, and text that is
    not a string, count as nothing)."""
    if isinstance(content, list):
        parts = (p.get("text", "") if isinstance(p, dict) else getattr(p, "text", "") for p in content)
        return "".join(p for p in parts if isinstance(p, str))
    return content if isinstance(content, str) else ""


def tool_replies(calls: Sequence[Any], new: list[dict[str, Any]]) -> vf.Messages:
    """One ``tool`` message per structured call, under the call's own id, from the env's messages of the
    turn (``new``: its copy of the assistant turn, its tool results, its notes). A call the env did not
    run (it could not parse it) is answered with a pointer to the note; the env's other output (calls
    written as text, notes) follows as one ``user`` message."""
    ran = list((new[0].get("tool_calls") or []) if new else [])
    results = {m["tool_call_id"]: m["content"] for m in new if m.get("role") == "tool"}
    replies: vf.Messages = []
    for call in calls:
        wanted = env_arguments(call.arguments)
        match = next((r for r in ran if r["function"]["name"] == call.name
                      and json.loads(r["function"]["arguments"]) == wanted), None)
        if match is not None:
            ran.remove(match)
        content = results.get(match["id"], "") if match else NOT_RUN
        replies.append(vf.ToolMessage(tool_call_id=call.id, content=content))
    rest = [f"<tool_response>\n{results[r['id']]}\n</tool_response>" for r in ran if r["id"] in results]
    rest += [m["content"] for m in new[1:] if m.get("role") == "user"]
    if rest:
        replies.append(vf.UserMessage(content="\n".join(rest)))
    return replies


def load_environment(backend: str | Backend = "stub", families: str | Sequence[str] = "train",
                     eval_families: str | Sequence[str] = "heldout", num_examples: int = 64,
                     num_eval_examples: int = 8, seed: int = 0,
                     overrides: list[str] | dict[str, Any] | None = None, tool_format: ToolFormat = "native",
                     env_threads: int = 64, unfinished_reward: float = -0.1,
                     **kwargs: Any) -> JobWritingVerifiersEnv:
    """The verifiers environment of ``AIT/JobWriting-v0`` (the entry of env id ``ait-job-writing``).

    ``backend``: a backend name (built here, closed at teardown) or a ``Backend`` instance (shared, never
    closed here). ``overrides``: the env's Hydra overrides (``["env.max_turns=12"]``); the backend's
    settings come from the backend. Train instances are ``seed * 10**6 + k``; eval ones start 500,000
    later. ``kwargs`` go to ``vf.MultiTurnEnv`` (e.g. ``timeout_seconds``)."""
    if vf.__version__ != VERIFIERS_VERSION:
        logger.warning("verifiers %s is installed; this environment is written and tested for verifiers %s "
                       "(prime-rl v0.7.0's pin): pip install verifiers==%s", vf.__version__, VERIFIERS_VERSION,
                       VERIFIERS_VERSION)
    settings = compose(backend=backend if isinstance(backend, str) else "stub", overrides=overrides)
    owns = isinstance(backend, str)
    instance = make_backend(settings.backend, settings.env.runs_path) if owns else backend
    assert isinstance(instance, Backend)
    try:
        if num_examples <= 0 and num_eval_examples <= 0:
            raise ValueError("num_examples and num_eval_examples are both 0: ask for at least one episode")
        base = seed * 10**6
        train = episode_rows(instance, overrides, resolve_families(families), num_examples, base, tool_format)
        held = episode_rows(instance, overrides, resolve_families(eval_families), num_eval_examples,
                            base + 500_000, tool_format)
        return JobWritingVerifiersEnv(
            instance, owns_backend=owns, overrides=overrides, max_turns=settings.env.max_turns,
            tool_format=tool_format, env_threads=env_threads, unfinished_reward=unfinished_reward,
            dataset=Dataset.from_list(train) if train else None,
            eval_dataset=Dataset.from_list(held) if held else None, **kwargs)
    except BaseException:
        if owns:
            instance.close()
        raise
