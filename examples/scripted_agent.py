"""Run one episode with the scripted reference agent through the public gym API.

    python examples/scripted_agent.py [--family arithmetic] [--backend stub]
"""

from __future__ import annotations

import argparse
import json

import gymnasium as gym

import ait_env  # noqa: F401  (registers AIT/JobWriting-v0)
from ait_env.agents.reference import ScriptedReferenceAgent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--family", default="arithmetic")
    ap.add_argument("--backend", default="stub")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    env = gym.make("AIT/JobWriting-v0", family=args.family, backend=args.backend)
    agent = ScriptedReferenceAgent()
    obs, info = env.reset(seed=args.seed)
    agent.reset(info)
    done = False
    while not done:
        action = agent.act(obs, info)
        obs, reward, terminated, truncated, info = env.step(action)
        print(f"--- turn {info['turn']} ---\n{obs[:600]}")
        done = terminated or truncated
    print("reward breakdown:", json.dumps(info["reward"], indent=1))
    env.close()


if __name__ == "__main__":
    main()
