"""``AIT/JobWriting-v0`` as a verifiers **v1** environment (verifiers 0.4.0, the API prime-rl's current releases
train on): the env id ``ait-job-writing-v1`` is the package ``environments/ait_job_writing_v1``, which
re-exports :class:`JobWritingTaskset` and :class:`JobWritingEnvV1` from here. The classic (verifiers 0.2.0,
prime-rl v0.7.0) adapter is :mod:`ait_env.integrations.verifiers_env`; both are thin over one episode, the gym
env's (:mod:`ait_env.integrations.episode_rows`). Which path to choose: ``docs/verifiers.md``.

Contract (verifiers 0.4.0, read in its wheel: ``verifiers/v1/env.py`` ``Env.run``/``start``/``stop``,
``task.py`` ``TaskData``/``Task.with_data``, ``agent.py`` ``Agent.interaction``/``Interaction.turn``,
``trace.py`` ``record_reward``/``record_metric``, ``utils/loaders.py`` ``_import_plugin``/``_plugin_class``):

- **Tasks** (:class:`JobWritingTaskset`, loaded where the runner is, e.g. prime-rl's orchestrator): one per
  (family, instance), cycling through ``families`` (``train``, ``heldout``, ``all`` or names), instance seeds
  ``seed * 10**6 + k // len(families)``. A task carries only its family and instance (``JobWritingData``);
  the task text depends on the backend, so it is written at the episode's start, where the env runs.
- **One gym env per episode** (:meth:`JobWritingEnvV1.run`), on the env's **one backend** (built in ``start``
  from ``backend`` and ``overrides``, closed in ``stop``): ``reset`` writes the system prompt and the task
  (the task's data is updated with them, so the trace records what the model saw); the model speaks first;
  each reply is the env's text action (``<tool_call>`` blocks, the env's text tool format); each observation
  is the next user turn, until the env ends the episode or the agent's limits do (``agent.max_turns``, its
  token budget). Blocking env calls run in a thread, never on the event loop.
- **Reward**: ``ait_reward`` (weight 1) is the env's ``info["reward"]["total"]``; metrics ``ait_scored``,
  ``ait_validated``, ``ait_attempts``. An episode the agent's limits stop before the env ends gets
  ``unfinished_reward`` (default -0.1, as one without a parsable submission). **Missing is not zero**: an
  ``infra_failed`` episode raises :class:`JobInfraFailed` in ``run``, which verifiers records in
  ``episode.errors`` (``ok`` false): prime-rl does not train on it and can retry it (``--env.retries``).
- **Tools in text**: the agent's harness should declare no tools of its own (``harness.id = "null"``, the
  default of :class:`JobWritingEnvV1Config`); the env's six tools are written in the system prompt and called
  as text. Trainers whose renderer turns ``<tool_call>`` text into structured calls (prime-rl's Qwen3
  renderer) need the plain renderer (``[orchestrator.renderer] name = "default"``; docs/verifiers.md).
- **The jobs' own stack**: the agent's ``environment.py`` is validated in the sandbox with the pinned inner
  stack (verifiers 0.2.0); in a venv with verifiers 0.4.0, ``inner_python`` names an interpreter that has it
  (the project's ``.venv/bin/python``; the same as the override ``env.probe.sandbox.python``).
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import gymnasium as gym
import verifiers

#: the verifiers release this adapter is written and tested for
VERIFIERS_V1_VERSION = "0.4.0"
if verifiers.__version__ != VERIFIERS_V1_VERSION:
    raise ImportError(f"ait_env.integrations.verifiers_v1_env needs verifiers {VERIFIERS_V1_VERSION} (found "
                      f"{verifiers.__version__}): install it in a venv of its own, apart from the inner stack's 0.2.0 "
                      "(pip install -e '.[vf1]' -e environments/ait_job_writing_v1; bash scripts/test_verifiers_v1.sh)")

import verifiers.v1 as vf  # noqa: E402

from ait_env.backends import Backend, backend_factory  # noqa: E402
from ait_env.config import compose  # noqa: E402
from ait_env.integrations.episode_rows import GYM_ID, resolve_families  # noqa: E402

__all__ = ["ENV_ID", "JobInfraFailed", "JobWritingData", "JobWritingEnvV1", "JobWritingEnvV1Config",
           "JobWritingTask", "JobWritingTaskset", "JobWritingTasksetConfig"]

ENV_ID = "ait-job-writing-v1"
logger = logging.getLogger(__name__)


class JobInfraFailed(RuntimeError):
    """The episode could not be scored because our side failed (``infra_failed``): the episode fails (not 0)."""


class JobWritingData(vf.TaskData):
    """One episode: a family and its instance seed (the task text is written by ``reset``)."""

    family: str
    instance: int


class JobWritingTask(vf.Task[JobWritingData]):
    """The env's episode; :meth:`JobWritingEnvV1.run` records its rewards."""


