"""Reference environment for the inventory family (verifiers 0.2.0 classic API).

Dataset: fresh orders from the same distribution as the eval (2-3 items, 1-4 candidate suppliers,
so 2-5 tool calls, mixed difficulty), generated from this job's own seed; reference answers come
from the family's own `find_suppliers` and `quote` tools (cheapest feasible quote, never a tie).
Reward: 1.0 when both supplier and cost after "Answer:" are right, weighted 0.9, plus 0.1 for
making at least the calls a full solution needs (a correct, tool-using transcript scores 1.0).
"""

from __future__ import annotations

import random
import re

import verifiers as vf
from datasets import Dataset

from family_tools import ITEMS, TOOLS, find_suppliers, quote

SYSTEM_PROMPT = ("Find the cheapest single supplier for the order. Call find_suppliers with the items, "
                 "then quote the order at every supplier it lists, then reply with "
                 "'Answer: supplier=<id>;cost=<total>' for the cheapest one that can fill the order.")
_SUPPLIER = re.compile(r"supplier\s*[=:]?\s*(s\d+)", re.IGNORECASE)
_COST = re.compile(r"cost\s*[=:]?\s*\$?\s*(\d+)", re.IGNORECASE)


def make_question(rng: random.Random, difficulty: float) -> dict:
    n_candidates = 1 + round(3 * difficulty)
    while True:
        items = rng.sample(ITEMS, rng.randint(2, 3))
        found = find_suppliers(", ".join(items))
        suppliers = [] if found == "none" else found.split(", ")
        if len(suppliers) != n_candidates:
            continue
        qty = [rng.randint(2, 60) for _ in items]
        order = ", ".join(f"{q} {i}" for i, q in zip(items, qty))
        costs = {}
        for s in suppliers:
            out = quote(s, order)
            if out.startswith("cost="):
                costs[s] = int(out[len("cost="):])
        ranked = sorted(costs.items(), key=lambda kv: kv[1])
        if not ranked or (len(ranked) > 1 and ranked[0][1] == ranked[1][1]):
            continue
        break
    lines = [f"{q} {i}" for i, q in zip(items, qty)]
    listed = ", ".join(lines[:-1]) + " and " + lines[-1]
    question = f"Buy {listed} from one supplier. Which supplier is cheapest, and what is the total cost?"
    best, cost = ranked[0]
    return {"question": question, "answer": f"supplier={best};cost={cost}",
            "info": {"n_calls": 1 + len(suppliers)}}


def build_dataset(num_examples: int, seed: int) -> Dataset:
    rng = random.Random(seed)
    return Dataset.from_list([make_question(rng, rng.random()) for _ in range(num_examples)])


def _final_text(completion) -> str:
    for msg in reversed(completion or []):
        if msg["role"] == "assistant" and msg.get("content"):
            text = msg["content"]
            return text.rsplit("</think>", 1)[-1]
    return ""


def _parse(text: str):
    text = re.sub(r"(?<=\d),(?=\d{3})", "", text)
    s, c = _SUPPLIER.search(text), _COST.search(text)
    return (s.group(1).lower() if s else None), (int(c.group(1)) if c else None)


def correct_answer(completion, answer, **kwargs) -> float:
    text = _final_text(completion)
    idx = text.lower().rfind("answer:")
    if idx < 0:
        return 0.0
    rest = text[idx + len("answer:"):].strip()
    got = _parse(rest.splitlines()[0] if rest else "")
    return 1.0 if got != (None, None) and got == _parse(str(answer)) else 0.0


def tool_use(completion, info, **kwargs) -> float:
    calls = sum(len(msg.get("tool_calls") or []) for msg in completion or [] if msg["role"] == "assistant")
    needed = max(1, int((info or {}).get("n_calls", 2)))
    return min(1.0, calls / needed)


def load_environment(num_examples: int = 4000, seed: int = 12345, **kwargs) -> vf.Environment:
    dataset = build_dataset(num_examples, seed)
    rubric = vf.Rubric(funcs=[correct_answer, tool_use], weights=[0.9, 0.1])
    # 6 turns: the longest solution is 5 tool calls + the answer; prompt + 6 x 256 tokens fits seq_len 2048
    return vf.ToolEnv(dataset=dataset, tools=TOOLS, rubric=rubric, system_prompt=SYSTEM_PROMPT, max_turns=6)
