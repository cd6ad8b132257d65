"""How fragile each family's learned skill is: teacher-forced line accuracy of a built model under
random weight perturbations the size of RL updates, printing one table.

    python -m research.fragility                       # ait-tiny-m, all families: noise-advantage steps
    python -m research.fragility --noise sign --deltas 0,1e-3,3e-3,1e-2
    python -m research.fragility --model DIR --families calendar,units --seeds 3

What it measures, per family (the line-accuracy tool's clean teacher transcripts,
:func:`research.line_accuracy.transcripts`; a line is right when greedy decoding reproduces it
from a correct prefix), on the unperturbed weights and then after each perturbation, averaged over
``--seeds`` draws:

- ``--noise advantage`` (default): ``--steps`` policy-gradient steps whose advantages are random ±1
  (:func:`noise_steps`, on other clean transcripts of the family), each moving every parameter by
  ``-delta * sign(grad)``: the size and shape of an early AdamW step on a batch with no signal. On the
  local backend a job's lr 1e-6 is 1e-4 per step after the ×100 mapping, so ``delta`` 1e-4 is
  calendar's reference step and 3e-4 the other families';
- ``--noise sign``: every parameter moved once by ``±delta`` with an independent random sign
  (:func:`perturb`), the control: noise in directions the policy gradient does not take.

Columns: ``lines``, the share of the model's lines that are right; ``kept``, of the lines right on the
unperturbed weights, the share still right (the skill that update noise takes apart); ``whole``, the
share of transcripts with every line right (greedy reproduces the whole solution); ``margin<1``, the
share of right lines whose smallest logit margin (teacher token minus the best other) is under 1.

Measured on the pinned ait-tiny-m (docs/local_models.md): sign noise costs almost nothing, while ten
noise-advantage steps of 1e-4 keep 90-97% of the lines; calendar keeps the fewest (90%) and writes
twice as many lines per transcript as any other family, so its fragility is mostly its length.
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from cpu.tiny_models.model import TinyLM
from research.model_cli import load_model_arg
from research.line_accuracy import (
    SKILL_SEED, LineResult, Transcript, score_lines, transcripts)
from task_families import FAMILY_NAMES


@torch.no_grad()
def perturb(model: TinyLM, delta: float, seed: int) -> None:
    """Move every parameter of ``model`` by ``±delta`` (an independent random sign each), in place."""
    gen = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        sign = torch.randint(0, 2, p.shape, generator=gen, dtype=torch.float32) * 2 - 1
        p.add_(sign.to(p.dtype), alpha=delta)


def noise_steps(model: TinyLM, pool: list[Transcript], steps: int, delta: float, batch: int,
                seed: int) -> None:
    """``steps`` policy-gradient steps whose advantages are pure noise, in place: each step draws
    ``batch`` transcripts of ``pool``, gives half of them advantage +1 and half -1 at random, and moves
    every parameter by ``-delta * sign(grad)`` of the token-mean loss ``-A * log p`` over the lines the
    model writes (the size and shape of an early AdamW step)."""
    rng = random.Random(seed)
    for _ in range(steps):
        picked = rng.sample(pool, min(batch, len(pool)))
        signs = [1.0, -1.0] * (len(picked) // 2) + [1.0] * (len(picked) % 2)
        rng.shuffle(signs)
        model.zero_grad(set_to_none=True)
        n_tok = sum(len(toks) for tr in picked for _, toks in tr.lines)
        for tr, adv in zip(picked, signs):
            ids = torch.tensor([tr.ids])
            logp = torch.log_softmax(model(ids, torch.arange(len(tr.ids))[None], None)[0].float(), -1)
            pos = torch.tensor(sorted({i for _, toks in tr.lines for i in toks}))
            (-adv * logp[pos - 1].gather(1, ids[0, pos, None]).sum() / n_tok).backward()
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p.add_(torch.sign(p.grad), alpha=-delta)
    model.zero_grad(set_to_none=True)


def summary(base: list[list[LineResult]], now: list[list[LineResult]]) -> dict[str, float]:
    """Shares over all lines / transcripts of ``now``; ``kept`` is relative to ``base``."""
    flat_b = [r for t in base for r in t]
    flat_n = [r for t in now for r in t]
    right_b = [i for i, r in enumerate(flat_b) if r.right]
    return {
        "lines": sum(r.right for r in flat_n) / max(1, len(flat_n)),
        "kept": sum(flat_n[i].right for i in right_b) / max(1, len(right_b)),
        "whole": sum(all(r.right for r in t) for t in now) / max(1, len(now)),
        "thin": sum(r.right and r.margin < 1.0 for r in flat_n) / max(1, sum(r.right for r in flat_n)),
    }


def measure(model: TinyLM, items: list[Transcript], deltas: list[float], seeds: int,
            pool: list[Transcript] | None = None, steps: int = 10, batch: int = 32) -> list[dict[str, float]]:
    """One row per delta: the :func:`summary` averaged over ``seeds`` perturbations (one for delta 0):
    random signs (:func:`perturb`), or with a ``pool`` of other transcripts ``steps`` noise-advantage
    steps (:func:`noise_steps`)."""
    state = {k: v.clone() for k, v in model.state_dict().items()}
    base = score_lines(model, items)
    rows = []
    for delta in deltas:
        runs = []
        for s in range(seeds if delta > 0 else 1):
            if delta > 0 and pool is None:
                perturb(model, delta, seed=1000 + s)
            elif delta > 0:
                noise_steps(model, pool, steps, delta, batch, seed=1000 + s)
            runs.append(summary(base, score_lines(model, items)))
            model.load_state_dict(state)
        rows.append({"delta": delta, **{k: sum(r[k] for r in runs) / len(runs) for k in runs[0]}})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="ait-tiny-m",
                    help="catalog name (built first when missing) or a model directory")
    ap.add_argument("--families", default="all")
    ap.add_argument("--n", type=int, default=100, help="transcripts per family")
    ap.add_argument("--deltas", default="0,1e-4,3e-4", help="perturbation sizes (0 = the weights as built)")
    ap.add_argument("--seeds", type=int, default=2, help="random perturbations per delta")
    ap.add_argument("--noise", choices=["sign", "advantage"], default="advantage",
                    help="sign: ±delta on every parameter; advantage: --steps policy-gradient steps of size "
                         "delta with random ±1 advantages on other clean transcripts")
    ap.add_argument("--steps", type=int, default=10, help="--noise advantage: steps per draw")
    ap.add_argument("--batch", type=int, default=32, help="--noise advantage: transcripts per step")
    args = ap.parse_args(argv)
    deltas = [float(x) for x in args.deltas.split(",")]
    if any(d < 0 for d in deltas) or args.seeds < 1 or args.n < 1:
        ap.error("--deltas must be >= 0, --seeds and --n >= 1")
    families = FAMILY_NAMES if args.families == "all" else args.families.split(",")
    unknown = [f for f in families if f not in FAMILY_NAMES]
    if unknown:
        ap.error(f"unknown families {unknown}; choose from {', '.join(FAMILY_NAMES)}")
    torch.set_num_threads(1)
    model, tok, path = load_model_arg(args.model)
    how = ("±delta on every parameter" if args.noise == "sign" else
           f"{args.steps} steps of -delta*sign(grad) with random ±1 advantages, "
           f"{args.batch} transcripts each")
    print(f"model {path}; {args.n} clean transcripts per family; {how}; {args.seeds} draws per delta")
    print(f"{'family':<11}{'lines/transcript':>17}{'delta':>8}{'lines':>8}{'kept':>8}{'whole':>8}"
          f"{'margin<1':>10}")
    for fam in families:
        t0 = time.perf_counter()
        items = transcripts(tok, fam, args.n)
        pool = (transcripts(tok, fam, 4 * args.batch, seed=SKILL_SEED + 1)
                if args.noise == "advantage" else None)
        per = sum(len(t.lines) for t in items) / len(items)
        for i, row in enumerate(measure(model, items, deltas, args.seeds, pool, args.steps, args.batch)):
            print(f"{fam if i == 0 else '':<11}{f'{per:.1f}' if i == 0 else '':>17}{row['delta']:>8.0e}"
                  f"{row['lines']:>8.0%}{row['kept']:>8.0%}{row['whole']:>8.0%}{row['thin']:>10.0%}",
                  flush=True)
        print(f"{'':<11}({time.perf_counter() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
