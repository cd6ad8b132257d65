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


DATA_DIR_ENV = "AIT_DATA_DIR"


def data_dir() -> Path:
    """The per-user data folder: ``$AIT_DATA_DIR``, else ``$XDG_DATA_HOME/ai-trains-ai``, else
    ``~/.local/share/ai-trains-ai`` (like the model cache, ``$AIT_CACHE_DIR``, it does not depend on the
    folder a script runs in)."""
    import os

    if os.environ.get(DATA_DIR_ENV):
        return Path(os.environ[DATA_DIR_ENV]).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME")
    return (Path(xdg).expanduser() if xdg else Path("~/.local/share").expanduser()) / "ai-trains-ai"


def default_runs_dir() -> Path:
    """Where runs write (job bundles, results, the cost ledger) unless ``env.runs_dir`` says otherwise:
    ``<data_dir>/runs``."""
    return data_dir() / "runs"


def baselines_dir() -> Path:
    """The per-user store of measured baselines (``<data_dir>/baselines/<backend>.json``): shared by every
    run and script of this user, so a baseline measured once on this machine's build is read everywhere."""
    return data_dir() / "baselines"
