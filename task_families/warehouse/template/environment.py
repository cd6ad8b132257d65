"""Training environment for this job (verifiers 0.2.0 classic API, stateful).

prime-rl imports this module and calls ``load_environment(**env)`` with the ``[env]`` table of
job.toml. The tools change a world: make one per rollout (``setup_state``) and inject it into every
tool call (``update_tool_args``); never keep it in a module global.
"""

from __future__ import annotations

import random

import verifiers as vf
from datasets import Dataset

from family_tools import TOOLS, new_world

SYSTEM_PROMPT = ("Pack the order into one box. For each item call find_item, then pick the ordered "
                 "quantity from a bin that holds enough. When every item is in the box call seal_box "
                 "once, then reply with 'Answer: <label>' using the label seal_box printed.")


def build_dataset(num_examples: int, seed: int) -> Dataset:
    """Rows with 'question', 'answer' and 'info' ({"world": {"seed": ..., "bins": {...}}, "order": {...}}).
    TODO: generate worlds and orders like the dev examples (family_tools.box_label gives the label)."""
    rng = random.Random(seed)
    rows: list[dict] = []
    return Dataset.from_list(rows)


def reward_packed(completion, state, info, **kwargs) -> float:
    """TODO: 1.0 when state["world"] is sealed holding exactly info["order"] and the answer is its label."""
    return 0.0


class WarehouseEnv(vf.StatefulToolEnv):
    def __init__(self, **kwargs) -> None:
        super().__init__(tools=[], **kwargs)
        for tool in TOOLS:
            self.add_tool(tool, args_to_skip=["world"])

    async def setup_state(self, state: vf.State) -> vf.State:
        state["world"] = new_world(state["info"]["world"])  # one world per rollout
        return await super().setup_state(state)

    def update_tool_args(self, tool_name: str, tool_args: dict, messages: vf.Messages, state: vf.State,
                         **kwargs) -> dict:
        return {**tool_args, "world": state["world"]}


def load_environment(num_examples: int = 1000, seed: int = 0, **kwargs) -> vf.Environment:
    dataset = build_dataset(num_examples, seed)
    rubric = vf.Rubric(funcs=[reward_packed], weights=[1.0])
    return WarehouseEnv(dataset=dataset, rubric=rubric, system_prompt=SYSTEM_PROMPT, max_turns=9)
