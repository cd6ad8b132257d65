"""Where a built model's *skill* fails: teacher-forced accuracy of each kind of line it writes.

The flaw calibration (:mod:`research.flaw_calibration`) measures habits; this measures skills. Contract of
:func:`line_accuracy`: for ``n`` generated instances of a family it renders the teacher's clean
transcript (no flaw), splits every assistant message into lines (a tool call is one line, kind
``<tool_call>``) and names each line by its first word (``left:``, ``busy:``, ``Answer:``; calendar's
``busy 60:`` is ``busy:``) and by whether it is the first line of that kind in the transcript or a later
one. One teacher-forced forward pass per transcript gives the model's most likely token at every
position; a line is *right* when every one of its tokens is the most likely one given the clean prefix.
A kind's accuracy is the share of its lines that are right: what greedy decoding reproduces of that
step when everything before it was correct. Low accuracy on one kind points at the sub-skill the
corpus should make easier.

CLI: ``python -m research.line_accuracy --model ait-tiny-m --families calendar [--n 150]``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch

from cpu.tiny_models.chat import IM_END
from cpu.tiny_models.corpus import assistant_spans
from cpu.tiny_models.model import TinyLM
from cpu.tiny_models.tokenizer import ChatTokenizer
from research.model_cli import run_per_family
from task_families import get_family
from task_families.teacher import teacher_completion

#: Seed of the instances (apart from the corpus's and the hidden sets').
SKILL_SEED = 5_400_000


def _kind(line: str) -> str:
    line = line.strip()
    if line.startswith("<tool_call>"):
        return "<tool_call>"
    head = line.split()[0] if line.split() else ""
    if re.match(r"\d\d", head):
        return "listing"
    tagged = re.match(r"([A-Za-z]+) \d+:", line)  # calendar's lines carry the meeting length: "busy 60:"
    if tagged:
        return tagged.group(1) + ":"
    return head if head.endswith(":") else "(text)"


def line_spans(text: str, spans: list[tuple[int, int]]) -> list[tuple[str, int, int]]:
    """(kind, start, end) character spans of the lines inside the assistant spans of ``text``; a tool
    call block (``<tool_call>`` ... ``</tool_call>``) is one line."""
    out: list[tuple[str, int, int]] = []
    for a, b in spans:
        i = a
        while i < b:
            if text.startswith("<tool_call>", i):
                j = text.find("</tool_call>", i)
                j = b if j < 0 else min(b, j + len("</tool_call>"))
            else:
                j = text.find("\n", i, b)
                j = b if j < 0 else j + 1
            if text[i:j].strip() and text[i:j].strip() != IM_END:  # the end of a call message is not a line
                out.append((_kind(text[i:j]), i, j))
            i = j
    return out


@dataclass
class Transcript:
    """One clean teacher transcript, tokenized: its ids and, per line the model writes, the line's kind
    (``"<kind> first"`` / ``"<kind> later"``) and the positions of its tokens."""

    ids: list[int]
    lines: list[tuple[str, list[int]]]


@dataclass
class LineResult:
    """A line under teacher forcing: its kind key, whether greedy decoding reproduces it (every token
    the most likely one) and its *margin*: the smallest, over its tokens, of the teacher token's logit
    minus the best other logit (negative when a token is not the most likely one)."""

    key: str
    right: bool
    margin: float


def transcripts(tok: ChatTokenizer, family: str, n: int = 150, seed: int = SKILL_SEED) -> list[Transcript]:
    """The ``n`` clean teacher transcripts of ``family``, tokenized and split into lines."""
    fam = get_family(family)
    tools = fam.tool_schemas()
    out: list[Transcript] = []
    for j, inst in enumerate(fam.generate(seed, n)):
        comp, _ = teacher_completion(family, inst, mode="clean", seed=f"skill:{j}")
        text, spans = assistant_spans(fam.eval_messages(inst) + comp, tools)
        enc = tok.tok.encode(text, add_special_tokens=False)
        starts = [a for a, _ in enc.offsets]
        seen: set[str] = set()
        lines: list[tuple[str, list[int]]] = []
        t = 0
        for kind, a, b in line_spans(text, spans):
            while t < len(starts) and starts[t] < a:
                t += 1
            toks = []
            while t < len(starts) and starts[t] < b:
                toks.append(t)
                t += 1
            if toks:
                lines.append((f"{kind} {'later' if kind in seen else 'first'}", toks))
                seen.add(kind)
        out.append(Transcript(list(enc.ids), lines))
    return out


@torch.no_grad()
def score_lines(model: TinyLM, items: list[Transcript]) -> list[list[LineResult]]:
    """Per transcript, per line: one teacher-forced pass of ``model`` (see :class:`LineResult`)."""
    out: list[list[LineResult]] = []
    for tr in items:
        ids = torch.tensor([tr.ids])
        logits = model(ids, torch.arange(len(tr.ids))[None], None)[0].float()
        # margin of token t (t >= 1) is read at position t - 1
        gold = logits[:-1].gather(1, ids[0, 1:, None])[:, 0]
        other = logits[:-1].scatter(1, ids[0, 1:, None], float("-inf")).max(-1).values
        margin = [float("inf")] + (gold - other).tolist()
        weakest = [(key, min(margin[i] for i in toks)) for key, toks in tr.lines]
        out.append([LineResult(key, m > 0, m) for key, m in weakest])
    return out


def line_accuracy(model: TinyLM, tok: ChatTokenizer, family: str, n: int = 150,
                  seed: int = SKILL_SEED) -> dict[str, tuple[int, int]]:
    """{"<kind> first" | "<kind> later": (right, total)} over ``n`` clean transcripts (module docstring)."""
    counts: dict[str, list[int]] = {}
    for lines in score_lines(model, transcripts(tok, family, n, seed)):
        for r in lines:
            c = counts.setdefault(r.key, [0, 0])
            c[0] += r.right
            c[1] += 1
    return {k: (v[0], v[1]) for k, v in sorted(counts.items())}


def format_table(family: str, acc: dict[str, tuple[int, int]]) -> str:
    lines = [f"{family + ':':<11s}{'line':<22} right / lines  accuracy"]
    lines += [f"{'':11s}{k:<22} {r:5d} / {t:<5d}  {r / t:8.0%}" for k, (r, t) in acc.items()]
    return "\n".join(lines)


def _measure(model: TinyLM, tok: ChatTokenizer, family: str, n: int) -> tuple[str, Any]:
    stats = line_accuracy(model, tok, family, n=n)
    return format_table(family, stats), stats


def main(argv: list[str] | None = None) -> int:
    return run_per_family("python -m research.line_accuracy", __doc__.split("\n\n")[0], 150, _measure, argv)


if __name__ == "__main__":
    raise SystemExit(main())
