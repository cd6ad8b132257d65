"""Wall time per instance of the hidden-eval harness against the scripted OpenAI server.

The server replays correct solutions (``correct_policy``), so every instance runs its full tool loop
(arithmetic: 3-6 requests). This measures the harness's own overhead (HTTP client, tool execution,
bookkeeping); a real model adds its latency on top, which ``--latency`` simulates per request.

    python benchmarks/bench_eval.py [--family arithmetic] [--concurrency 1 8 32] [--latency 0.0]
                                    [--server thread|process] [--limit N]

``--server thread`` (default) runs the server in a thread of this process, so client and server share
one GIL; ``--server process`` gives it its own process (closer to a real endpoint).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ait_env.hidden.evaluation import evaluate  # noqa: E402
from ait_env.hidden.secrets import hidden_set  # noqa: E402
from tests.fakes.openai_server import ScriptedOpenAIServer, correct_policy, slow_policy  # noqa: E402


def _policy(family: str, latency: float):
    policy = correct_policy(family)
    return slow_policy(policy, latency) if latency > 0 else policy


def _serve(family: str, latency: float, conn) -> None:  # child process
    with ScriptedOpenAIServer(_policy(family, latency)) as server:
        conn.send(server.base_url)
        conn.recv()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", default="arithmetic")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--latency", type=float, default=0.0, help="simulated model latency per request (s)")
    ap.add_argument("--server", choices=["thread", "process"], default="thread")
    ap.add_argument("--limit", type=int, default=None, help="default: the whole hidden set")
    args = ap.parse_args()
    from ait_env.hidden.secrets import default_hidden_seeds

    seeds = default_hidden_seeds("published")   # the docs' figures; AIT_HIDDEN_SEEDS=private for your own sets
    print(f"hidden-eval seeds: {seeds.label}", file=sys.stderr)

    n = len(hidden_set(args.family)[: args.limit])
    proc = server = parent = None
    if args.server == "process":
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_serve, args=(args.family, args.latency, child), daemon=True)
        proc.start()
        base_url = parent.recv()
    else:
        server = ScriptedOpenAIServer(_policy(args.family, args.latency)).start()
        base_url = server.base_url
    try:
        evaluate(args.family, base_url=base_url, model="bench", limit=min(n, 64), concurrency=32)  # warm-up
        print(f"family={args.family} n={n} server={args.server} latency={args.latency * 1000:.0f} ms/request")
        print(f"{'concurrency':>11} {'wall s':>8} {'ms/instance':>12} {'requests':>9} {'req/s':>8} {'score':>6}")
        for c in args.concurrency:
            t0 = time.perf_counter()
            res = evaluate(args.family, base_url=base_url, model="bench", limit=args.limit, concurrency=c)
            wall = time.perf_counter() - t0
            requests = sum(r.turns for r in res.records)
            print(f"{c:>11} {res.wall_seconds:>8.2f} {1000 * res.seconds_per_instance:>12.2f} {requests:>9} "
                  f"{requests / wall:>8.0f} {res.score:>6.3f}" + ("  FAILED" if res.failed else ""))
    finally:
        if server is not None:
            server.stop()
        if proc is not None:
            parent.send("stop")
            proc.join(10)


if __name__ == "__main__":
    main()
