"""The scripted reference agent's episode rewards on one family and backend, seed by seed: the yardstick an
LLM agent's evaluation is held against (``trainers/local_llm.py``'s evaluations play the same seeds, 0..N-1, with
the installation's hidden seeds and the LLM trainer's turn limit).

    python benchmarks/reference_agent_scores.py --family triage --backend stub --episodes 6
    python benchmarks/reference_agent_scores.py --family triage --backend local --episodes 4   # real jobs: minutes each

Prints one line per episode (seed, status, reward) and the mean with its 95% CI. The stub backend's rewards are
its surrogate formula (nothing trained)."""

from __future__ import annotations

import argparse
import tempfile

import gymnasium as gym

import ait_env  # noqa: F401  (registers AIT/JobWriting-v0)
from ait_env.agents.reference import ScriptedReferenceAgent
from ait_env.observe.metrics import mean_ci


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", default="triage")
    ap.add_argument("--backend", default="stub")
    ap.add_argument("--episodes", type=int, default=6, help="seeds 0..N-1")
    ap.add_argument("--max-turns", type=int, default=8, help="the env's turn limit (the LLM trainer's: 8)")
    args = ap.parse_args(argv)
    rewards = []
    with tempfile.TemporaryDirectory() as runs:
        env = gym.make("AIT/JobWriting-v0", family=args.family, backend=args.backend,
                       overrides={"env": {"runs_dir": runs, "max_turns": args.max_turns}})
        try:
            for seed in range(args.episodes):
                agent = ScriptedReferenceAgent()
                obs, info = env.reset(seed=seed, options={"family": args.family})
                agent.reset(info)
                done = False
                while not done:
                    obs, _, terminated, truncated, info = env.step(agent.act(obs, info))
                    done = terminated or truncated
                r = info["reward"]
                rewards.append(float(r["total"]))
                print(f"{args.family} seed {seed}: {r['status']} reward {r['total']:.3f}", flush=True)
        finally:
            env.close()
    mean, half = mean_ci(rewards)
    print(f"reference agent on {args.family} ({args.backend}{', SURROGATE' if args.backend == 'stub' else ''}): "
          f"mean {mean:.3f} ± {half or 0:.3f} over {len(rewards)} episodes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
