"""Where a local model's calendar score goes: each wrong greedy answer on the hidden set, put in one
bucket by what the transcript shows, printed as shares of all questions.

    python -m research.calendar_errors --model ait-tiny-m        # or a model directory (grpo_lab --save)
    python -m research.calendar_errors --model ait-tiny-m --force-lookup   # the forgetting habit off

Buckets (:func:`classify`, first match wins):

- ``right``;
- ``pm``: the answer is written as ``2 pm`` / ``half past 2`` (the checker cannot read it);
- ``label``: the answer is the walk's label of the slot (``10h``, ``14``) instead of a clock time (the
  checker cannot read it either);
- ``forgot, slot without them``: not everyone was looked up, and the answer is exactly the earliest
  slot of the people who were (the habit, with the rest of the work right);
- ``forgot, other``: not everyone was looked up, and the answer is not even that;
- ``ignored length``: everyone was looked up and the answer is the first common free *half hour*,
  though the meeting is longer (the walk stopped at its first free mark);
- ``no time``: no readable time after ``Answer:``;
- ``slip``: everyone was looked up and the answer is some other wrong time (a scratchpad error).

``pm``, ``label``, the two ``forgot`` buckets and ``ignored length`` show habits the corpus teaches
(``task_families/calendar/teacher.py``) that a perfectly skilled model could unlearn; ``slip`` is lost skill.
The last lines give right / total per question size and meeting length.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter

import torch

from cpu.tiny_models.quick_eval import Conversation, score_in_process as evaluate
from research.model_cli import load_model_arg
from task_families.base import Instance
from task_families.calendar import tools as ctools
from task_families.calendar.family import (
    answer_text, earliest_common_slot, looked_up, parse_time)
from task_families.teacher import teacher_completion

BUCKETS = ("right", "pm", "label", "forgot, slot without them", "forgot, other", "ignored length", "no time",
           "slip")


def classify(conv: Conversation) -> str:
    """The bucket of one finished conversation (module docstring)."""
    if conv.score >= 1.0:
        return "right"
    info = conv.instance.info
    ans = answer_text(conv.final_text)
    if ans and re.search(r"\bpm\b|half past", ans, re.IGNORECASE):
        return "pm"
    if ans and re.fullmatch(r"\d\dh?\.?", ans.strip()):
        return "label"
    got = parse_time(ans)
    called = looked_up(conv.messages)
    seen = [p for p in info["people"] if p in called]
    if len(seen) < len(info["people"]):
        masks = [ctools.busy_mask(p, info["day"]) for p in seen]
        without = earliest_common_slot(masks, info["minutes"]) if masks else None
        return "forgot, slot without them" if got is not None and got == without else "forgot, other"
    if got is None:
        return "no time"
    first_half = earliest_common_slot([ctools.busy_mask(p, info["day"]) for p in info["people"]], ctools.SLOT)
    if info["minutes"] > ctools.SLOT and got == first_half:
        return "ignored length"
    return "slip"


def full_lookup_line(inst: Instance) -> str:
    """The first scratchpad line of the clean teacher (no flaw taken, so nobody forgotten), e.g.
    ``left 60: p8 p12``: the line the forgetting habit shortens."""
    comp, _ = teacher_completion("calendar", inst, mode="clean")
    first = next(m for m in comp if m["role"] == "assistant")
    return first["content"].split("\n", 1)[0] + "\n"


def census(convs: list[Conversation]) -> tuple[Counter[str], dict[str, tuple[int, int]]]:
    """(bucket counts, {"<k>p <m>min": (right, total)})."""
    buckets: Counter[str] = Counter()
    by: dict[str, list[int]] = {}
    for c in convs:
        b = classify(c)
        buckets[b] += 1
        key = f"{len(c.instance.info['people'])}p {c.instance.info['minutes']}min"
        cell = by.setdefault(key, [0, 0])
        cell[0] += b == "right"
        cell[1] += 1
    return buckets, {k: (v[0], v[1]) for k, v in sorted(by.items())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="ait-tiny-m",
                    help="catalog name (built first when missing) or a model directory")
    ap.add_argument("--limit", type=int, default=None, help="only the first N hidden questions")
    ap.add_argument("--rule", default=None,
                    help="bucket the questions the hidden seed draws under this generator rule (balanced, "
                         "shortcuts_wrong) instead of the hidden set")
    ap.add_argument("--force-lookup", action="store_true",
                    help="start each first reply with the teacher's full list of the people still to look up "
                         "(the forgetting habit switched off), to measure what the rest of the skill gives")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    model, tok, path = load_model_arg(args.model)
    instances = None
    if args.rule:
        from ait_env.hidden.secrets import hidden_seed
        from task_families.calendar.family import FAMILY

        instances = FAMILY.hidden_eval(hidden_seed("calendar"), rule=args.rule)
    summary, convs = evaluate(model, tok, "calendar", instances, limit=args.limit, return_conversations=True,
                              prefill=full_lookup_line if args.force_lookup else None)
    buckets, by = census(convs)
    forced = ", first line forced to look everyone up" if args.force_lookup else ""
    drawn = f" (rule {args.rule})" if args.rule else ""
    print(f"{path}: calendar {summary.score:.3f} on {len(convs)} hidden questions{drawn}{forced}")
    for b in BUCKETS:
        print(f"  {b:<28}{buckets[b]:5d}  {buckets[b] / len(convs):6.3f}")
    print("  right by size: " + ", ".join(f"{k} {r}/{t}" for k, (r, t) in by.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
