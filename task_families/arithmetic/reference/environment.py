"""Reference environment for the arithmetic family (verifiers 0.2.0 classic API).

Dataset: fresh chained-arithmetic questions like the eval's, generated from this job's own seed, but
weighted toward the longer ones (difficulty 0.3-1: 3-5 operations), where the base model fails most.
Reward: 1.0 for the exact final integer, weighted 0.9, plus 0.1 for calling the calculator at least
once per operation (a correct, tool-using transcript scores 1.0).
"""

from __future__ import annotations

import random
import re

import verifiers as vf
from datasets import Dataset

from family_tools import TOOLS

SYSTEM_PROMPT = ("Solve the arithmetic problem. Use the calculator tool for every operation, "
                 "then reply with the final result as 'Answer: <integer>'.")
_INT = re.compile(r"-?\d+")


def make_question(rng: random.Random, difficulty: float) -> dict:
    n_ops = 2 + round(3 * difficulty)
    add_hi = 20 + round(80 * difficulty)
    mul_hi = 6 + round(6 * difficulty)
    value = rng.randint(1, 20)
    expr = str(value)
    for i in range(n_ops):
        op = rng.choice("+-*")
        b = rng.randint(2, mul_hi) if op == "*" else rng.randint(1, add_hi)
        value = value + b if op == "+" else value - b if op == "-" else value * b
        expr = f"({expr}{op}{b})" if i < n_ops - 1 else f"{expr}{op}{b}"
    return {"question": f"What is {expr}?", "answer": str(value), "info": {"n_ops": n_ops}}


def build_dataset(num_examples: int, seed: int) -> Dataset:
    rng = random.Random(seed)
    return Dataset.from_list([make_question(rng, 0.3 + 0.7 * rng.random()) for _ in range(num_examples)])


def _final_text(completion) -> str:
    for msg in reversed(completion or []):
        if msg["role"] == "assistant" and msg.get("content"):
            text = msg["content"]
            return text.rsplit("</think>", 1)[-1]
    return ""


def correct_answer(completion, answer, **kwargs) -> float:
    found = _INT.findall(_final_text(completion))
    return 1.0 if found and found[-1] == str(answer).strip() else 0.0


def calculator_use(completion, info, **kwargs) -> float:
    calls = sum(len(msg.get("tool_calls") or []) for msg in completion or [] if msg["role"] == "assistant")
    needed = max(1, int((info or {}).get("n_ops", 1)))
    return min(1.0, calls / needed)


def load_environment(num_examples: int = 4000, seed: int = 12345, **kwargs) -> vf.Environment:
    dataset = build_dataset(num_examples, seed)
    rubric = vf.Rubric(funcs=[correct_answer, calculator_use], weights=[0.9, 0.1])
    return vf.ToolEnv(dataset=dataset, tools=TOOLS, rubric=rubric, system_prompt=SYSTEM_PROMPT, max_turns=6)
