"""Training environment for this job (verifiers 0.2.0 classic API).

prime-rl imports this module and calls ``load_environment(**env)`` with the ``[env]`` table of
job.toml.
"""

from __future__ import annotations

import random

import verifiers as vf
from datasets import Dataset

from family_tools import TOOLS

SYSTEM_PROMPT = ("Follow the route in the question: one convert (units) or exchange (money) call per "
                 "leg, feeding each result into the next. Reply 'Answer: <number>'.")


def build_dataset(num_examples: int, seed: int) -> Dataset:
    """Rows with 'question' and 'answer' (strings). TODO: generate questions like the dev examples."""
    rng = random.Random(seed)
    rows: list[dict] = []
    # TODO: append {"question": ..., "answer": ...} num_examples times, using rng
    # (family_tools.convert / family_tools.exchange give the true values).
    return Dataset.from_list(rows)


def reward_correct(completion, answer, **kwargs) -> float:
    """TODO: return 1.0 when the model's final number matches `answer`, else 0.0."""
    return 0.0


def load_environment(num_examples: int = 1000, seed: int = 0, **kwargs) -> vf.Environment:
    dataset = build_dataset(num_examples, seed)
    rubric = vf.Rubric(funcs=[reward_correct], weights=[1.0])
    return vf.ToolEnv(dataset=dataset, tools=TOOLS, rubric=rubric, system_prompt=SYSTEM_PROMPT,
                      max_turns=8)
