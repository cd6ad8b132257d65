"""A random agent: mixes random strings with random (often invalid) tool calls until the episode ends.

    python examples/random_agent.py [--episodes 3] [--family train]
"""

from __future__ import annotations

import argparse
import json
import random

import gymnasium as gym

import ait_env  # noqa: F401
from ait_env.episode.tools import TOOL_NAMES


def random_action(rng: random.Random, env: gym.Env) -> str:
    kind = rng.random()
    if kind < 0.3:
        return env.action_space.sample()
    name = rng.choice(TOOL_NAMES)
    args = {"path": rng.choice(["job.toml", "environment.py", "../etc/passwd", "/abs", "new.txt"]),
            "content": "x" * rng.randint(0, 50), "old_text": "x", "new_text": "y"}
    keep = rng.sample(list(args), rng.randint(0, len(args)))
    return "<tool_call>" + json.dumps({"name": name, "arguments": {k: args[k] for k in keep}}) + "</tool_call>"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--episodes", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--family", default="train", help="a task family, or 'train' (a training family per episode)")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    env = gym.make("AIT/JobWriting-v0", backend="stub", family=args.family)
    env.action_space.seed(args.seed)
    for ep in range(args.episodes):
        obs, info = env.reset(seed=args.seed + ep)
        done, total = False, 0.0
        while not done:
            obs, reward, terminated, truncated, info = env.step(random_action(rng, env))
            total += reward
            done = terminated or truncated
        print(f"episode {ep}: turns={info['turn']} status={info['reward']['status']} reward={total:+.3f}")
    env.close()


if __name__ == "__main__":
    main()
