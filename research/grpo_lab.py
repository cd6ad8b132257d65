"""A fast, in-process GRPO lab for recipe search on the local models (not the job path).

It samples rollouts with :func:`cpu.tiny_models.quick_eval.run_conversations` (the batched in-process
evaluator, at the job's temperature) and takes optimizer steps with :func:`cpu.grpo.rl_step`,
the local trainer's own update (advantages, loss, optimizer and schedule). There is no endpoint, no
verifiers, no sandbox and no agent code: the reward is the family's own check, optionally mixed with
"looked up every person" (calendar, ``--shape``) or with the share of scratchpad lines the rollout wrote
right (calendar, ``--process``: :func:`scratchpad_accuracy`). Use it to try recipes in minutes, then
confirm with a real job (``benchmarks/local_jobs.py``); its numbers are not job results.

    python -m research.grpo_lab train --family calendar --steps 30 --lr 1e-6 --sched constant --min-people 4
    python -m research.grpo_lab train --family calendar --steps 10 --random-adv     # noise-only control
    python -m research.grpo_lab explore --family calendar --min-people 4 --temps 0,0.7,1.0,1.3
    python -m research.grpo_lab train --min-people 2 --max-people 3 --long-share 0.5 --lr 1e-6 \
        --sched constant --steps 30 --save /tmp/w        # then: research/calendar_errors.py --model /tmp/w

Calendar's training questions can be narrowed by size (``--min-people``, ``--max-people``), by meeting
length (``--min-minutes``), drawn with a set share of meetings over 30 minutes (``--long-share``), or
drawn under another generator rule (``--rule balanced``, ``--rule shortcuts_wrong``); ``--eval-rule``
evaluates on questions the hidden seed draws under a rule.

``train`` (``--save DIR`` keeps the trained weights for ``line_accuracy`` / ``flaw_calibration --model DIR``)
prints one JSON line per step (reward, accuracy, for calendar the share of rollouts that
looked everyone up and the accuracy with and without) and a greedy eval on the first ``--eval-n``
hidden questions every ``--eval-every`` steps. ``explore`` samples 4 rollouts of 32 questions per
temperature without training.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from ait_env.conf import load_group
from ait_env.jobs.schema import PrimeRL
from cpu import grpo
from cpu.tiny_models.quick_eval import Conversation, run_conversations, score_in_process as evaluate
from ait_env.hidden.secrets import hidden_set
from research.model_cli import load_model_arg
from task_families import get_family
from task_families.calendar.family import looked_up


def lr_scale() -> float:
    """The local backend's lr mapping (``options.lr_scale`` of ``conf/backend/local.yaml``)."""
    return float(load_group("backend", "local")["options"]["lr_scale"])


def looked_up_everyone(c: Conversation) -> bool:
    """Calendar: busy_slots was called for every person the question names."""
    asked = looked_up(c.messages)
    return all(p in asked for p in c.instance.info.get("people", []))


