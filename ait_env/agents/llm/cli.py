"""``python -m ait_env.agents.llm``: the command line over :func:`ait_env.agents.llm.run` (the contract and the
flags: :mod:`ait_env.agents.llm`)."""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

import ait_env.agents.llm as package
from ait_env.agents.llm.batch import ResumeMismatch, family_list, run
from ait_env.agents.llm.client import AgentSettings
from ait_env.hidden.secrets import default_hidden_seeds
from ait_env.observe.metrics import Prices


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ait_env.agents.llm", description=(package.__doc__ or "").split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", required=True, help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")
    ap.add_argument("--model", required=True)
    ap.add_argument("--api-key-env", default="OPENAI_API_KEY",
                    help="environment variable holding the API key (unset: 'none', fine for local servers)")
    ap.add_argument("--families", default="train", help="train (default), all, or a comma-separated list")
    ap.add_argument("--episodes", type=int, default=4, help="episodes per family")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--backend", default="stub", help="stub (surrogate scores, instant) or local (real training)")
    ap.add_argument("--tool-mode", choices=["auto", "native", "text"], default="auto")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--max-retries", type=int, default=6)
    ap.add_argument("--timeout", type=float, default=300.0,
                    help="seconds one attempt may take from its start to the last byte of the answer")
    ap.add_argument("--price-in", type=float, default=0.0, help="USD per million prompt tokens")
    ap.add_argument("--price-out", type=float, default=0.0, help="USD per million completion tokens")
    ap.add_argument("--prices-as-of", default="", help="the date the prices were read (recorded with each cost)")
    ap.add_argument("--max-jobs", type=int, default=1,
                    help="jobs per episode (env.max_jobs_per_episode); above 1: research episodes, with the "
                    "submit_jobs and finish tools")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hidden-seeds", choices=["private", "published"],
                    help="the hidden eval's seeds (default: $AIT_HIDDEN_SEEDS, else private: this installation's "
                    "own; published: the public ones, to reproduce pinned figures)")
    ap.add_argument("--out", type=Path, help="default: runs/llm/<model>-<backend>")
    ap.add_argument("--resume", action="store_true",
                    help="keep the episodes an interrupted run with the same settings wrote to --out; play the rest")
    args = ap.parse_args(argv)
    seeds = default_hidden_seeds("private", args.hidden_seeds)   # before any job runner starts: inherited
    if (args.price_in or args.price_out) and not args.prices_as_of:
        raise SystemExit("--prices-as-of is required with --price-in/--price-out (prices change; record when)")
    prices = Prices.from_dict({"prefill": args.price_in, "cached_prefill": args.price_in, "sample": args.price_out,
                               "train": 0.0, "as_of": args.prices_as_of, "source": "command line"})
    agent = AgentSettings(base_url=args.base_url, model=args.model, api_key=os.environ.get(args.api_key_env) or "none",
                          tool_mode=args.tool_mode, temperature=args.temperature, max_tokens=args.max_tokens,
                          max_retries=args.max_retries, timeout_s=args.timeout, prices=prices)
    out = args.out or Path("runs") / "llm" / re.sub(r"[^\w.-]+", "_", f"{args.model}-{args.backend}")
    try:
        rows = run(agent, family_list(args.families), args.episodes, backend=args.backend, out=out,
                   concurrency=args.concurrency, seed=args.seed, resume=args.resume,
                   overrides={"env": {"max_jobs_per_episode": args.max_jobs}} if args.max_jobs > 1 else None)
    except ResumeMismatch as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print((out / "results.md").read_text(), end="")  # the same title and table as results.md and results.png
    print(f"results: {out}/results.md, results.json, results.png, episodes.jsonl (hidden_seeds {seeds.label})",
          file=sys.stderr)
    if not rows["all"]["kept"]:
        status = ", ".join(f"{k} {v}" for k, v in sorted(rows["all"]["status"].items()))
        print(f"error: no episode was scored ({status}): nothing measured the agent; the episodes' errors are "
              f"in {out}/episodes.jsonl (check --base-url, --model and the API key in ${args.api_key_env})",
              file=sys.stderr)
        return 1
    return 0
