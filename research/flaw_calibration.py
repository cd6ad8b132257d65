"""Which of the teacher's flaws a built model shows, and how firmly: a per-flaw calibration.

The base models learn the flawed teachers' habits (:mod:`task_families.teacher`), but not exactly at the
teacher's rates: a flaw taught at 0.58 may or may not appear under greedy decoding, and which ones do
varies from build to build. The base score, and how much RL can add, follow from that, so a model
build is tuned by knowing, per flaw, where the model stands.

Contract of :func:`flaw_calibration`: for each instance it renders the teacher's clean transcript
(no flaw taken) and notes every flaw decision the teacher made on the way
(:attr:`task_families.teacher.Policy.decisions`). For decision k it re-runs the teacher taking that one flaw
(``mode="clean", force=k``). The two transcripts agree up to the first token where they differ, which
is the decision made visible (``left`` vs ``Answer``, a tool call vs a mental step, ``.`` vs ``"``); it
must be a token the model writes (never a tool result). One teacher-forced forward pass of the clean
transcript gives the model's next-token distribution at that point, and from it:

- ``p``: P(flaw token) / (P(flaw token) + P(clean token)), the model's choice between the two branches;
- ``leave``: 1 - P(clean token), the probability of leaving the clean path there at all (a flaw whose
  first token is a guessed number spreads its mass over many tokens, so ``p`` understates it);
- ``shows``: the flaw token is the most likely token (greedy decoding takes the flaw there);
- ``clean``: the clean token is the most likely (greedy stays on the clean path there); when neither
  is, the model makes some third, unscripted choice at that context (a skill error).

A context counts for the flaw it decides. Decisions made before it on the clean path are the clean
choices, which is where a greedy model's path runs as long as it has not erred. Instances come from
the families' generators with their own seed (``seed``), not the hidden sets.

CLI: ``python -m research.flaw_calibration --model ait-tiny-m [--families calendar,triage] [--n 200]``
prints, per family and flaw, the teacher's rate, the number of contexts, mean ``p`` and the share of
contexts where greedy shows the flaw or stays clean.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from cpu.tiny_models.corpus import encode_transcript
from cpu.tiny_models.model import TinyLM
from cpu.tiny_models.tokenizer import ChatTokenizer
from research.model_cli import run_per_family
from task_families import get_family
from task_families.base import Instance
from task_families.teacher import flaw_rates, teacher_completion

#: Seed of the instances (apart from the corpus's and the hidden sets' seeds).
CALIBRATION_SEED = 5_300_000


@dataclass(frozen=True)
class Decision:
    """One flaw decision point of one instance, made visible by the first differing token."""
    key: str
    position: int        # index of the first differing token in the clean transcript's ids
    clean_token: int
    flaw_token: int


@dataclass
class FlawCalibration:
    key: str
    rate: float          # the teacher's rate in this context
    contexts: int = 0
    p: float = 0.0       # mean two-way probability of the flaw branch
    leave: float = 0.0   # mean 1 - P(clean token)
    shows: float = 0.0   # share of contexts where the flaw token is the argmax
    clean: float = 0.0   # share where the clean token is the argmax


def decision_points(family: str, inst: Instance, tok: ChatTokenizer,
                    seed: int | str = 0) -> tuple[list[int], list[Decision]]:
    """Token ids of the clean transcript (prompt + completion) and the instance's decision points."""
    fam = get_family(family)
    tools = fam.tool_schemas()
    prompt = fam.eval_messages(inst)
    keys: list[str] = []
    clean, _ = teacher_completion(family, inst, mode="clean", seed=seed, decisions=keys)
    ids, mask = encode_transcript(tok, prompt + clean, tools)
    out: list[Decision] = []
    for k, key in enumerate(keys):
        flawed, used = teacher_completion(family, inst, mode="clean", seed=seed, force=k)
        if used != [key]:
            raise RuntimeError(f"{family}: forcing decision {k} ({key}) took {used}: the teacher must ask "
                               "about its flaws in the same order whatever it decides")
        fids, fmask = encode_transcript(tok, prompt + flawed, tools)
        i = next((j for j, (a, b) in enumerate(zip(ids, fids)) if a != b), None)
        if i is None or not (mask[i] and fmask[i]):
            continue  # the flaw changed nothing the model writes (or only after the clean transcript ended)
        out.append(Decision(key, i, ids[i], fids[i]))
    return ids, out


@torch.no_grad()
def flaw_calibration(model: TinyLM, tok: ChatTokenizer, family: str, n: int = 200,
                     seed: int = CALIBRATION_SEED) -> dict[str, FlawCalibration]:
    """Per-flaw calibration of ``model`` on ``n`` generated instances of ``family`` (module docstring)."""
    rates = flaw_rates(family)
    stats = {key: FlawCalibration(key, rate) for key, rate in rates.items()}
    fam = get_family(family)
    for j, inst in enumerate(fam.generate(seed, n)):
        ids, decisions = decision_points(family, inst, tok, seed=f"probe:{j}")
        if not decisions:
            continue
        x = torch.tensor([ids])
        logits = model(x, torch.arange(len(ids))[None], None)[0]
        for d in decisions:
            logp = torch.log_softmax(logits[d.position - 1].float(), dim=-1)
            pf, pc = logp[d.flaw_token].exp().item(), logp[d.clean_token].exp().item()
            top = int(logp.argmax())
            s = stats[d.key]
            s.contexts += 1
            s.p += pf / max(pf + pc, 1e-30)
            s.leave += 1.0 - pc
            s.shows += float(top == d.flaw_token)
            s.clean += float(top == d.clean_token)
    for s in stats.values():
        if s.contexts:
            s.p, s.leave = s.p / s.contexts, s.leave / s.contexts
            s.shows, s.clean = s.shows / s.contexts, s.clean / s.contexts
    return stats


def format_table(family: str, stats: dict[str, FlawCalibration]) -> str:
    head = "rate  contexts  p(flaw)  1-p(clean)  greedy shows  greedy clean"
    lines = [f"{family + ':':<11s}{'flaw':<22} {head}"]
    for s in sorted(stats.values(), key=lambda s: -s.rate):
        if s.contexts:
            lines.append(f"{'':11s}{s.key:<22} {s.rate:.2f}  {s.contexts:8d}  {s.p:7.2f}  {s.leave:10.2f}  "
                         f"{s.shows:12.0%}  {s.clean:12.0%}")
        else:
            lines.append(f"{'':11s}{s.key:<22} {s.rate:.2f}  {0:8d}  (no context among the instances)")
    return "\n".join(lines)


def _measure(model: TinyLM, tok: ChatTokenizer, family: str, n: int) -> tuple[str, Any]:
    stats = flaw_calibration(model, tok, family, n=n)
    return format_table(family, stats), {k: asdict(v) for k, v in stats.items()}


def main(argv: list[str] | None = None) -> int:
    return run_per_family("python -m research.flaw_calibration", __doc__.split("\n\n")[0], 200, _measure,
                          argv)


if __name__ == "__main__":
    raise SystemExit(main())
