"""Reference environment for the persona family (verifiers 0.2.0 classic API).

Dataset: fresh multi-hop questions from the same distribution as the eval (1-4 relation hops, so
2-5 lookups, mixed difficulty; city/job/hobby/pet questions), generated from this job's own seed with
reference answers computed by the family's own `lookup` tool. Reward: 1.0 for the exact value after
"Answer:", weighted 0.9, plus 0.1 for making at least one lookup per hop plus one for the attribute
(a correct, tool-using transcript scores 1.0).
"""

from __future__ import annotations

import random
import re

import verifiers as vf
from datasets import Dataset

from family_tools import ATTRIBUTES, N_PEOPLE, RELATIONS, TOOLS, lookup

SYSTEM_PROMPT = ("Answer the question about the people directory. Use the lookup tool for every "
                 "relation and attribute, starting from the innermost person, then reply with "
                 "'Answer: <value>'.")
QUESTIONS = {
    "city": "In which city does {who} live?",
    "job": "What is the job of {who}?",
    "hobby": "What is the hobby of {who}?",
    "pet": "What pet does {who} have?",
}


def make_question(rng: random.Random, difficulty: float) -> dict:
    hops = 1 + round(3 * difficulty)
    person = f"p{rng.randint(1, N_PEOPLE)}"
    relations = [rng.choice(RELATIONS) for _ in range(hops)]
    attribute = rng.choice(sorted(ATTRIBUTES))
    who = person
    for rel in relations:
        who = f"the {rel} of {who}"
        person = lookup(person, rel)
    answer = lookup(person, attribute)
    return {"question": QUESTIONS[attribute].format(who=who), "answer": answer,
            "info": {"n_calls": hops + 1}}


def build_dataset(num_examples: int, seed: int) -> Dataset:
    rng = random.Random(seed)
    return Dataset.from_list([make_question(rng, rng.random()) for _ in range(num_examples)])


def _final_text(completion) -> str:
    for msg in reversed(completion or []):
        if msg["role"] == "assistant" and msg.get("content"):
            text = msg["content"]
            return text.rsplit("</think>", 1)[-1]
    return ""


def _norm(text: str) -> str:
    return re.sub(r"\s+", "", text.lower()).strip("`*\"'.,;:!")


def correct_answer(completion, answer, **kwargs) -> float:
    text = _final_text(completion)
    idx = text.lower().rfind("answer:")
    if idx < 0:
        return 0.0
    rest = text[idx + len("answer:"):].strip()
    got = rest.splitlines()[0] if rest else ""
    return 1.0 if _norm(got) == _norm(str(answer)) else 0.0


def lookup_use(completion, info, **kwargs) -> float:
    calls = sum(len(msg.get("tool_calls") or []) for msg in completion or [] if msg["role"] == "assistant")
    needed = max(1, int((info or {}).get("n_calls", 2)))
    return min(1.0, calls / needed)


def load_environment(num_examples: int = 4000, seed: int = 12345, **kwargs) -> vf.Environment:
    dataset = build_dataset(num_examples, seed)
    rubric = vf.Rubric(funcs=[correct_answer, lookup_use], weights=[0.9, 0.1])
    # 6 turns: the longest solution is 5 tool calls + the answer; prompt + 6 x 256 tokens fits seq_len 2048
    return vf.ToolEnv(dataset=dataset, tools=TOOLS, rubric=rubric, system_prompt=SYSTEM_PROMPT, max_turns=6)