class JobWritingTasksetConfig(vf.TasksetConfig):
    families: str = "train"
    num_tasks: int = 64
    seed: int = 0


class JobWritingTaskset(vf.Taskset[JobWritingTask, JobWritingTasksetConfig]):
    """Tasks of ``AIT/JobWriting-v0`` (module docstring)."""

    def load(self) -> list[JobWritingTask]:
        families = resolve_families(self.config.families)
        if self.config.num_tasks <= 0:
            raise ValueError("num_tasks must be at least 1")
        base = self.config.seed * 10**6
        return [JobWritingTask(JobWritingData(idx=k, family=families[k % len(families)],
                                              instance=base + k // len(families)), self.config.task)
                for k in range(self.config.num_tasks)]


class JobWritingEnvV1Config(vf.EnvConfig):
    #: the agent's harness declares no tools: the env's tools are written in its system prompt
    agent: vf.AgentConfig = vf.AgentConfig(harness={"id": "null"})
    backend: str = "stub"
    #: "module:Class" of a custom backend built as Class(settings, runs_dir) (default: the backend by its name)
    backend_factory: str | None = None
    #: the gym env's Hydra overrides (a dict, e.g. {"env": {"max_turns": 12}})
    overrides: dict[str, Any] = {}
    #: a Python with the inner stack (verifiers 0.2.0: the project's .venv) for the probe's sandbox, which runs the
    #: agent's environment.py (the same as overrides env.probe.sandbox.python; default: this interpreter)
    inner_python: str | None = None
    unfinished_reward: float = -0.1
    #: env calls (reset, step) at once, across this env's concurrent episodes
    env_threads: int = 16


class JobWritingEnvV1(vf.Env[JobWritingEnvV1Config]):
    """``AIT/JobWriting-v0`` played by one agent (module docstring)."""

    _backend: Backend | None = None
    _slots: asyncio.Semaphore | None = None
    _gym_overrides: dict[str, Any] | None = None

    def _overrides(self) -> dict[str, Any] | None:
        over = dict(self.config.overrides or {})
        if self.config.inner_python:   # absolute, not resolved: a venv's python is a link to its base interpreter
            env = dict(over.get("env") or {})
            probe = dict(env.get("probe") or {})
            probe["sandbox"] = {**dict(probe.get("sandbox") or {}), "python": os.path.abspath(self.config.inner_python)}
            over["env"] = {**env, "probe": probe}
        return over or None

    async def start(self) -> None:
        self._gym_overrides = self._overrides()
        settings = compose(backend=self.config.backend, overrides=self._gym_overrides)
        build = backend_factory(self.config.backend_factory)
        self._backend = await asyncio.to_thread(build, settings.backend, settings.env.runs_path)
        self._slots = asyncio.Semaphore(max(1, self.config.env_threads))

    async def stop(self) -> None:
        backend, self._backend = self._backend, None
        if backend is not None:
            await asyncio.to_thread(backend.close)

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        assert self._slots is not None, "the env is not started (use env.serving())"
        async with self._slots:
            return await asyncio.to_thread(fn, *args, **kwargs)

    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        if self._backend is None:
            raise RuntimeError("the env is not started (use env.serving())")
        data = task.data
        env = gym.make(GYM_ID, backend=self._backend, overrides=self._gym_overrides)
        try:
            _, info = await self._call(env.reset, seed=data.instance,
                                       options={"family": data.family, "instance": data.instance})
            system, prompt = info["messages"][0]["content"], info["messages"][1]["content"]
            task = task.with_data(system_prompt=system, prompt=prompt)
            done, info = False, {}
            async with agents.agent.interaction(task) as interaction:
                segment = await interaction.turn()
                while not segment.terminated:
                    obs, _, terminated, truncated, info = await self._call(env.step, segment.last_reply or "")
                    done = terminated or truncated
                    if done:
                        break
                    segment = await interaction.turn(obs)
            self._record(interaction.trace, info if done else None)
        finally:
            await self._call(env.close)

    def _record(self, trace: Any, info: dict[str, Any] | None) -> None:
        breakdown = (info or {}).get("reward")
        if not breakdown:   # the agent's limits ended it first: like an episode without a parsable submission
            trace.record_reward("ait_reward", self.config.unfinished_reward, 1.0)
            trace.record_metric("ait_unfinished", 1.0)
            return
        if breakdown.get("drop"):
            raise JobInfraFailed(f"infra_failed: {breakdown.get('reason') or 'our side failed'} (not the agent's "
                                 "failure: the episode is dropped, never scored 0)")
        trace.record_reward("ait_reward", float(breakdown.get("total") or 0.0), 1.0)
        trace.record_metric("ait_scored", float(breakdown.get("status") == "scored"))
        trace.record_metric("ait_validated", float(breakdown.get("validated_attempt") is not None))
        trace.record_metric("ait_attempts", float(breakdown.get("attempts") or 0))

