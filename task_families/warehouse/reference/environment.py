"""Reference environment for the warehouse family (verifiers 0.2.0, stateful).

The world is per rollout: ``setup_state`` builds it from the row's ``info["world"]`` into
``state["world"]``, and ``update_tool_args`` hands that world to every tool call (``StatefulToolEnv``
hides the ``world`` argument from the model's tool schema; a ``world`` the model sends is overwritten), so
concurrent rollouts never share one. The rubric reads the state the rollout left.

Dataset: fresh orders from the same distribution as the eval (2-3 items, each in 1-3 bins of which one holds
enough), generated from this job's own seed. Reward: 0.9 when the box is sealed holding exactly the order
and the answer is its label, plus 0.1 x the share of the order's lines packed exactly (the state, not the
text: an answer alone earns nothing).
"""

from __future__ import annotations

import random
import re

import verifiers as vf
from datasets import Dataset

from family_tools import BINS, ITEMS, TOOLS, World, box_label, new_world, order_of

SYSTEM_PROMPT = ("Pack the order into one box. For each item call find_item, then pick the ordered "
                 "quantity from a bin that holds enough. When every item is in the box call seal_box "
                 "once, then reply with 'Answer: <label>' using the label seal_box printed.")
_LABEL = re.compile(r"w\s*-?\s*(\d{4})(?!\d)", re.IGNORECASE)


def make_question(rng: random.Random, difficulty: float) -> dict:
    n_items, n_bins = 2 + round(difficulty), 1 + round(2 * difficulty)
    chosen = rng.sample(ITEMS, n_items + 3)
    order = {item: rng.randint(2, 40) for item in chosen[:n_items]}
    bins: dict[str, dict[str, int]] = {b: {} for b in BINS}
    for item, qty in order.items():
        where = rng.sample(BINS, n_bins)
        bins[where[0]][item] = rng.randint(qty, qty + 6)
        for b in where[1:]:
            bins[b][item] = rng.randint(1, qty - 1)
    for item in chosen[n_items:]:
        for b in rng.sample(BINS, rng.randint(1, 2)):
            bins[b][item] = rng.randint(1, 12)
    seed = f"{rng.getrandbits(48):012x}"
    lines = [f"{q} {i}" for i, q in order.items()]
    listed = ", ".join(lines[:-1]) + " and " + lines[-1]
    return {"question": f"Pack {listed} into one box and seal it. What is the box's label?",
            "answer": box_label(seed, order), "info": {"world": {"seed": seed, "bins": bins}, "order": order}}


def build_dataset(num_examples: int, seed: int) -> Dataset:
    rng = random.Random(seed)
    return Dataset.from_list([make_question(rng, rng.random()) for _ in range(num_examples)])


def _label(completion) -> str | None:
    for msg in reversed(completion or []):
        if msg["role"] == "assistant" and msg.get("content"):
            text = msg["content"].rsplit("</think>", 1)[-1]
            idx = text.lower().rfind("answer:")
            m = _LABEL.search(text[idx:]) if idx >= 0 else None
            return f"W-{m.group(1)}" if m else None
    return None


def packed_and_labelled(completion, state, info, **kwargs) -> float:
    world = state.get("world")
    order = order_of((info or {}).get("order"))
    return 1.0 if (isinstance(world, World) and world.sealed and world.box == order
                   and _label(completion) == world.label) else 0.0


def lines_packed(state, info, **kwargs) -> float:
    world = state.get("world")
    order = order_of((info or {}).get("order"))
    if not isinstance(world, World) or not order:
        return 0.0
    return sum(world.box.get(item) == qty for item, qty in order.items()) / len(order)


class WarehouseEnv(vf.StatefulToolEnv):
    """A tool env whose tools act on the rollout's own world."""

    def __init__(self, **kwargs) -> None:
        super().__init__(tools=[], **kwargs)
        for tool in TOOLS:
            self.add_tool(tool, args_to_skip=["world"])

    async def setup_state(self, state: vf.State) -> vf.State:
        state["world"] = new_world(state["info"]["world"])
        return await super().setup_state(state)

    def update_tool_args(self, tool_name: str, tool_args: dict, messages: vf.Messages, state: vf.State,
                         **kwargs) -> dict:
        return {**tool_args, "world": state["world"]}


def load_environment(num_examples: int = 4000, seed: int = 12345, **kwargs) -> vf.Environment:
    dataset = build_dataset(num_examples, seed)
    rubric = vf.Rubric(funcs=[packed_and_labelled, lines_packed], weights=[0.9, 0.1])
    # 9 turns: the longest solution is 3 x (find_item + pick) + seal_box + the answer = 8
    return WarehouseEnv(dataset=dataset, rubric=rubric, system_prompt=SYSTEM_PROMPT, max_turns=9)
