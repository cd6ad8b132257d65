"""Persona family: multi-hop questions over a people directory with a ``lookup`` tool.

A question names a start person and a chain of relations, then asks for an attribute of the person
at the end of the chain ("In which city does the manager of the sister of p17 live?"). Each hop is
one ``lookup`` call and the attribute is one more: difficulty (0..1) sets the hops (1..4), so a
solution takes 2..5 calls. The checker reads the text after the last "Answer:" (after removing
``<think>`` blocks) and compares it with the value, case- and whitespace-insensitively: 1.0 or 0.0.
"""

from __future__ import annotations

import random
import re

from task_families.base import Instance, TaskFamily, ToolStep, answer_text, text_segments
from task_families.persona import tools

_QUESTIONS = {
    "city": "In which city does {who} live?",
    "job": "What is the job of {who}?",
    "hobby": "What is the hobby of {who}?",
    "pet": "What pet does {who} have?",
}


def _norm(value: str) -> str:
    return re.sub(r"\s+", "", value.lower()).strip("`*\"'.,;:!")
_PERSON = re.compile(r"p\d+")
#: how a clause names the asked attribute
_ATTRIBUTE_WORDS = {"city": "city", "live": "city", "lives": "city", "living": "city", "job": "job",
                    "occupation": "job", "hobby": "hobby", "pet": "pet"}



class PersonaFamily(TaskFamily):
    name = "persona"
    title = "Multi-hop persona queries with a lookup tool"
    goal = ("Teach the base model to answer multi-hop questions about a directory of people, such as "
            "'In which city does the manager of the sister of p17 live?'. The directory is only reachable "
            "through the `lookup` tool: the model must resolve the relations from the innermost one outwards "
            "(one call per hop), copy each returned person id exactly into the next call, look up the asked "
            "attribute of the last person and state it. Guessing without the tool is hopeless.")
    tools_module = tools
    eval_system_prompt = ("Answer the question about the people directory. Use the lookup tool for every "
                          "relation and attribute, starting from the innermost person, then reply with "
                          "'Answer: <value>'.")
    answer_format = ("the text after the last 'Answer:' in the model's final message (after any <think> block) "
                     "must equal the looked-up value (a city, job, hobby or pet), ignoring case and spaces; "
                     "score 1 or 0 per question, averaged.")

    def instance_signatures(self, text: str) -> set[str]:
        """A question is its start person, the relations it follows in order and the attribute it asks: in
        each clause, a person id, the relation words before it read inwards ("the mentor of the cousin of
        p3156": cousin, then mentor) or, when none precede it, the ones after it read outwards ("p3156's
        cousin's mentor": cousin, then mentor), and the clause's attribute word."""
        found = set()
        for seg in text_segments(text):
            # (quotes are gone in normalised text: "p3156's cousin's" reads "p3156s cousins")
            tokens = [w[:-1] if w[:-1] in tools.RELATIONS else w
                      for w in re.findall(r"p\d+(?!\d)|[a-z]+", seg)]
            attrs = {_ATTRIBUTE_WORDS[w] for w in tokens if w in _ATTRIBUTE_WORDS}
            if len(attrs) != 1:
                continue
            attr = attrs.pop()
            for i, tok in enumerate(tokens):
                if not _PERSON.fullmatch(tok):
                    continue
                before = [w for w in tokens[:i] if w in tools.RELATIONS]
                chain = before[::-1] if before else [w for w in tokens[i + 1:] if w in tools.RELATIONS]
                if chain:
                    found.add(f"{tok}|{attr}|{'>'.join(chain)}")
        return found

    def generate_one(self, rng: random.Random, difficulty: float) -> Instance:
        hops = 1 + round(3 * difficulty)
        start = f"p{rng.randint(1, tools.N_PEOPLE)}"
        relations = [rng.choice(tools.RELATIONS) for _ in range(hops)]  # applied in this order
        attribute = rng.choice(sorted(tools.ATTRIBUTES))
        chain = [start]
        for rel in relations:
            chain.append(tools.lookup(chain[-1], rel))
        answer = tools.lookup(chain[-1], attribute)
        who = start
        for rel in relations:
            who = f"the {rel} of {who}"
        question = _QUESTIONS[attribute].format(who=who)
        return Instance(question=question, answer=answer, difficulty=difficulty,
                        info={"start": start, "relations": relations, "attribute": attribute,
                              "chain": chain, "hops": hops, "n_calls": hops + 1})

    def solution(self, instance: Instance) -> list[ToolStep]:
        info = instance.info
        chain, relations = info["chain"], info["relations"]
        steps = [ToolStep(name="lookup", arguments={"person": p, "field": r}) for p, r in zip(chain, relations)]
        steps.append(ToolStep(name="lookup", arguments={"person": chain[-1], "field": info["attribute"]}))
        return steps

    def check(self, instance: Instance, response: str) -> float:
        got = answer_text(response)
        return 1.0 if got is not None and _norm(got) == _norm(instance.answer) else 0.0

    def perturb_answer(self, instance: Instance, rng: random.Random) -> str:
        vocab = tools.ATTRIBUTES.get(instance.info.get("attribute", "city"), tools.CITIES)
        return rng.choice([v for v in vocab if v != instance.answer])


FAMILY = PersonaFamily()
