"""Warehouse family (stateful): pack an order into one box by acting on a world of bins, then seal it.

A question lists 2 or 3 items with quantities ("Pack 4 mug and 2 lamp into one box and seal it. What is the
box's label?"). Each episode gets its own world (:func:`task_families.warehouse.tools.new_world` from
``info["world"]``): six bins of stock, an open box. The model calls ``find_item`` for each item, ``pick``\\ s
the ordered quantity from a bin that holds enough (picks cannot be undone: too many, or the wrong item,
ruins the box), ``seal_box`` once everything is in (irreversible: an early seal loses the rest), and answers
the label ``seal_box`` printed. A correct episode makes at least three state-changing calls in that order.

Difficulty (0..1) sets the number of items (2..3) and how many bins hold each (1..3; only one holds
enough, the others too few, so the model must read the counts). The score is 1.0 when the **final state**
is right (the box sealed, holding exactly the order) **and** the answer after the last "Answer:" is that
box's label; otherwise 0.0. The label is a hash of the world's secret seed and the box's contents, so it
cannot be right without sealing the right box in that world.
"""

from __future__ import annotations

import random
import re
from typing import Any

from task_families.base import Instance, TaskFamily, ToolStep, and_list, answer_text, order_signatures
from task_families.warehouse import tools

_LABEL = re.compile(r"w\s*-?\s*(\d{4})(?!\d)", re.IGNORECASE)
_ITEM_WORDS = "|".join(sorted((re.escape(i) for i in tools.ITEMS), key=len, reverse=True))
_QTY_ITEM = re.compile(rf"(?<![\d.])(\d+)\s*(?:x\s*|\*\s*)?({_ITEM_WORDS})s?\b")
_ITEM_QTY = re.compile(rf"\b({_ITEM_WORDS})s?\s*(?:x|\*|:|=|\()\s*(\d+)(?![\d.])")


def parse_label(text: str | None) -> str | None:
    """The box label in an answer line ("W-0421", "w 0421", "W0421"), normalised to ``W-0421``."""
    m = _LABEL.search(text or "")
    return f"W-{m.group(1)}" if m else None


class WarehouseFamily(TaskFamily):
    name = "warehouse"
    title = "Pack and seal an order in a warehouse whose state the tools change"
    goal = ("Teach the base model to pack an order into one box by acting on a small warehouse, e.g. 'Pack 4 "
            "mug and 2 lamp into one box and seal it. What is the box's label?'. Each question has its own "
            "world, reachable only through tools that change it: `find_item` lists the bins holding an item "
            "and their counts (most stock first), `pick` moves items from a bin into the box (no way back: a "
            "wrong pick ruins the box), `seal_box` closes the box and prints its label (nothing can be packed "
            "after). The score "
            "reads the final state (the box sealed with exactly the order) and the label in the answer.")
    tools_module = tools
    state_args = tools.STATE_ARGS
    eval_system_prompt = ("Pack the order into one box. For each item call find_item, then pick the ordered "
                          "quantity from a bin that holds enough. When every item is in the box call seal_box "
                          "once, then reply with 'Answer: <label>' using the label seal_box printed.")
    answer_format = ("the episode's final state is read: 1 when the box is sealed holding exactly the ordered "
                     "items and the last 'Answer:' of the final message (after any <think> block) is that box's "
                     "label (e.g. 'W-0421'), else 0; averaged over questions.")
    eval_max_turns = 10

    def instance_signatures(self, text: str) -> set[str]:
        """A question is its order: in each clause, every (quantity, item) pair ("4 mug", "4 mugs", "4 x mug",
        "mug: 4"), in any order; two or more pairs make an order."""
        return order_signatures(text, _QTY_ITEM, _ITEM_QTY)

    def generate_one(self, rng: random.Random, difficulty: float) -> Instance:
        n_items = 2 + round(difficulty)
        n_bins = 1 + round(2 * difficulty)
        chosen = rng.sample(tools.ITEMS, n_items + 3)
        order = {item: rng.randint(2, 40) for item in chosen[:n_items]}
        bins: dict[str, dict[str, int]] = {b: {} for b in tools.BINS}
        source = {}
        for item, qty in order.items():
            where = rng.sample(tools.BINS, n_bins)
            bins[where[0]][item] = rng.randint(qty, qty + 6)
            source[item] = where[0]
            for b in where[1:]:
                bins[b][item] = rng.randint(1, qty - 1)
        for item in chosen[n_items:]:
            for b in rng.sample(tools.BINS, rng.randint(1, 2)):
                bins[b][item] = rng.randint(1, 12)
        seed = f"{rng.getrandbits(48):012x}"
        lines = [f"{q} {i}" for i, q in order.items()]
        question = f"Pack {and_list(lines)} into one box and seal it. What is the box's label?"
        return Instance(question=question, answer=tools.box_label(seed, order), difficulty=difficulty,
                        info={"world": {"seed": seed, "bins": bins}, "order": order, "source": source,
                              "n_calls": 2 * n_items + 1})

    def new_world(self, instance: Instance) -> tools.World:
        return tools.new_world(instance.info["world"])

    def job_info(self, instance: Instance) -> dict[str, Any]:
        return {"world": instance.info["world"], "order": instance.info["order"]}

    def solution(self, instance: Instance) -> list[ToolStep]:
        info = instance.info
        steps = []
        for item, qty in info["order"].items():
            steps.append(ToolStep(name="find_item", arguments={"item": item}))
            steps.append(ToolStep(name="pick", arguments={"bin": info["source"][item], "item": item,
                                                          "quantity": qty}))
        steps.append(ToolStep(name="seal_box", arguments={}))
        return steps

    def check(self, instance: Instance, response: str) -> float:
        """The answer alone: the label of the right box. :meth:`score` also requires the world's state."""
        return 1.0 if parse_label(answer_text(response)) == instance.answer else 0.0

    def state_ok(self, instance: Instance, world: Any) -> bool:
        """Whether ``world`` ends as a correct episode leaves it: sealed, holding exactly the order."""
        return (isinstance(world, tools.World) and world.sealed
                and world.box == {k: int(v) for k, v in instance.info["order"].items()}
                and world.label == instance.answer)

    def score(self, instance: Instance, response: str, world: Any = None) -> float:
        return self.check(instance, response) if self.state_ok(instance, world) else 0.0

    def perturb_answer(self, instance: Instance, rng: random.Random) -> str:
        digits = int(instance.answer[2:])
        return f"W-{(digits + rng.choice([1, 7, 10, 100, 1000, 4321])) % 10_000:04d}"


FAMILY = WarehouseFamily()
