"""Calendar family: earliest common free slot of several people, with a ``busy_slots`` tool.

A question names a weekday, a meeting length and 2..5 people ("When is the earliest 60-minute slot
on Tue when p3, p8 and p12 are all free?"). The model calls ``busy_slots`` once per person, then
intersects the free times inside working hours (09:00-17:00, 30-minute grid) and states the start
time. Difficulty (0..1) sets the number of people (2..5 calls). Instances without any common slot
are redrawn. The checker reads the first time after the last "Answer:" (after removing ``<think>``
blocks), normalises it to HH:MM and compares it with the start time: 1.0 or 0.0.
"""

from __future__ import annotations

import json
import random
import re

from task_families.base import Instance, TaskFamily, ToolStep, and_list, answer_text, text_segments
from task_families.calendar import tools

_TIME = re.compile(r"(\d{1,2})\s*[:.h]\s*(\d{2})\s*(am|pm|a\.m\.|p\.m\.)?", re.IGNORECASE)


def parse_time(text: str | None) -> str | None:
    """The first clock time in ``text`` as HH:MM (12-hour times with am/pm are converted)."""
    m = _TIME.search(text or "")
    if m is None:
        return None
    hour, minute = int(m.group(1)), int(m.group(2))
    suffix = (m.group(3) or "").lower()
    if suffix.startswith("p") and hour < 12:
        hour += 12
    elif suffix.startswith("a") and hour == 12:
        hour = 0
    if hour > 23 or minute > 59:
        return None
    return f"{hour:02d}:{minute:02d}"


def looked_up(messages: list[dict]) -> set[str]:
    """The people a conversation's assistant messages called ``busy_slots`` for (structured tool calls;
    calls whose arguments are not a JSON object are skipped)."""
    out: set[str] = set()
    for m in messages:
        if m.get("role") != "assistant":
            continue
        for call in m.get("tool_calls") or []:
            args = (call.get("function") or {}).get("arguments")
            try:
                args = json.loads(args) if isinstance(args, str) else args
            except ValueError:
                continue
            if isinstance(args, dict) and args.get("person") is not None:
                out.add(str(args["person"]))
    return out


def earliest_common_slot(masks: list[list[bool]], minutes: int) -> str | None:
    need = minutes // tools.SLOT
    free = [not any(m[i] for m in masks) for i in range(tools.N_SLOTS)]
    for i in range(tools.N_SLOTS - need + 1):
        if all(free[i:i + need]):
            return tools.hhmm(tools.DAY_START + i * tools.SLOT)
    return None


def shortcuts(masks: list[list[bool]], minutes: int, answer: str) -> tuple[bool, bool]:
    """(the earliest slot of everyone but the last person named is ``answer``, a meeting over 30 minutes
    starts at the first half hour everyone has free): whether stopping before the last call, or ignoring
    the meeting length, would answer the question right."""
    skip = earliest_common_slot(masks[:-1], minutes) == answer
    ignore = minutes > tools.SLOT and earliest_common_slot(masks, tools.SLOT) == answer
    return skip, ignore


#: Which questions the generator keeps. ``natural`` (the eval's, the corpus's): any answerable one;
#: skipping the last person is right on 44-81% of them, by size. For experiments
#: (``research/grpo_lab.py --rule``): ``shortcuts_wrong`` keeps only those both shortcuts get wrong,
#: which makes "the answer is later than the obvious slot" a rule a policy can learn instead of the
#: task (docs/local_models.md); ``balanced`` draws, per question, whether each shortcut is to be right as
#: a fair coin, so that no shortcut pays.
RULES = ("natural", "balanced", "shortcuts_wrong")
_PERSON = re.compile(r"(?<![a-z0-9])p(\d+)(?!\d)")
_DAYS = {**{d.casefold(): d for d in tools.DAYS},
         **{f"{d.casefold()}day": d for d in ("Mon", "Fri")}, "tuesday": "Tue", "wednesday": "Wed",
         "thursday": "Thu", "tues": "Tue", "thur": "Thu", "thurs": "Thu"}
_MINUTES = re.compile(r"(?<![\d.])(\d+)\s*-?\s*(?:minutes?|mins?)\b")
_HOURS = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)\s*-?\s*(?:hours?|hrs?)\b")



