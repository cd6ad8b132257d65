"""Median wall time of non-submit tool steps through ``env.step`` (goal: <= 1 ms).

    python benchmarks/bench_tool_step.py [--n 500]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time

import gymnasium as gym

import ait_env  # noqa: F401


def call(name: str, **args: str) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--episode-turns", type=int, default=25,
                    help="reset after this many steps (a realistic episode length; info carries the transcript)")
    args = ap.parse_args()
    from ait_env.hidden.secrets import default_hidden_seeds

    seeds = default_hidden_seeds("published")   # the docs' figures; AIT_HIDDEN_SEEDS=private for your own sets
    print(f"hidden-eval seeds: {seeds.label}", file=sys.stderr)
    runs = tempfile.mkdtemp(prefix="ait-bench-")
    env = gym.make("AIT/JobWriting-v0", family="arithmetic", backend="stub",
                   overrides={"env": {"runs_dir": runs, "max_turns": 10**6}})
    env.reset(seed=0)
    body = "x = 1\n" * 200

    def actions(i: int) -> dict[str, str]:
        return {
            "read_file": call("read_file", path="environment.py"),
            "write_file": call("write_file", path="notes.py", content=f"marker_{i} = 0\n" + body),
            "edit_file": call("edit_file", path="notes.py", old_text=f"marker_{i} = 0", new_text=f"done_{i} = 1"),
            "list_files": call("list_files"),
            "get_baseline_scores": call("get_baseline_scores"),
        }

    times: dict[str, list[float]] = {k: [] for k in actions(0)}
    steps = 0
    for i in range(args.n):
        if steps >= args.episode_turns:
            env.reset(seed=i)
            steps = 0
        for name, action in actions(i).items():
            steps += 1
            t0 = time.perf_counter()
            obs, *_ = env.step(action)
            times[name].append(time.perf_counter() - t0)
            assert "error" not in obs[:40], obs
    all_t = [t for v in times.values() for t in v]
    print(f"{'tool':22s} {'median ms':>10s} {'p90 ms':>8s}")
    for name, ts in times.items():
        ts_sorted = sorted(ts)
        print(f"{name:22s} {statistics.median(ts) * 1e3:10.3f} {ts_sorted[int(0.9 * len(ts)) - 1] * 1e3:8.3f}")
    med = statistics.median(all_t) * 1e3
    print(f"{'all non-submit steps':22s} {med:10.3f}   (goal <= 1 ms: {'met' if med <= 1 else 'NOT met'})")
    env.close()


if __name__ == "__main__":
    main()
