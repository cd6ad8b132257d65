"""Inventory family: cheapest single supplier for an order, with ``find_suppliers`` and ``quote`` tools.

A question lists 2 or 3 items with quantities ("Buy 30 bolt and 12 nut from one supplier. Which
supplier is cheapest, and what is the total cost?"). The model calls ``find_suppliers`` once for the
items, then ``quote`` for every supplier it returned (some lack stock), and picks the lowest cost.
Difficulty (0..1) sets the number of candidate suppliers (1..4), so a solution takes 2..5 calls;
the cheapest feasible quote is unique. The checker reads ``supplier=<id>`` and ``cost=<integer>``
after the last "Answer:" (after removing ``<think>`` blocks): 1.0 when both are right, else 0.0.
"""

from __future__ import annotations

import random
import re

from task_families.base import Instance, TaskFamily, ToolStep, and_list, answer_text, order_signatures
from task_families.inventory import tools

_SUPPLIER = re.compile(r"supplier\s*[=:]?\s*(s\d+)", re.IGNORECASE)
_COST = re.compile(r"cost\s*[=:]?\s*\$?\s*(\d+)", re.IGNORECASE)
_ANSWER = re.compile(r"supplier=(s\d+);cost=(\d+)")


def parse_answer(text: str | None) -> tuple[str | None, int | None]:
    """(supplier, cost) from an answer line such as "supplier=s5;cost=412"."""
    text = re.sub(r"(?<=\d),(?=\d{3})", "", text or "")
    s, c = _SUPPLIER.search(text), _COST.search(text)
    return (s.group(1).lower() if s else None), (int(c.group(1)) if c else None)


def order_text(items: list[str], quantities: list[int]) -> str:
    """The order as the question and ``quote`` write it: "30 bolt, 12 nut"."""
    return ", ".join(f"{q} {i}" for i, q in zip(items, quantities))
_ITEM_WORDS = "|".join(sorted((re.escape(i) for i in tools.ITEMS), key=len, reverse=True))
_QTY_ITEM = re.compile(rf"(?<![\d.])(\d+)\s*(?:x\s*|\*\s*)?({_ITEM_WORDS})(?:e?s)?\b")
_ITEM_QTY = re.compile(rf"\b({_ITEM_WORDS})(?:e?s)?\s*(?:x|\*|:|=|\()\s*(\d+)(?![\d.])")



class InventoryFamily(TaskFamily):
    name = "inventory"
    title = "Cheapest supplier for an order, with catalog tools"
    goal = ("Teach the base model to fill an order at the lowest cost, e.g. 'Buy 30 bolt and 12 nut from one "
            "supplier. Which supplier is cheapest, and what is the total cost?'. The market is only reachable "
            "through tools: `find_suppliers` lists who carries all the items, `quote` prices the order at one "
            "supplier (or says what stock is missing). The model must quote every candidate, skip those that "
            "cannot fill the order, and report the cheapest supplier with its cost.")
    tools_module = tools
    eval_system_prompt = ("Find the cheapest single supplier for the order. Call find_suppliers with the items, "
                          "then quote the order at every supplier it lists, then reply with "
                          "'Answer: supplier=<id>;cost=<total>' for the cheapest one that can fill the order.")
    answer_format = ("after the last 'Answer:' in the model's final message (after any <think> block), "
                     "'supplier=<id>;cost=<integer>' must name the cheapest supplier able to fill the whole "
                     "order and its exact total; score 1 or 0 per question, averaged.")

    def instance_signatures(self, text: str) -> set[str]:
        """A question is its order: in each clause, every (quantity, item) pair, written "20 pump", "20 pumps",
        "20 x pump" or "pump x 20" / "pump: 20", in any order; two or more pairs make an order."""
        return order_signatures(text, _QTY_ITEM, _ITEM_QTY)

    def generate_one(self, rng: random.Random, difficulty: float) -> Instance:
        n_candidates = 1 + round(3 * difficulty)
        while True:
            k = rng.randint(2, 3)
            items = rng.sample(tools.ITEMS, k)
            candidates = tools.find_suppliers(", ".join(items))
            if candidates == "none" or len(candidates.split(", ")) != n_candidates:
                continue
            quantities = [rng.randint(2, 60) for _ in items]
            quotes = [tools.quote(s, order_text(items, quantities)) for s in candidates.split(", ")]
            costs = sorted(int(q[5:]) for q in quotes if q.startswith("cost="))
            if not costs or (len(costs) > 1 and costs[0] == costs[1]):
                continue
            break
        suppliers = candidates.split(", ")
        best = suppliers[quotes.index(f"cost={costs[0]}")]
        lines = [f"{q} {i}" for i, q in zip(items, quantities)]
        question = (f"Buy {and_list(lines)} from one supplier. "
                    f"Which supplier is cheapest, and what is the total cost?")
        return Instance(question=question, answer=f"supplier={best};cost={costs[0]}", difficulty=difficulty,
                        info={"items": items, "quantities": quantities, "candidates": suppliers, "quotes": quotes,
                              "n_calls": 1 + len(suppliers)})

    def solution(self, instance: Instance) -> list[ToolStep]:
        info = instance.info
        order = order_text(info["items"], info["quantities"])
        steps = [ToolStep(name="find_suppliers", arguments={"items": ", ".join(info["items"])})]
        steps += [ToolStep(name="quote", arguments={"supplier": s, "order": order}) for s in info["candidates"]]
        return steps

    def check(self, instance: Instance, response: str) -> float:
        want = _ANSWER.fullmatch(instance.answer)
        assert want is not None, instance.answer
        got = parse_answer(answer_text(response))
        return 1.0 if got == (want.group(1), int(want.group(2))) else 0.0

    def perturb_answer(self, instance: Instance, rng: random.Random) -> str:
        want = _ANSWER.fullmatch(instance.answer)
        assert want is not None, instance.answer
        supplier, cost = want.group(1), int(want.group(2))
        others = [s for s in tools.SUPPLIERS if s != supplier]
        if rng.random() < 0.5:
            return f"supplier={rng.choice(others)};cost={cost}"
        return f"supplier={supplier};cost={cost + rng.choice([-20, -5, -1, 1, 5, 20])}"


FAMILY = InventoryFamily()
