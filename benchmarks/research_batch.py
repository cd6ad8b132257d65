"""A research episode's batch on the local backend: three short jobs (an lr sweep of the arithmetic reference
job, ``--steps`` steps each) run at once with ``submit_jobs``, against the same three jobs run one after
another (``submit_job`` each, in a second episode). Prints both wall clocks, their ratio, and each episode's
reward against the formula ``max_k R_k - charge``.

    python benchmarks/research_batch.py [--steps 3] [--family arithmetic] [--parallel 3]

Real training (ait-tiny-m); the job cache is off so nothing is served twice; ``--parallel`` is the local
backend's ``max_parallel_jobs``. Writes ``runs/benchmarks/research_batch.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym

import ait_env  # noqa: F401  (registers AIT/JobWriting-v0)
from ait_env.agents.reference import lr_sweep, tool_call, with_steps
from ait_env.backends import make_backend
from ait_env.config import compose
from task_families import reference_files


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--family", default="arithmetic")
    ap.add_argument("--parallel", type=int, default=3)
    ap.add_argument("--runs", type=Path, default=Path("runs/benchmarks/research_batch"))
    args = ap.parse_args(argv)
    from ait_env.hidden.secrets import default_hidden_seeds

    seeds = default_hidden_seeds("published")   # the docs' figures; AIT_HIDDEN_SEEDS=private for your own sets
    print(f"hidden-eval seeds: {seeds.label}", file=sys.stderr)
    overrides = {"env": {"runs_dir": str(args.runs), "max_jobs_per_episode": 3},
                 "backend": {"options": {"max_parallel_jobs": args.parallel, "eval_every": 0}}}
    settings = compose(backend="local", overrides=overrides)
    files = reference_files(args.family, "ait-tiny-m", "local")
    files["job.toml"] = with_steps(files["job.toml"], args.steps)
    sweep = lr_sweep(files)
    folders = sorted({p.split("/")[0] for p in sweep})
    out: dict[str, Any] = {"steps": args.steps, "family": args.family, "max_parallel_jobs": args.parallel}
    with make_backend(settings.backend, settings.env.runs_dir) as backend:
        for mode in ("batch", "sequential"):
            env = gym.make("AIT/JobWriting-v0", family=args.family, backend=backend, overrides=overrides)
            env.reset(seed=0, options={"family": args.family, "instance": 0})
            env.step("".join(tool_call("write_file", path=k, content=v) for k, v in sweep.items()))
            t0 = time.time()
            if mode == "batch":
                obs, r, term, trunc, info = env.step(tool_call("submit_jobs", folders=folders))
            else:
                for f in folders:
                    obs, r, term, trunc, info = env.step(tool_call("submit_jobs", folders=[f]))
            wall = time.time() - t0
            b = info["reward"]
            totals = [j["total"] for j in b["jobs"]]
            formula = max(totals) - b["charge"]
            out[mode] = {"wall_s": round(wall, 1), "job_wall_s": [round(j["wall_seconds"], 1) for j in info["jobs"]],
                         "reward": r, "job_rewards": totals, "charge": b["charge"], "formula": formula,
                         "end": b["end"], "status": b["status"], "posts": [j["post"] for j in b["jobs"]]}
            print(mode, json.dumps(out[mode]), flush=True)
            env.close()
    out["batch_over_sequential"] = round(out["batch"]["wall_s"] / out["sequential"]["wall_s"], 3)
    out["batch_over_longest_job"] = round(out["batch"]["wall_s"] / max(out["sequential"]["job_wall_s"]), 3)
    args.runs.mkdir(parents=True, exist_ok=True)
    (args.runs / "research_batch.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: out[k] for k in ("batch_over_sequential", "batch_over_longest_job")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
