"""Units family: unit-conversion and currency-exchange chains with ``convert`` and ``exchange`` tools.

A question gives a start quantity and an explicit route ("Convert 12 ft to in, then to cm, then to
m." or "Exchange 250 EUR to USD, then to JPY, then to GBP."). ``convert`` only knows direct
conversions between neighbouring units and ``exchange`` quotes each currency pair with its own
spread, so the model must make one call per leg and feed each result into the next. Difficulty
(0..1) sets the legs (2..5 calls). The checker reads the first number after the last "Answer:"
(after removing ``<think>`` blocks) and accepts it within 0.05% (or 0.011 absolute) of the value
the tool chain gives: 1.0 or 0.0.
"""

from __future__ import annotations

import random
import re

from task_families.base import Instance, TaskFamily, ToolStep, answer_text, text_segments
from task_families.units import tools

_NUM = re.compile(r"-?\d+(?:\.\d+)?")
_LO, _HI = 0.01, 1e6


def answer_number(response: str) -> float | None:
    text = answer_text(response)
    if text is None:
        return None
    found = _NUM.findall(re.sub(r"(?<=\d),(?=\d{3})", "", text))
    return float(found[0]) if found else None


def close_enough(got: float, want: float) -> bool:
    return abs(got - want) <= max(0.011, 5e-4 * abs(want))


def _num_arg(text: str) -> int | float:
    x = float(text)
    return int(x) if x.is_integer() else x
_WORDS = "|".join(sorted((re.escape(u.casefold()) for u in tools.UNITS + tools.CURRENCIES), key=len, reverse=True))
_START = re.compile(rf"(?<![\d.])(\d+(?:\.\d+)?)\s*({_WORDS})\b")
_NEXT = re.compile(rf"(?:\bto|\binto|->|\u2192|>|\bthen|\band|,)\s*(?:to\s+)?({_WORDS})\b")


def _amount(text: str) -> str:
    """An amount in one canonical spelling (``839``, ``839.0`` and ``839.00`` alike)."""
    from decimal import Decimal

    value = Decimal(text).normalize()
    return format(value, "f")



class UnitsFamily(TaskFamily):
    name = "units"
    title = "Unit-conversion and currency-exchange chains"
    goal = ("Teach the base model to follow conversion routes such as 'Convert 12 ft to in, then to cm, "
            "then to m.' or 'Exchange 250 EUR to USD, then to JPY, then to GBP.' exactly. The `convert` tool "
            "only knows direct conversions between neighbouring units and the `exchange` tool quotes every "
            "currency pair with its own spread, so the model must make one call per leg, in the stated order, "
            "copy each result into the next call and state the final number.")
    tools_module = tools
    eval_system_prompt = ("Follow the route in the question: one convert (units) or exchange (money) call per "
                          "leg, feeding each result into the next. Reply 'Answer: <number>'.")
    answer_format = ("the first number after the last 'Answer:' in the model's final message (after any <think> "
                     "block) must match the result of the stated route within 0.05% (or 0.011); "
                     "score 1 or 0 per question, averaged.")

    def instance_signatures(self, text: str) -> set[str]:
        """A question is its start amount and its route: in each clause, an amount followed by a unit or
        currency, then every unit or currency introduced by "to", "into", an arrow, "then", "and" or a comma,
        in order ("convert 91.6 tbsp to cup, then to ml" and "91.6 tbsp -> cup -> ml" alike)."""
        found = set()
        for seg in text_segments(text):
            start = _START.search(seg)
            if start is None:
                continue
            route = [start.group(2)] + _NEXT.findall(seg, start.end())
            if len(route) >= 2:
                found.add(f"{_amount(start.group(1))}|{'>'.join(route)}")
        return found

    def generate_one(self, rng: random.Random, difficulty: float) -> Instance:
        legs = 2 + round(3 * difficulty)
        kind = rng.choice(["unit", "money"])
        while True:
            if kind == "unit":
                route = [rng.choice(tools.UNITS)]
                while len(route) <= legs:
                    options = [u for u in tools.NEIGHBORS[route[-1]] if u not in route]
                    if not options:
                        break
                    route.append(rng.choice(options))
                if len(route) <= legs:
                    continue
                start = rng.choice([rng.randint(2, 999), rng.randint(20, 2500) / 10])
                tool, keys = "convert", ("value", "from_unit", "to_unit")
            else:
                route = rng.sample(tools.CURRENCIES, legs + 1)
                start = rng.randint(10, 2000)
                tool, keys = "exchange", ("amount", "from_currency", "to_currency")
            start = _num_arg(str(start))
            fn = getattr(tools, tool)
            values: list[int | float] = [start]
            ok = True
            for a, b in zip(route, route[1:]):
                out = fn(values[-1], a, b)
                x = _num_arg(out.split()[0])
                if not _LO <= abs(x) <= _HI:
                    ok = False
                    break
                values.append(x)
            if ok:
                break
        if kind == "unit":
            question = f"Convert {start} {route[0]} to {route[1]}" + "".join(f", then to {u}" for u in route[2:]) + "."
        else:
            question = f"Exchange {start} {route[0]} to {route[1]}" + "".join(f", then to {c}" for c in route[2:]) + "."
        answer = str(values[-1])
        return Instance(question=question, answer=answer, difficulty=difficulty,
                        info={"kind": kind, "tool": tool, "arg_names": list(keys), "route": route,
                              "values": [str(v) for v in values], "legs": legs, "n_calls": legs})

    def solution(self, instance: Instance) -> list[ToolStep]:
        info = instance.info
        k_val, k_from, k_to = info["arg_names"]
        route, values = info["route"], info["values"]
        return [ToolStep(name=info["tool"], arguments={k_val: _num_arg(v), k_from: a, k_to: b})
                for v, a, b in zip(values, route, route[1:])]

    def check(self, instance: Instance, response: str) -> float:
        got = answer_number(response)
        return 1.0 if got is not None and close_enough(got, float(instance.answer)) else 0.0

    def perturb_answer(self, instance: Instance, rng: random.Random) -> str:
        want = float(instance.answer)
        factor = rng.choice([0.5, 0.9, 0.97, 1.03, 1.1, 2.0])
        return f"{want * factor + rng.choice([-1, 1]):.2f}"


FAMILY = UnitsFamily()
