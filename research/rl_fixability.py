"""In-process GRPO of the local base models: are they fixable by RL, gradually, and do the controls behave?

For each family: load a fresh copy of the base model, then run GRPO with the local trainer's own update
(:func:`cpu.grpo.rl_step`: advantages, batch, loss, optimizer, schedule) on rollouts from
the same batched tool loop the evaluator uses (:func:`cpu.tiny_models.quick_eval.run_conversations` at
the job's temperature; reward = ``family.check`` of the final answer), on training questions drawn
from the family's generator with their own seed (hidden questions excluded by key). The greedy
hidden-eval score (:func:`cpu.tiny_models.quick_eval.score_in_process`) is measured at ``--eval-at`` steps.

The default job is the families' reference job (batch 128 = 16 prompts x group 8, AdamW lr 3e-6 with a
cosine schedule, warmup 5, min_lr lr/10, no weight decay) with ``--steps`` steps; the local lr is
``lr * lr_scale``. Controls: ``--control constant`` (every reward 1: zero advantages, no update),
``--control lr0`` (lr 0), ``--control high_lr`` (lr x 30).

    python -m research.rl_fixability --model ait-tiny-s --families arithmetic,units --steps 40 \\
        --eval-at 0,10,20,30,40 --out /tmp/fixability.jsonl

Each family's result is one JSON line: the config, per-step training reward, and the eval curve.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch

from ait_env.jobs.schema import PrimeRL
from cpu import grpo; from cpu.tiny_models import quick_eval
from cpu.tiny_models.model import TinyLM
from cpu.tiny_models.tokenizer import ChatTokenizer
from task_families import FAMILY_NAMES, get_family

POOL_SEED = 4_242_000


def job_config(steps: int, prompts: int, group: int, lr: float, temperature: float, max_tokens: int,
               seq_len: int) -> PrimeRL:
    return PrimeRL.model_validate({
        "max_steps": steps, "seq_len": seq_len, "batch_size": prompts * group, "group_size": group,
        "sampling": {"temperature": temperature, "max_tokens": max_tokens},
        "optim": {"type": "adamw", "lr": lr, "weight_decay": 0.0},
        "scheduler": {"type": "cosine", "warmup_steps": min(5, steps - 1), "min_lr": lr / 10},
        "loss": {"type": "default"}, "algo": {"type": "grpo"}})


def train_pool(family: str, n: int = 3000) -> list:
    from ait_env.hidden.secrets import hidden_keys

    hidden = hidden_keys(family)
    return [i for i in get_family(family).generate(POOL_SEED, n) if i.key not in hidden]


def run_family(model_dir: Path, family: str, args: argparse.Namespace) -> dict:
    torch.manual_seed(args.seed)
    model = TinyLM.load(model_dir)
    tok = ChatTokenizer.load(model_dir)
    lr = 0.0 if args.control == "lr0" else args.lr * (30 if args.control == "high_lr" else 1)
    p = job_config(args.steps, args.prompts, args.group, lr, args.temperature, args.max_tokens, args.seq_len)
    opt = grpo.make_optimizer(model, p, args.lr_scale)
    pool = train_pool(family)
    rng = random.Random(f"probe:{family}:{args.seed}")
    gen = torch.Generator().manual_seed(args.seed)
    eval_at = sorted({int(x) for x in args.eval_at.split(",") if x.strip()})
    from ait_env.hidden.secrets import hidden_set

    hidden = hidden_set(family)[:args.eval_limit]
    from cpu.tiny_models.pretrain import weights_hash

    hash0 = weights_hash(model)
    curve: dict[int, float] = {}
    log: list[dict] = []
    t_start = time.perf_counter()

    def do_eval(step: int) -> None:
        s = quick_eval.score_in_process(model, tok, family, hidden, max_tokens=args.max_tokens)
        curve[step] = round(s.score, 4)
        print(f"[{family}] step {step:3d} eval {s.score:.3f} ± {s.ci95:.3f}  "
              f"({time.perf_counter() - t_start:.0f}s)", flush=True)

    if 0 in eval_at:
        do_eval(0)
    for step in range(args.steps):
        t0 = time.perf_counter()
        prompts = [pool[rng.randrange(len(pool))] for _ in range(args.prompts)]
        insts = [inst for inst in prompts for _ in range(args.group)]
        convs = quick_eval.run_conversations(model, tok, family, insts, temperature=args.temperature,
                                             max_tokens=args.max_tokens, generator=gen, keep_turns=True)
        rewards = [1.0 if args.control == "constant" else c.score for c in convs]
        advs = grpo.advantages(rewards, args.group, p.algo.type)
        rollouts = [grpo.rollout_sequences(c.turns) for c in convs]
        t1 = time.perf_counter()
        step_lr, metrics = grpo.rl_step(model, opt, rollouts, advs, p, step, args.lr_scale, tok.pad_id,
                                        args.micro_batch)
        t2 = time.perf_counter()
        mean_r = sum(c.score for c in convs) / len(convs)
        log.append({"step": step + 1, "reward": round(mean_r, 4), "lr": step_lr,
                    "rollout_s": round(t1 - t0, 2), "train_s": round(t2 - t1, 2),
                    "masked_frac": round(metrics.get("masked_frac", 0.0), 4),
                    "live_seqs": metrics.get("live_seqs", 0), "seqs": sum(map(len, rollouts))})
        if args.verbose:
            print(f"[{family}] step {step + 1:3d} reward {mean_r:.3f} lr {step_lr:.2e} "
                  f"rollout {t1 - t0:.1f}s train {t2 - t1:.1f}s", flush=True)
        if step + 1 in eval_at:
            do_eval(step + 1)
    if args.save_dir:
        out_dir = Path(args.save_dir) / f"{family}-{args.control}-s{args.lr_scale:g}"
        model.save(out_dir)
        tok.save(out_dir, model_max_length=model.cfg.max_position_embeddings)
    base = curve.get(0)
    final = curve.get(max(curve)) if curve else None
    return {"family": family, "model": str(model_dir), "control": args.control, "steps": args.steps,
            "prompts": args.prompts, "group": args.group, "lr": lr, "lr_scale": args.lr_scale,
            "local_lr": lr * args.lr_scale, "temperature": args.temperature, "max_tokens": args.max_tokens,
            "seed": args.seed, "eval_n": len(hidden), "curve": curve,
            "delta": None if base is None or final is None else round(final - base, 4),
            "weights_changed": weights_hash(model) != hash0,
            "train_reward_first5": round(sum(x["reward"] for x in log[:5]) / max(1, len(log[:5])), 4),
            "train_reward_last5": round(sum(x["reward"] for x in log[-5:]) / max(1, len(log[-5:])), 4),
            "seconds": round(time.perf_counter() - t_start, 1), "log": log}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="ait-tiny-s", help="catalog name or model directory")
    ap.add_argument("--families", default=",".join(FAMILY_NAMES))
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-6, help="job lr (Qwen scale)")
    ap.add_argument("--lr-scale", type=float, default=100.0, help="as conf/backend/local.yaml")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--max-tokens", type=int, default=quick_eval.LOCAL_MAX_TOKENS)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--micro-batch", type=int, default=32)
    ap.add_argument("--eval-at", default="0,10,20,30,40")
    ap.add_argument("--eval-limit", type=int, default=300)
    ap.add_argument("--control", choices=["none", "constant", "lr0", "high_lr"], default="none")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--out", default=None, help="append one JSON line per family here")
    ap.add_argument("--save-dir", default=None, help="save each family's trained model under this folder")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    path = Path(args.model)
    if not path.is_dir():
        from cpu.tiny_models.build import ensure_built

        path = ensure_built(args.model)
    for fam in args.families.split(","):
        res = run_family(path, fam.strip(), args)
        print(json.dumps({k: v for k, v in res.items() if k != "log"}), flush=True)
        if args.out:
            with open(args.out, "a", encoding="utf-8") as f:
                f.write(json.dumps(res) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
