"""Secret seeds of the hidden eval sets, and the sets themselves.

Seeds come from a JSON file ``{"<family>": <int>, ...}`` named by ``$AIT_SECRETS_FILE`` (or
``~/.config/ai-trains-ai/secrets.json`` when it exists); the orchestrator reads it, and it is never
copied into a workspace, a job bundle or the sandbox. Without such a file the **published default
seeds** below are used: they make the pinned baselines reproducible, but anyone who reads this
source can regenerate those hidden sets. For a private hidden eval, create the file (mode 0600)
with your own seeds and reseed the baselines (``scripts/seed_baselines.py``); every baseline
records the hash of the hidden set it was measured on.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path

from task_families import get_family
from task_families.base import Instance, instances_hash

#: Published default seeds (see the module docstring).
DEFAULT_SEEDS: dict[str, int] = {
    "arithmetic": 90_210_001, "persona": 90_210_002, "units": 90_210_003,
    "calendar": 90_210_004, "inventory": 90_210_005, "triage": 90_210_006, "warehouse": 90_210_007,
}


def secrets_path() -> Path | None:
    env = os.environ.get("AIT_SECRETS_FILE")
    if env:
        p = Path(env).expanduser()
        if not p.is_file():
            raise FileNotFoundError(f"AIT_SECRETS_FILE={env} does not exist; create it as a JSON object "
                                    '{"<family>": <int seed>, ...} or unset the variable.')
        return p
    p = Path("~/.config/ai-trains-ai/secrets.json").expanduser()
    return p if p.is_file() else None


def hidden_seed(family: str) -> int:
    path = secrets_path()
    if path is not None:
        data = json.loads(path.read_text())
        if family in data:
            return int(data[family])
    if family not in DEFAULT_SEEDS:
        raise KeyError(f"no hidden seed for family {family!r}: add it to the secrets file or DEFAULT_SEEDS")
    return DEFAULT_SEEDS[family]


@lru_cache(maxsize=64)
def _hidden_set(family: str, seed: int) -> tuple[Instance, ...]:
    return tuple(get_family(family).hidden_eval(seed))


def hidden_set(family: str) -> list[Instance]:
    """The hidden eval instances of ``family`` (orchestrator side only)."""
    return list(_hidden_set(family, hidden_seed(family)))


def hidden_keys(family: str) -> set[str]:
    """Question keys of the hidden set (:attr:`Instance.key`), e.g. to keep them out of a corpus."""
    return {inst.key for inst in hidden_set(family)}


def hidden_questions(family: str) -> list[str]:
    """The hidden set's question texts, for the probe's leak check (outside the sandbox)."""
    return [inst.question for inst in hidden_set(family)]


def hidden_set_hash(family: str) -> str:
    """Which hidden set a score was measured on (:func:`task_families.base.instances_hash`)."""
    return instances_hash(hidden_set(family))
