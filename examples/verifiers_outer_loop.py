"""Play AIT/JobWriting-v0 episodes with any OpenAI-compatible model through verifiers' own rollout code.

This is the open-source outer loop's evaluation half: the env id `ait-job-writing` is a verifiers 0.2.0
environment; verifiers sends each turn to the model, each assistant message becomes the env's action,
and the rubric returns the env's reward. The training half is prime-rl v0.7.0 on the same env id:
`uv run rl @ trainers/prime_rl/rl.toml` (docs/verifiers.md).

    pip install -e '.[inner]' && pip install -e environments/ait_job_writing
    vllm serve Qwen/Qwen3-4B-Instruct-2507 --enable-auto-tool-choice --tool-call-parser hermes  # any server
    python examples/verifiers_outer_loop.py --base-url http://localhost:8000/v1 \
        --model Qwen/Qwen3-4B-Instruct-2507
"""

from __future__ import annotations

import argparse
import math
import os
from collections import Counter

from ait_env.extras import missing_extras_exit

with missing_extras_exit("examples/verifiers_outer_loop.py", active=__name__ == "__main__"):  # one line, exit 3
    import verifiers as vf

from ait_env.backends import make_backend
from ait_env.config import compose
from ait_env.integrations.verifiers_env import scored_rewards


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://localhost:8000/v1", help="OpenAI-compatible endpoint")
    ap.add_argument("--model", default="Qwen/Qwen3-4B-Instruct-2507", help="model name the server serves")
    ap.add_argument("--api-key-var", default="OPENAI_API_KEY", help="env var holding the API key")
    ap.add_argument("--backend", default="stub", help="backend that runs the submitted jobs: stub | local")
    ap.add_argument("--families", default="heldout", help="'train', 'heldout', 'all' or 'arithmetic,units'")
    ap.add_argument("--num-examples", type=int, default=2, help="episodes (family x instance) to play")
    ap.add_argument("--rollouts", type=int, default=2, help="rollouts per episode (a GRPO group)")
    ap.add_argument("--max-tokens", type=int, default=4096, help="max tokens per assistant turn")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max-turns", type=int, default=30, help="the env's turn limit")
    ap.add_argument("--runs-dir", default="runs", help="where job bundles, results and costs go")
    args = ap.parse_args()
    os.environ.setdefault(args.api_key_var, "EMPTY")  # local servers take any key

    # 1. One backend for every episode of the run: we build it, we close it (the env never does).
    overrides = [f"env.max_turns={args.max_turns}", f"env.runs_dir={args.runs_dir}"]
    settings = compose(backend=args.backend, overrides=overrides)
    with make_backend(settings.backend, settings.env.runs_dir) as backend:
        # 2. The environment by its id, as vf-eval and prime-rl load it; eval rows = the chosen families.
        env = vf.load_environment("ait-job-writing", backend=backend, overrides=overrides, num_examples=0,
                                  eval_families=args.families, num_eval_examples=args.num_examples)
        # 3. verifiers plays the episodes: groups of `rollouts` per example, scored by the env's rubric.
        results = env.evaluate_sync(
            client=vf.ClientConfig(api_base_url=args.base_url, api_key_var=args.api_key_var),
            model=args.model, sampling_args={"max_tokens": args.max_tokens, "temperature": args.temperature},
            num_examples=args.num_examples, rollouts_per_example=args.rollouts,
            state_columns=["ait_reward"])

    # 4. Report. An infra_failed episode has `error` set and reward NaN: dropped, never counted as 0.
    outputs = results["outputs"]
    for o in outputs:
        breakdown = o.get("ait_reward") or {}
        status = breakdown.get("status") or ("error" if o.get("error") else "unfinished")
        reason = (breakdown.get("reason") or "")[:70]
        print(f"{o['info']['family']:>10} #{o['info']['instance']:<8} {status:>12}  "
              f"reward {o['reward']:+.3f}  turns {o.get('num_turns', 0):.0f}  {reason}")
    kept = scored_rewards(outputs)
    mean = sum(kept) / len(kept) if kept else math.nan
    print(f"statuses: {dict(Counter((o.get('ait_reward') or {}).get('status', 'error') for o in outputs))}")
    print(f"mean reward {mean:.3f} over {len(kept)} episodes; {len(outputs) - len(kept)} dropped (errors)")


if __name__ == "__main__":
    main()
