"""The flawed teachers at a glance: every family's flaw table, the greedy oracle's ladder on the hidden
sets (:func:`task_families.teacher.oracle_ladder`: the score a perfectly skilled, perfectly calibrated
base model would reach as the visible flaws are fixed one by one) and the statistics of a small corpus.

    python -m research.corpus_report [--per-family 300]
"""

from __future__ import annotations

import argparse
import json

from cpu.tiny_models.corpus import build_corpus
from ait_env.hidden.secrets import hidden_set
from task_families import FAMILY_NAMES
from task_families.teacher import describe_flaws, oracle_ladder


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-family", type=int, default=300, help="transcripts per family of the corpus sample")
    args = ap.parse_args(argv)
    print(describe_flaws())
    for family in FAMILY_NAMES:
        ladder = oracle_ladder(family, hidden_set(family))
        print(family, " -> ".join(f"{score:.2f}" for _, score in ladder))
    print(json.dumps(build_corpus(args.per_family).stats(), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
