"""ai-trains-ai: a Gymnasium environment in which an LLM agent writes RL training jobs.

Importing this package registers ``AIT/JobWriting-v0`` (``nondeterministic=True``: jobs run on real
backends and infos carry ids and timings)::

    import gymnasium as gym
    import ait_env  # noqa: F401  (registers the env)
    env = gym.make("AIT/JobWriting-v0", family="arithmetic", backend="stub")
"""

from __future__ import annotations

from ait_env.extras import install_excepthook

install_excepthook()  # an entry point of this repository missing an extra: one line, exit 3 (ait_env/extras.py)

import gymnasium as gym  # noqa: E402

from ait_env.env import JobWritingEnv  # noqa: E402

__all__ = ["JobWritingEnv", "ENV_ID"]
__version__ = "0.1.0"

ENV_ID = "AIT/JobWriting-v0"

if ENV_ID not in gym.registry:
    gym.register(id=ENV_ID, entry_point="ait_env.env:JobWritingEnv", nondeterministic=True)
