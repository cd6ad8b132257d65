"""ai-trains-ai: a Gymnasium environment in which an LLM agent writes RL training jobs.

Importing this package registers ``AIT/JobWriting-v0`` (``nondeterministic=True``: jobs run on real
backends and infos carry ids and timings) by entry-point string and imports nothing else of it::

    import gymnasium as gym
    import ait_env  # noqa: F401  (registers the env)
    env = gym.make("AIT/JobWriting-v0", family="arithmetic", backend="stub")
"""

from __future__ import annotations

from ait_env.extras import install_excepthook

install_excepthook()  # an entry point of this repository missing an extra: one line, exit 3 (ait_env/extras.py)

from typing import Any  # noqa: E402

import gymnasium as gym  # noqa: E402

__all__ = ["JobWritingEnv", "ENV_ID"]
__version__ = "0.1.0"

ENV_ID = "AIT/JobWriting-v0"

# by entry-point string, as gymnasium's own root registers its envs: importing the package (or any module in
# it, e.g. the job contracts in ait_env.jobs) loads no env, backend, probe or episode module
if ENV_ID not in gym.registry:
    gym.register(id=ENV_ID, entry_point="ait_env.env:JobWritingEnv", nondeterministic=True)


def __getattr__(name: str) -> Any:  # ``from ait_env import JobWritingEnv`` imports the env on first use
    if name == "JobWritingEnv":
        from ait_env.env import JobWritingEnv

        return JobWritingEnv
    raise AttributeError(f"module 'ait_env' has no attribute {name!r}")