def scratchpad_accuracy(c: Conversation) -> float:
    """Calendar: the share of the rollout's scratchpad lines (each person's listing, the running union
    ``busy M:`` and the walk ``free M:``) that equal what the teacher would write from the tool results
    the rollout has seen so far (1.0 when it wrote none)."""
    from task_families.calendar.teacher import _mask_of, free_note, listing_note, mask_note

    minutes = int(c.instance.info["minutes"])
    results: list[str] = []
    right = total = 0
    after_tool = False
    for m in c.messages:
        if m["role"] == "tool":
            results.append(str(m.get("content") or ""))
            after_tool = True
            continue
        if m["role"] != "assistant":
            continue
        union = [any(x) for x in zip(*(_mask_of(r) for r in results))] if results else []
        for i, line in enumerate(str(m.get("content") or "").splitlines()):
            if i == 0 and after_tool and results:
                want = listing_note(results[-1])
            elif line.startswith("busy ") and union:
                want = mask_note(union, minutes)
            elif line.startswith("free ") and union:
                want, start = free_note(union, minutes, minutes // 30)
                if start is None:  # no run long enough: the teacher walks to the first free half hour
                    want = free_note(union, minutes, 1)[0]
            else:
                continue
            total += 1
            right += line.strip() == want
        after_tool = False
    return right / total if total else 1.0


def _pool(family: str, seed: int, min_people: int, max_people: int = 99, min_minutes: int = 0,
          rule: str | None = None) -> list[Any]:
    """Training questions (apart from the hidden set); calendar: only those with ``min_people`` to
    ``max_people`` people and meetings of ``min_minutes`` or longer, drawn under ``rule``
    (``task_families.calendar.family.RULES``; None: the generator's default)."""
    fam = get_family(family)
    return [i for i in fam.generate(9000 + seed, 4000, **_rule(rule))
            if min_people <= len(i.info.get("people", [])) <= max_people
            and i.info.get("minutes", 0) >= min_minutes]


def _rule(rule: str | None) -> dict[str, str]:
    return {"rule": rule} if rule else {}


def eval_set(family: str, rule: str | None, n: int) -> list[Any]:
    """The first ``n`` hidden questions, or, with a ``rule``, the first ``n`` that the hidden seed draws
    under it (an experiment's eval set; never a workspace's)."""
    if not rule:
        return hidden_set(family)[:n]
    from ait_env.hidden.secrets import hidden_seed

    return get_family(family).hidden_eval(hidden_seed(family), rule=rule)[:n]


def _lookup_stats(convs: list[Conversation]) -> dict[str, float]:
    if not convs or "people" not in convs[0].instance.info:
        return {}
    al = [looked_up_everyone(c) for c in convs]
    n = sum(al)
    return {"looked_up_all": round(n / len(al), 3),
            "acc_if_all": round(sum(c.score for c, x in zip(convs, al) if x) / max(1, n), 3),
            "acc_if_not": round(sum(c.score for c, x in zip(convs, al) if not x) / max(1, len(al) - n), 3)}


def train(a: argparse.Namespace) -> None:
    torch.manual_seed(a.seed)
    fam = get_family(a.family)
    model, tok, source = load_model_arg(a.model)
    sched = ({"type": "cosine", "warmup_steps": a.warmup, "min_lr": a.lr / 10} if a.sched == "cosine"
             else {"type": "constant"})
    p = PrimeRL.model_validate({
        "max_steps": a.steps, "seq_len": 1536, "batch_size": a.prompts * a.group, "group_size": a.group,
        "sampling": {"temperature": a.temp, "max_tokens": 160},
        "optim": {"type": a.optim, "lr": a.lr, "weight_decay": 0.0, "betas1": a.betas1},
        "scheduler": sched, "loss": {"type": "default"}, "algo": {"type": "grpo"}})
    scale = lr_scale()
    opt = grpo.make_optimizer(model, p, scale)
    pool = _pool(a.family, a.seed, a.min_people, a.max_people, a.min_minutes, a.rule)
    if not pool:
        raise SystemExit("no training questions match --min-people/--max-people/--min-minutes")
    long_pool = [i for i in pool if i.info.get("minutes", 0) > 30]
    short_pool = [i for i in pool if i.info.get("minutes", 0) <= 30]
    if a.long_share is not None and not (long_pool and short_pool):
        raise SystemExit("--long-share needs both 30-minute and longer meetings in the training questions")
    ev = eval_set(a.family, a.eval_rule, a.eval_n)
    gen = torch.Generator().manual_seed(a.seed)
    rng = random.Random(a.seed)
    t0 = time.time()
    print(json.dumps({"step": 0, "eval": round(evaluate(model, tok, a.family, ev).score, 3)}), flush=True)

    def draw() -> Any:
        if a.long_share is None:
            return pool[rng.randrange(len(pool))]
        part = long_pool if rng.random() < a.long_share else short_pool
        return part[rng.randrange(len(part))]

    for step in range(a.steps):
        insts = [draw() for _ in range(a.prompts)]
        convs = run_conversations(model, tok, fam, [i for i in insts for _ in range(a.group)],
                                  temperature=a.temp, max_tokens=160, generator=gen, keep_turns=True)
        rewards = [(1 - a.shape - a.process) * c.score + (a.shape * looked_up_everyone(c) if a.shape else 0.0)
                   + (a.process * scratchpad_accuracy(c) if a.process else 0.0) for c in convs]
        advs = grpo.advantages(rewards, a.group)
        if a.random_adv:
            rng.shuffle(advs)
        rollouts = [grpo.rollout_sequences(c.turns) for c in convs]
        lr, metrics = grpo.rl_step(model, opt, rollouts, advs, p, step, scale, tok.pad_id)
        out: dict[str, Any] = {"step": step + 1, "reward": round(sum(rewards) / len(rewards), 3),
                               "acc": round(sum(c.score for c in convs) / len(convs), 3), "lr": lr,
                               "pad_acc": round(sum(map(scratchpad_accuracy, convs)) / len(convs), 3)
                               if "minutes" in convs[0].instance.info else None,
                               "grad_norm": round(metrics.get("grad_norm", 0.0), 4), **_lookup_stats(convs),
                               "seconds": round(time.time() - t0)}
        if (step + 1) % a.eval_every == 0 or step + 1 == a.steps:
            out["eval"] = round(evaluate(model, tok, a.family, ev).score, 3)
        print(json.dumps(out), flush=True)
    if a.save:
        save(model, source, Path(a.save))


def save(model: Any, source: Path, dest: Path) -> None:
    """The trained weights with the source model's tokenizer files, loadable by ``quick_eval.load_dir`` and
    the research tools (``--model DIR``); the build's ``ait_model.json`` is left out (it names other
    weights)."""
    shutil.copytree(source, dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns("ait_model.json"))
    model.save(dest)
    print(json.dumps({"saved": str(dest)}), flush=True)


def explore(a: argparse.Namespace) -> None:
    fam = get_family(a.family)
    model, tok, _ = load_model_arg(a.model)
    pool = _pool(a.family, a.seed, a.min_people, a.max_people, a.min_minutes, a.rule)[:32]
    for temp in (float(x) for x in a.temps.split(",")):
        gen = torch.Generator().manual_seed(a.seed)
        insts = pool if temp == 0 else [i for i in pool for _ in range(4)]
        convs = run_conversations(model, tok, fam, insts, temperature=temp, max_tokens=160, generator=gen)
        print(json.dumps({"temperature": temp, "acc": round(sum(c.score for c in convs) / len(convs), 3),
                          **_lookup_stats(convs)}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=["train", "explore"])
    ap.add_argument("--family", default="calendar")
    ap.add_argument("--model", default="ait-tiny-m",
                    help="catalog name or a model directory (e.g. an earlier --save)")
    ap.add_argument("--min-people", type=int, default=0,
                    help="calendar: train on questions with this many people or more")
    ap.add_argument("--max-people", type=int, default=99, help="calendar: ... and this many or fewer")
    ap.add_argument("--min-minutes", type=int, default=0, help="calendar: only meetings this long or longer")
    ap.add_argument("--long-share", type=float, default=None,
                    help="calendar: draw this share of training questions from meetings over 30 minutes")
    ap.add_argument("--rule", default=None,
                    help="calendar: draw the training questions under this generator rule (natural, "
                         "balanced, shortcuts_wrong; default: the eval's)")
    ap.add_argument("--eval-rule", default=None,
                    help="calendar: evaluate on the questions the hidden seed draws under this rule "
                         "instead of the hidden set")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lr", type=float, default=3e-6, help="at job scale (x the backend's lr_scale)")
    ap.add_argument("--sched", choices=["cosine", "constant"], default="cosine")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--betas1", type=float, default=0.9)
    ap.add_argument("--optim", choices=["adamw", "sgd", "muon", "sign_sgd"], default="adamw",
                    help="the job's optimizer type (the lr is at job scale for each)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--temp", type=float, default=0.7)
    ap.add_argument("--shape", type=float, default=0.0,
                    help="calendar: weight of 'looked up everyone' in the reward")
    ap.add_argument("--process", type=float, default=0.0,
                    help="calendar: weight of the scratchpad lines' accuracy in the reward")
    ap.add_argument("--random-adv", action="store_true", help="shuffle the advantages (a noise-only control)")
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--eval-n", type=int, default=150)
    ap.add_argument("--temps", default="0,0.7,1.0,1.3")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--save", default="", help="train: write the trained weights to this directory")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    train(a) if a.mode == "train" else explore(a)


if __name__ == "__main__":
    main()