class CalendarFamily(TaskFamily):
    name = "calendar"
    title = "Earliest common free slot with a calendar tool"
    goal = ("Teach the base model to find the earliest meeting slot for several people, e.g. 'When is the "
            "earliest 60-minute slot on Tue when p3, p8 and p12 are all free?'. Calendars are only reachable "
            "through the `busy_slots` tool (one call per person and day); the model must call it for every "
            "person, combine the busy intervals within working hours 09:00-17:00, and state the start time "
            "of the first gap long enough for everyone.")
    tools_module = tools
    eval_system_prompt = ("Find the earliest meeting slot. Call busy_slots for every person on the given day, "
                          "find the first time (working hours 09:00-17:00, on the half hour) when all of them "
                          "are free for the whole meeting, then reply with 'Answer: HH:MM'.")
    answer_format = ("the first time after the last 'Answer:' in the model's final message (after any <think> "
                     "block), read as HH:MM, must equal the start of the earliest common free slot; "
                     "score 1 or 0 per question, averaged.")

    def instance_signatures(self, text: str) -> set[str]:
        """A question is its day, its slot length and its set of people: in each clause with a weekday, a
        length (minutes or hours) and two or more person ids, in any order ("p52, p39 and p62" and
        "p62, p39, p52" alike)."""
        found = set()
        for seg in text_segments(text):
            people = sorted(set(_PERSON.findall(seg)), key=int)
            days = {_DAYS[d] for d in re.findall(r"[a-z]+", seg) if d in _DAYS}
            lengths = {int(m) for m in _MINUTES.findall(seg)} | {round(float(h) * 60) for h in _HOURS.findall(seg)}
            if len(people) >= 2 and len(days) == 1 and len(lengths) == 1:
                found.add(f"{days.pop()}|{lengths.pop()}|{','.join('p' + p for p in people)}")
        return found

    def generate_one(self, rng: random.Random, difficulty: float, rule: str = "natural") -> Instance:
        """One question; ``rule`` (:data:`RULES`) other than the eval's ``natural`` is for experiments."""
        if rule not in RULES:
            raise ValueError(f"unknown calendar rule {rule!r}; known: {', '.join(RULES)}")
        k = 2 + round(3 * difficulty)
        durations = {2: [60, 90], 3: [30, 60], 4: [30, 60], 5: [30]}[k]
        want = (rng.random() < 0.5, rng.random() < 0.5) if rule == "balanced" else None
        while True:
            people = [f"p{i}" for i in rng.sample(range(1, tools.N_PEOPLE + 1), k)]
            day = rng.choice(tools.DAYS)
            minutes = rng.choice(durations)
            masks = [tools.busy_mask(p, day) for p in people]
            answer = earliest_common_slot(masks, minutes)
            if answer is None:
                continue
            if rule != "natural":
                skip, ignore = shortcuts(masks, minutes, answer)
                if rule == "shortcuts_wrong" and (skip or ignore):
                    continue
                if want is not None and (skip != want[0] or (minutes > tools.SLOT and ignore != want[1])):
                    continue
            break
        question = (f"When is the earliest {minutes}-minute slot on {day} when {and_list(people)} "
                    f"are {'both' if k == 2 else 'all'} free?")
        return Instance(question=question, answer=answer, difficulty=difficulty,
                        info={"people": people, "day": day, "minutes": minutes, "n_calls": k})

    def solution(self, instance: Instance) -> list[ToolStep]:
        day = instance.info["day"]
        return [ToolStep(name="busy_slots", arguments={"person": p, "day": day}) for p in instance.info["people"]]

    def check(self, instance: Instance, response: str) -> float:
        got = parse_time(answer_text(response))
        return 1.0 if got is not None and got == instance.answer else 0.0

    def perturb_answer(self, instance: Instance, rng: random.Random) -> str:
        h, m = map(int, instance.answer.split(":"))
        t = h * 60 + m + rng.choice([-60, -30, 30, 60, 90])
        t = min(max(t, tools.DAY_START), tools.DAY_END - tools.SLOT)
        return tools.hhmm(t)


FAMILY = CalendarFamily()
