"""Arithmetic family: evaluate a left-nested chain of +, -, * operations with a calculator tool.

Difficulty (0..1) sets the chain length (2..5 operations) and the operand ranges. The checker takes
the last integer in the model's final message (after removing ``<think>`` blocks) and compares it
with the exact value: score 1.0 or 0.0.
"""

from __future__ import annotations

import random
import re

from task_families.arithmetic import tools
from task_families.base import Instance, TaskFamily, ToolStep, strip_think

_INT = re.compile(r"-?\d+")
#: operator words and signs, as the leak check reads them (after case folding)
_OP_WORDS = (("multiplied by", "*"), ("times", "*"), ("plus", "+"), ("minus", "-"), ("\u00b7", "*"), ("x", "*"))
_TOKEN = re.compile(r"\d+(?:\.\d+)?|[+\-*]|[()\[\]{}\s]+|.")


def last_integer(text: str) -> int | None:
    found = _INT.findall(re.sub(r"(?<=\d),(?=\d{3})", "", strip_think(text)))
    return int(found[-1]) if found else None


class ArithmeticFamily(TaskFamily):
    name = "arithmetic"
    title = "Chained arithmetic with a calculator"
    goal = ("Teach the base model to answer chained integer arithmetic questions such as "
            "'What is (((3*8)+19)-17)*4?' exactly. Small models get such chains wrong when they compute "
            "in their head; the calculator tool is exact, but the model must call it step by step, copy "
            "intermediate results correctly and state the final integer.")
    tools_module = tools
    eval_system_prompt = ("Solve the arithmetic problem. Use the calculator tool for every operation, "
                          "then reply with the final result as 'Answer: <integer>'.")
    answer_format = ("the last integer in the model's final message (after any <think> block) must equal "
                     "the exact value; score 1 or 0 per question, averaged.")

    def instance_signatures(self, text: str) -> set[str]:
        """A question is its chain of operands and operators: ``(((4+9)+45)+43)``, ``4 + 9 + 45 + 43`` and
        ``4 plus 9 plus 45 plus 43`` are one instance (the chain is always evaluated left to right). Each
        maximal chain of two or more operations in ``text`` is one signature."""
        for word, op in _OP_WORDS:
            pattern = rf"(?<=\d)\s*{re.escape(word)}\s*(?=[\d(])" if word == "x" else rf"\s*\b{re.escape(word)}\b\s*"
            text = re.sub(pattern, op, text)
        found: set[str] = set()
        chain: list[str] = []

        def close() -> None:
            while chain and not chain[-1][0].isdigit():  # a chain ends on a number
                chain.pop()
            if sum(1 for t in chain if not t[0].isdigit()) >= 2:
                found.add("".join(chain))
            chain.clear()

        for tok in _TOKEN.findall(text):
            if tok[0].isdigit():
                if chain and chain[-1][0].isdigit():  # two numbers in a row: a new chain
                    close()
                if "." in tok:  # not an integer chain
                    close()
                    continue
                chain.append(tok)
            elif tok in "+-*":
                if not chain or not chain[-1][0].isdigit():
                    close()
                    continue
                chain.append(tok)
            elif tok.strip() and tok not in "()[]{}" and not set(tok) <= set("()[]{} \t\n\r"):
                close()
        close()
        return found

    def generate_one(self, rng: random.Random, difficulty: float) -> Instance:
        n_ops = 2 + round(3 * difficulty)
        add_hi = 20 + round(80 * difficulty)
        mul_hi = 6 + round(6 * difficulty)
        value = rng.randint(1, 20)
        expr = str(value)
        steps = []
        for i in range(n_ops):
            op = rng.choice("+-*")
            b = rng.randint(2, mul_hi) if op == "*" else rng.randint(1, add_hi)
            new = value + b if op == "+" else value - b if op == "-" else value * b
            steps.append(f"{value}{op}{b}")
            expr = f"({expr}{op}{b})" if i < n_ops - 1 else f"{expr}{op}{b}"
            value = new
        return Instance(question=f"What is {expr}?", answer=str(value),
                        info={"expression": expr, "steps": steps, "n_ops": n_ops}, difficulty=difficulty)

    def solution(self, instance: Instance) -> list[ToolStep]:
        return [ToolStep(name="calculator", arguments={"expression": e}) for e in instance.info["steps"]]

    def check(self, instance: Instance, response: str) -> float:
        got = last_integer(response)
        return 1.0 if got is not None and str(got) == instance.answer.strip() else 0.0


FAMILY = ArithmeticFamily()
