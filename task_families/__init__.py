"""Task families: what the agent is asked to teach. See :mod:`task_families.base` for the contract.

:func:`get_family` returns a family instance by name; :data:`FAMILY_NAMES` lists the registered ones;
:func:`reference_files` is a family's reference job (``<family>/reference/``), the yardstick job.
"""

from __future__ import annotations

import importlib
from functools import lru_cache
from pathlib import Path

from task_families.base import TaskFamily

FAMILY_NAMES: tuple[str, ...] = ("arithmetic", "persona", "units", "calendar", "inventory", "triage", "warehouse")


@lru_cache(maxsize=None)
def get_family(name: str) -> TaskFamily:
    if name not in FAMILY_NAMES:
        raise KeyError(f"unknown task family {name!r}; known families: {', '.join(FAMILY_NAMES)}")
    module = importlib.import_module(f"task_families.{name}.family")
    return module.FAMILY


def reference_files(family: str, base_model: str, backend: str | None = None) -> dict[str, str]:
    """The reference job's files for ``family`` with ``base_model`` filled in.

    A competent engineer sizes the job for the hardware: ``job.<backend>.toml`` (e.g. ``job.local.toml``
    for the tiny CPU models) replaces ``job.toml`` when it exists."""
    root = Path(__file__).parent / family / "reference"
    if not root.is_dir():
        raise FileNotFoundError(f"family {family!r} has no reference job ({root})")
    out = {}
    for p in sorted(root.iterdir()):
        if p.is_file() and not p.name.startswith(".") and p.suffix in (".py", ".toml", ".md") \
                and not (p.suffix == ".toml" and p.name != "job.toml"):
            out[p.name] = p.read_text(encoding="utf-8").replace("{base_model}", base_model)
    variant = root / f"job.{backend}.toml"
    if backend and variant.is_file():
        out["job.toml"] = variant.read_text(encoding="utf-8").replace("{base_model}", base_model)
    return out
