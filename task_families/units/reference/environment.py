"""Reference environment for the units family (verifiers 0.2.0 classic API).

Dataset: fresh conversion routes from the same distribution as the eval (half unit-conversion
chains over directly related units, half currency-exchange chains; 2-5 legs, mixed difficulty),
generated from this job's own seed; reference answers come from running the route through the
family's own `convert` / `exchange` tools. Reward: 1.0 when the first number after "Answer:" is
within 0.05% of the route's result, weighted 0.9, plus 0.1 for making at least one call per leg
(a correct, tool-using transcript scores 1.0).
"""

from __future__ import annotations

import random
import re

import verifiers as vf
from datasets import Dataset

from family_tools import CURRENCIES, NEIGHBORS, TOOLS, UNITS, convert, exchange

SYSTEM_PROMPT = ("Follow the route in the question: one convert (units) or exchange (money) call per "
                 "leg, feeding each result into the next. Reply 'Answer: <number>'.")
_NUM = re.compile(r"-?\d+(?:\.\d+)?")


def _as_number(text: str):
    x = float(text)
    return int(x) if x.is_integer() else x


def _unit_route(rng: random.Random, legs: int):
    while True:
        route = [rng.choice(UNITS)]
        while len(route) <= legs:
            options = [u for u in NEIGHBORS[route[-1]] if u not in route]
            if not options:
                break
            route.append(rng.choice(options))
        if len(route) > legs:
            return route


def make_question(rng: random.Random, difficulty: float) -> dict:
    legs = 2 + round(3 * difficulty)
    kind = rng.choice(["unit", "money"])
    while True:
        if kind == "unit":
            route = _unit_route(rng, legs)
            start = _as_number(str(rng.choice([rng.randint(2, 999), rng.randint(20, 2500) / 10])))
            tool, verb = convert, "Convert"
        else:
            route = rng.sample(CURRENCIES, legs + 1)
            start = rng.randint(10, 2000)
            tool, verb = exchange, "Exchange"
        value, ok = start, True
        for a, b in zip(route, route[1:]):
            value = _as_number(tool(value, a, b).split()[0])
            if not 0.01 <= abs(value) <= 1e6:
                ok = False
                break
        if ok:
            break
    question = f"{verb} {start} {route[0]} to {route[1]}" + "".join(f", then to {u}" for u in route[2:]) + "."
    return {"question": question, "answer": str(value), "info": {"n_calls": legs}}


def build_dataset(num_examples: int, seed: int) -> Dataset:
    rng = random.Random(seed)
    return Dataset.from_list([make_question(rng, rng.random()) for _ in range(num_examples)])


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
    rest = re.sub(r"(?<=\d),(?=\d{3})", "", text[idx + len("answer:"):])
    found = _NUM.findall(rest)
    if not found:
        return 0.0
    got, want = float(found[0]), float(answer)
    return 1.0 if abs(got - want) <= max(0.011, 5e-4 * abs(want)) else 0.0


def tool_use(completion, info, **kwargs) -> float:
    calls = sum(len(msg.get("tool_calls") or []) for msg in completion or [] if msg["role"] == "assistant")
    needed = max(1, int((info or {}).get("n_calls", 2)))
    return min(1.0, calls / needed)


def load_environment(num_examples: int = 4000, seed: int = 12345, **kwargs) -> vf.Environment:
    dataset = build_dataset(num_examples, seed)
    rubric = vf.Rubric(funcs=[correct_answer, tool_use], weights=[0.9, 0.1])
    # 6 turns: the longest solution is 5 tool calls + the answer; prompt + 6 x 256 tokens fits seq_len 2048
    return vf.ToolEnv(dataset=dataset, tools=TOOLS, rubric=rubric, system_prompt=SYSTEM_PROMPT, max_turns=6)
