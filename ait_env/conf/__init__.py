"""The Hydra config groups (``env``, ``family``, ``reward``, ``backend``, and the scripts' own), shipped in
the wheel; ``conf/`` in a checkout links here. :func:`load_group` reads one group's file as a dict, for
every layer that needs a default (the runner, the worker) without composing the env's settings
(:mod:`ait_env.config` does that).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf


class ConfigError(ValueError):
    """A config group or name that does not exist, or settings that do not validate."""


def conf_dir() -> Path:
    """The directory holding the config groups (``conf/`` in a checkout)."""
    return Path(str(resources.files("ait_env.conf")))


def group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (conf_dir() / group).glob("*.yaml"))


def load_group(group: str, name: str) -> dict[str, Any]:
    path = conf_dir() / group / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"no {group} config named {name!r}; available: {', '.join(group_options(group))} "
                          f"(files in {conf_dir() / group})")
    data = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    return dict(data or {})  # type: ignore[arg-type]
