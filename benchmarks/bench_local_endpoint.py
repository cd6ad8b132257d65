"""Wall time of one hidden eval through the local OpenAI-compatible endpoint, against the in-process evaluator.

The hidden-eval harness (:mod:`ait_env.hidden.evaluation`) talks HTTP to :class:`cpu.tiny_models.endpoint.LocalEndpoint`,
either in a child process as the runner does (``evaluate_subprocess``: the harness on its own core) or
in a thread of the endpoint's process (``evaluate``: one interpreter lock for both); the in-process
evaluator (:mod:`cpu.tiny_models.quick_eval`) runs the same greedy conversations without HTTP, in
lockstep turns. Both score the same model on the same instances, so their scores must agree and the
ratio of their times is the cost of serving over HTTP with dynamic arrivals.

    python benchmarks/bench_local_endpoint.py [--family arithmetic] [--model ait-tiny-m]
                                             [--concurrency 64 300] [--limit N]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from ait_env.hidden.evaluation import evaluate, evaluate_subprocess  # noqa: E402
from cpu.tiny_models import quick_eval# noqa: E402
from cpu.tiny_models.catalog import load_model  # noqa: E402
from cpu.tiny_models.endpoint import LocalEndpoint  # noqa: E402
from ait_env.backends.local import LocalOptions  # noqa: E402
from ait_env.hidden.secrets import hidden_set  # noqa: E402
from task_families import get_family  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", default="arithmetic")
    ap.add_argument("--model", default="ait-tiny-m")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[64, 300])
    ap.add_argument("--limit", type=int, default=None, help="default: the whole hidden set")
    args = ap.parse_args()
    from ait_env.hidden.secrets import default_hidden_seeds

    seeds = default_hidden_seeds("published")   # the docs' figures; AIT_HIDDEN_SEEDS=private for your own sets
    print(f"hidden-eval seeds: {seeds.label}", file=sys.stderr)
    opts = LocalOptions()
    torch.set_num_threads(opts.torch_threads)
    fam = get_family(args.family)
    instances = hidden_set(args.family)[:args.limit] if args.limit else hidden_set(args.family)
    max_tokens = min(fam.eval_max_tokens, opts.eval_max_tokens)
    model, tok = load_model(args.model)
    t0 = time.perf_counter()
    ref = quick_eval.score_in_process(model, tok, args.family, instances, max_tokens=max_tokens)
    base = time.perf_counter() - t0
    print(f"{args.family} / {args.model}, {len(instances)} instances, max_tokens {max_tokens}")
    print(f"  in-process evaluator        {base:6.1f} s  score {ref.score:.3f}")
    for mode in ("child process", "thread"):
        for conc in args.concurrency:
            with LocalEndpoint(model, tok, args.model) as ep:
                t0 = time.perf_counter()
                if mode == "thread":
                    res = evaluate(fam, base_url=ep.base_url, model=args.model, instances=instances,
                                   concurrency=conc, max_tokens=max_tokens)
                else:
                    res = evaluate_subprocess(args.family, base_url=ep.base_url, model=args.model,
                                              limit=len(instances), concurrency=conc, max_tokens=max_tokens)
                dt = time.perf_counter() - t0
                st = ep.stats
            print(f"  harness in a {mode:13s} concurrency {conc:4d}  {dt:6.1f} s  score {res.score:.3f}  "
                  f"({dt / base:.2f}x in-process; {st['requests']} requests in {st['batches']} admissions, "
                  f"{st['generated_tokens'] / dt:.0f} tokens/s)")

if __name__ == "__main__":
    main()
