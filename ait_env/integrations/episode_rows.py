"""The episode as rows for RL libraries, with no RL library imported: the family names a spec means
(:func:`resolve_families`), an episode's opening as the model sees it (:func:`opening`) and one row per
(family, instance) (:func:`episode_rows`). Shared by the verifiers 0.2.0 adapter
(:mod:`ait_env.integrations.verifiers_env`) and the verifiers v1 one (:mod:`ait_env.integrations.verifiers_v1_env`):
two thin adapters over one episode, the gym env's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import gymnasium as gym

import ait_env  # noqa: F401  (registers AIT/JobWriting-v0)
from ait_env.backends import Backend
from ait_env.config import split_families
from ait_env.episode.spec import strip_tool_sections
from task_families import FAMILY_NAMES

GYM_ID = "AIT/JobWriting-v0"
ToolFormat = Literal["native", "text"]


def resolve_families(spec: str | Sequence[str]) -> list[str]:
    """``"train"`` (families not held out), ``"heldout"``, ``"all"``, ``"a,b"`` or a list of names."""
    train, held = split_families(FAMILY_NAMES)
    named = {"train": train, "heldout": held, "all": list(FAMILY_NAMES)}
    if isinstance(spec, str):
        if spec in named:
            return list(named[spec])
        spec = [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [f for f in spec if f not in FAMILY_NAMES]
    if unknown or not spec:
        raise ValueError(f"families: unknown {unknown or spec!r}; use 'train', 'heldout', 'all' or names "
                         f"from {list(FAMILY_NAMES)}")
    return list(spec)


def opening(messages: list[dict[str, Any]], tool_format: ToolFormat) -> list[dict[str, Any]]:
    """The episode's first two messages as the model sees them (native tools: no text tool sections)."""
    system, task = messages[0]["content"], messages[1]["content"]
    if tool_format == "native":
        system = strip_tool_sections(system)
    return [{"role": "system", "content": system}, {"role": "user", "content": task}]


def episode_rows(backend: Backend, overrides: Any, families: list[str], n: int, first_instance: int,
                 tool_format: ToolFormat) -> list[dict[str, Any]]:
    """``n`` rows cycling through ``families``; instance seeds ``first_instance + k // len(families)``.
    Each prompt comes from a real ``reset`` (cheap: no job runs)."""
    if n <= 0:
        return []
    env = gym.make(GYM_ID, backend=backend, overrides=overrides)
    try:
        rows = []
        for k in range(n):
            family, instance = families[k % len(families)], first_instance + k // len(families)
            _, info = env.reset(seed=instance, options={"family": family, "instance": instance})
            rows.append({"prompt": opening(info["messages"], tool_format),
                         "info": {"family": family, "instance": instance}})
        return rows
    finally:
        env.close()
