"""The command line of the per-family model analyses (:mod:`research.flaw_calibration`,
:mod:`research.line_accuracy`).

Contract of :func:`run_per_family`: ``--model`` is a catalog name (built first when missing or stale)
or a model directory (:func:`load_model_arg`, which the other research tools that take ``--model``
share); for each of ``--families`` it calls ``measure(model, tokenizer, family, n)``, which returns (a
printable table, JSON-serialisable numbers), prints the table at once and, with ``--json``, writes
``{family: numbers}`` to that file at the end. One thread, so an analysis is cheap next to a build.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Callable

import torch

from cpu.tiny_models.model import TinyLM
from cpu.tiny_models.tokenizer import ChatTokenizer
from task_families import FAMILY_NAMES

Measure = Callable[[TinyLM, ChatTokenizer, str, int], tuple[str, Any]]


def load_model_arg(model: str) -> tuple[TinyLM, ChatTokenizer, Path]:
    """A ``--model`` argument: a model directory, or a catalog name (built first when missing or
    stale). Returns the model in eval mode, its tokenizer and the directory."""
    path = Path(model)
    if not path.is_dir():
        from cpu.tiny_models.build import ensure_built

        path = ensure_built(model)
    loaded = TinyLM.load(path)
    loaded.eval()
    return loaded, ChatTokenizer.load(path), path


def run_per_family(prog: str, description: str, default_n: int, measure: Measure,
                   argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=prog, description=description)
    ap.add_argument("--model", required=True, help="catalog name (ait-tiny-m) or a model directory")
    ap.add_argument("--families", default=",".join(FAMILY_NAMES))
    ap.add_argument("--n", type=int, default=default_n, help="generated instances per family")
    ap.add_argument("--json", type=Path, default=None, help="also write the numbers to this file")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    model, tok, _ = load_model_arg(args.model)
    out: dict[str, Any] = {}
    for fam in args.families.split(","):
        table, out[fam] = measure(model, tok, fam, args.n)
        print(table, flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0
