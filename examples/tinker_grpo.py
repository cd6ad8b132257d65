"""The Tinker outer loop in one file: tinker-cookbook's GRPO trains an agent (a LoRA on a Qwen model) on
AIT/JobWriting-v0, top to bottom. The full trainer, with pilots, warm starts and budgets, is
``trainers/tinker_grpo.py``; this is its skeleton.

    TINKER_API_KEY=... python examples/tinker_grpo.py --model Qwen/Qwen3-4B-Instruct-2507 --steps 10
    python examples/tinker_grpo.py --dry-run    # no account: an offline service and a scripted policy

With ``--dry-run`` the same cookbook loop runs against an in-process service whose "model" is the
project's scripted agent and whose optimizer does nothing (nothing learns): it shows the plumbing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path
from unittest import mock

from ait_env.extras import missing_extras_exit

with missing_extras_exit("examples/tinker_grpo.py", active=__name__ == "__main__"):  # one line, exit 3
    from tinker_cookbook.rl import train

from ait_env.integrations.tinker import close_run_backends, get_renderer
from ait_env.integrations.tinker_datasets import JobWritingDatasetBuilder, drop_infra_strategy

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--model", default="Qwen/Qwen3-4B-Instruct-2507")
ap.add_argument("--renderer", default="qwen3_instruct")
ap.add_argument("--backend", default="stub", help="stub: instant surrogate scores; local: real training")
ap.add_argument("--steps", type=int, default=2)
ap.add_argument("--groups", type=int, default=2, help="task instances per step")
ap.add_argument("--group-size", type=int, default=4, help="episodes per instance (GRPO group)")
ap.add_argument("--log-dir", default="runs/examples/tinker")
ap.add_argument("--dry-run", action="store_true")
args = ap.parse_args()

# 1. episodes: the env (through its message-level adapter), groups of the same task instance
overrides = {"env": {"runs_dir": args.log_dir, "max_turns": 12}}
dataset = JobWritingDatasetBuilder(
    model_name=args.model, renderer_name=args.renderer, group_size=args.group_size, groups_per_batch=args.groups,
    n_batches=args.steps, backend=args.backend, env_overrides_json=json.dumps(overrides), max_tokens=8192,
    eval_heldout_groups=0, run_id="example-tinker")

# 2. the cookbook's GRPO config: IS loss on a rank-8 LoRA; infra_failed episodes leave their group
config = train.Config(
    learning_rate=4e-5, dataset_builder=dataset, model_name=args.model, renderer_name=args.renderer,
    max_tokens=8192, log_path=str(Path(args.log_dir).resolve()), lora_rank=8, loss_fn="importance_sampling",
    eval_every=0, save_every=args.steps, rollout_error_tolerance=drop_infra_strategy(args.group_size),
    recipe_name="ai-trains-ai-example")

try:
    if not args.dry_run:
        if not os.environ.get("TINKER_API_KEY"):
            raise SystemExit("set TINKER_API_KEY, or run with --dry-run")
        asyncio.run(train.main(config))
    else:
        # 3. no account: a local tokenizer for the model name, an offline service, a scripted policy
        import tinker

        from ait_env.integrations.tinker_offline import (OfflineRecord, ScriptedPolicy, build_local_tokenizer,
                                                         offline_service_client, register_local_tokenizer)

        cache = Path(os.environ.get("AIT_CACHE_DIR", Path.home() / ".cache" / "ai-trains-ai"))
        register_local_tokenizer(args.model, build_local_tokenizer(cache / "tokenizers" / "local-bpe"))
        policy = lambda: ScriptedPolicy(get_renderer(args.renderer, args.model))  # noqa: E731
        with mock.patch.object(tinker, "ServiceClient", offline_service_client(policy, OfflineRecord())):
            asyncio.run(train.main(config))
finally:
    close_run_backends()  # the run's one backend, shared by every episode

rows = [json.loads(x) for x in (Path(args.log_dir) / "metrics.jsonl").read_text().splitlines()]
for r in rows:
    if "env/all/ait/reward" in r:
        print(f"step {r['step']}: reward {r['env/all/ait/reward']:.3f}, "
              f"validated {r.get('env/all/ait/validated', 0):.2f}")
