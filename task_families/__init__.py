"""Task families: what the agent is asked to teach. See :mod:`task_families.base` for the contract.

:func:`get_family` returns a family instance by name; :data:`FAMILY_NAMES` lists the registered ones.
"""

from __future__ import annotations

import importlib
from functools import lru_cache

from task_families.base import TaskFamily

FAMILY_NAMES: tuple[str, ...] = ("arithmetic", "persona", "units", "calendar", "inventory", "triage")


@lru_cache(maxsize=None)
def get_family(name: str) -> TaskFamily:
    if name not in FAMILY_NAMES:
        raise KeyError(f"unknown task family {name!r}; known families: {', '.join(FAMILY_NAMES)}")
    module = importlib.import_module(f"task_families.{name}.family")
    return module.FAMILY
