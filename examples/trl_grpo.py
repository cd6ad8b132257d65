"""Train an LLM agent on AIT/JobWriting-v0 with TRL's GRPOTrainer (its `environment_factory` integration).

    pip install -e '.[trl]'
    python examples/trl_grpo.py --model Qwen/Qwen3-0.6B --family arithmetic --max-steps 20

Each rollout is one episode: TRL renders the env's six tools with the model's chat template, parses the
model's tool calls and runs each one as an env step; the episode's reward is the env's (the stub backend:
an instant surrogate score). An `infra_failed` episode returns no reward and TRL leaves it out of its group.
`--model` takes a hub id or a local folder (e.g. one of the project's tiny models saved with TinyLM.save).
"""

from __future__ import annotations

import argparse

from ait_env.extras import missing_extras_exit

with missing_extras_exit("examples/trl_grpo.py", active=__name__ == "__main__"):  # one line, exit 3
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

from ait_env.backends import make_backend
from ait_env.config import compose
from ait_env.integrations.trl import EnvironmentFactory, JobWritingToolEnv, prepare_tokenizer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="Qwen/Qwen3-0.6B", help="the policy: a hub id or an HF model folder")
    ap.add_argument("--family", default="train", help="a task family, or 'train' (all but the held-out one)")
    ap.add_argument("--backend", default="stub", help="the backend that runs the submitted jobs")
    ap.add_argument("--max-steps", type=int, default=20, help="GRPO optimizer steps")
    ap.add_argument("--num-generations", type=int, default=4, help="episodes per task instance (GRPO group)")
    ap.add_argument("--batch-size", type=int, default=4, help="episodes per optimizer step")
    ap.add_argument("--max-completion-length", type=int, default=4096,
                    help="token budget of one episode: every model turn and tool result")
    ap.add_argument("--max-turns", type=int, default=30, help="env turns per episode (one per tool call)")
    ap.add_argument("--learning-rate", type=float, default=1e-6)
    ap.add_argument("--rows", type=int, default=256, help="task instances in the training dataset")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--runs-dir", default="runs/trl", help="workspaces, job bundles, costs and checkpoints")
    args = ap.parse_args()

    # One backend for the whole run, shared by every episode's env; the factory builds one env per rollout.
    settings = compose(backend=args.backend)
    overrides = [f"env.runs_dir={args.runs_dir}", f"env.max_turns={args.max_turns}"]
    with make_backend(settings.backend, runs_dir=args.runs_dir) as backend, \
            EnvironmentFactory(backend, family=args.family, overrides=overrides) as factory:
        model = AutoModelForCausalLM.from_pretrained(args.model)
        tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(args.model))
        config = GRPOConfig(
            output_dir=f"{args.runs_dir}/checkpoints",
            max_steps=args.max_steps,
            per_device_train_batch_size=args.batch_size,
            num_generations=args.num_generations,
            max_completion_length=args.max_completion_length,
            learning_rate=args.learning_rate,
            bf16=torch.cuda.is_available(),
            chat_template_kwargs={"enable_thinking": False},  # Qwen3: answer without a thinking block
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            seed=args.seed,
        )
        trainer = GRPOTrainer(
            model=model,
            processing_class=tokenizer,
            args=config,
            train_dataset=factory.dataset(args.rows, seed=args.seed),  # rows of (prompt, family, instance)
            environment_factory=factory,  # TRL calls it once per concurrent rollout; get_reward is the reward
        )
        trainer.train()
        trainer.save_model(f"{args.runs_dir}/policy")

    env_reward = f"rewards/{JobWritingToolEnv.__name__}/mean"  # TRL logs get_reward under the class name
    for log in trainer.state.log_history:
        if env_reward in log:
            print(f"step {log['step']:>4}  env reward {log[env_reward]:+.3f}  (std {log['reward_std']:.3f})  "
                  f"tool calls/episode {log['tools/call_frequency']:.2f}  loss {log['loss']:+.4f}")


if __name__ == "__main__":
    main()
