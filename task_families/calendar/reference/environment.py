"""Reference environment for the calendar family (verifiers 0.2.0 classic API).

Dataset: fresh earliest-common-slot questions of the eval's kind (30/60/90-minute meetings, Mon-Fri),
generated from this job's own seed, with difficulty uniform in ``[min_difficulty, max_difficulty]``
(people = 2 + round(3 * difficulty)). By default the hard end, 4-5 people (0.5-1), where an untrained
model mostly forgets to look up the last person. The local backend's reference job (job.local.toml)
takes 2-3 people (0-0.49) instead: its tiny models' long scratchpad does not survive RL's update noise
on 4-5 people, and what training fixes on the short questions carries over.
Reference answers come from parsing the family's own `busy_slots` results. Reward: 1.0 for the right HH:MM
after "Answer:", weighted 0.9, plus 0.1 for calling busy_slots at least once per person
(a correct, tool-using transcript scores 1.0).
"""

from __future__ import annotations

import random
import re

import verifiers as vf
from datasets import Dataset

from family_tools import DAYS, N_PEOPLE, TOOLS, busy_slots

SYSTEM_PROMPT = ("Find the earliest meeting slot. Call busy_slots for every person on the given day, "
                 "find the first time (working hours 09:00-17:00, on the half hour) when all of them "
                 "are free for the whole meeting, then reply with 'Answer: HH:MM'.")
DURATIONS = {2: [60, 90], 3: [30, 60], 4: [30, 60], 5: [30]}
_SPAN = re.compile(r"(\d\d):(\d\d)-(\d\d):(\d\d)")
_TIME = re.compile(r"(\d{1,2})\s*[:.h]\s*(\d{2})\s*([ap])?", re.IGNORECASE)


def busy_minutes(person: str, day: str) -> set[int]:
    """Half-hour starts (minutes since midnight) at which the person is busy."""
    out: set[int] = set()
    for h1, m1, h2, m2 in _SPAN.findall(busy_slots(person, day)):
        out.update(range(int(h1) * 60 + int(m1), int(h2) * 60 + int(m2), 30))
    return out


def earliest_slot(people: list[str], day: str, minutes: int) -> str | None:
    busy = set().union(*(busy_minutes(p, day) for p in people))
    for start in range(9 * 60, 17 * 60 - minutes + 1, 30):
        if not any(t in busy for t in range(start, start + minutes, 30)):
            return f"{start // 60:02d}:{start % 60:02d}"
    return None


def make_question(rng: random.Random, difficulty: float) -> dict:
    k = 2 + round(3 * difficulty)
    while True:
        people = [f"p{i}" for i in rng.sample(range(1, N_PEOPLE + 1), k)]
        day = rng.choice(DAYS)
        minutes = rng.choice(DURATIONS[k])
        answer = earliest_slot(people, day, minutes)
        if answer is not None:
            break
    names = ", ".join(people[:-1]) + " and " + people[-1]
    question = (f"When is the earliest {minutes}-minute slot on {day} when {names} "
                f"are {'both' if k == 2 else 'all'} free?")
    return {"question": question, "answer": answer, "info": {"n_calls": k}}


def build_dataset(num_examples: int, seed: int, min_difficulty: float = 0.5,
                  max_difficulty: float = 1.0) -> Dataset:
    """Questions with difficulty uniform in [min_difficulty, max_difficulty] (0.5-1: 4-5 people;
    0-0.49: 2-3)."""
    if not 0.0 <= min_difficulty <= max_difficulty <= 1.0:
        raise ValueError("need 0 <= min_difficulty <= max_difficulty <= 1, "
                         f"got {min_difficulty}, {max_difficulty}")
    rng = random.Random(seed)
    span = max_difficulty - min_difficulty
    return Dataset.from_list([make_question(rng, min_difficulty + span * rng.random())
                              for _ in range(num_examples)])


def _final_text(completion) -> str:
    for msg in reversed(completion or []):
        if msg["role"] == "assistant" and msg.get("content"):
            text = msg["content"]
            return text.rsplit("</think>", 1)[-1]
    return ""


def correct_answer(completion, answer, **kwargs) -> float:
    text = _final_text(completion)
    idx = text.lower().rfind("answer:")
    if idx < 0:
        return 0.0
    m = _TIME.search(text[idx + len("answer:"):])
    if m is None:
        return 0.0
    hour = int(m.group(1)) + (12 if (m.group(3) or "").lower() == "p" and int(m.group(1)) < 12 else 0)
    return 1.0 if f"{hour:02d}:{m.group(2)}" == str(answer).strip() else 0.0


def tool_use(completion, info, **kwargs) -> float:
    calls = sum(len(msg.get("tool_calls") or []) for msg in completion or [] if msg["role"] == "assistant")
    needed = max(1, int((info or {}).get("n_calls", 2)))
    return min(1.0, calls / needed)


def load_environment(num_examples: int = 4000, seed: int = 12345, min_difficulty: float = 0.5,
                     max_difficulty: float = 1.0, **kwargs) -> vf.Environment:
    dataset = build_dataset(num_examples, seed, min_difficulty, max_difficulty)
    rubric = vf.Rubric(funcs=[correct_answer, tool_use], weights=[0.9, 0.1])
    # 6 turns: the longest solution is 5 tool calls + the answer; prompt + 6 x 256 tokens fits seq_len 2048
    return vf.ToolEnv(dataset=dataset, tools=TOOLS, rubric=rubric, system_prompt=SYSTEM_PROMPT, max_turns=6)
