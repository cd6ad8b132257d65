"""Per-rollout state on the pinned stack: 72 concurrent rollouts of the warehouse reference environment (a
verifiers ``StatefulToolEnv``), run by verifiers' own rollout code with their turns interleaved, each leave
exactly the world their own tool calls make from their row's world: no rollout sees another's."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

pytest.importorskip("verifiers")

from ait_env.integrations import verifiers_v0 as V  # noqa: E402
from task_families.warehouse import tools  # noqa: E402
from tests.helpers import load_reference_environment  # noqa: E402

N_ROWS, PER_ROW = 18, 4   # 72 rollouts in flight at once


def calls_of(info: dict, rng: random.Random, kind: str) -> list[tuple[str, dict]]:
    """A solution of the row (``good``), or one with an irreversible mistake (a wrong item picked first, an
    early seal)."""
    world = tools.new_world(info["world"])
    order = tools.order_of(info["order"])
    calls: list[tuple[str, dict]] = []
    if kind == "wrong_item":
        b, item = rng.choice([(b, i) for b, items in world.bins.items() for i in items if i not in order])
        calls.append(("pick", {"bin": b, "item": item, "quantity": 1}))
    for k, (item, qty) in enumerate(order.items()):
        where = next(b for b, items in world.bins.items() for i, n in items.items() if i == item and n >= qty)
        calls.append(("find_item", {"item": item}))
        calls.append(("pick", {"bin": where, "item": item, "quantity": qty}))
        if kind == "early_seal":
            break
    calls.append(("seal_box", {}))
    return calls


def script_of(calls: list[tuple[str, dict]], info: dict) -> list[dict]:
    world = tools.new_world(info["world"])   # the answer a model would copy from seal_box
    for name, args in calls:
        out = getattr(tools, name)(**args, world=world)
    label = out.split()[1].rstrip(":")
    return [{"role": "assistant", "content": "", "tool_calls": [{"id": f"c{i}", "type": "function", "function": {
        "name": name, "arguments": json.dumps(args)}}]} for i, (name, args) in enumerate(calls)] + [
        {"role": "assistant", "content": f"Answer: {label}"}]


def test_72_concurrent_rollouts_each_keep_their_own_world(tmp_path):
    env = load_reference_environment("warehouse", "some/model", tmp_path, {"num_examples": 64, "seed": 7})
    ds = env.get_dataset()
    rng = random.Random(0)
    inputs, scripts, plans = [], {}, {}
    for r in range(N_ROWS):
        row = ds[r]
        for j in range(PER_ROW):
            eid = r * PER_ROW + j
            kind = ["good", "wrong_item", "good", "early_seal"][j]
            plans[eid] = (row, calls_of(row["info"], rng, kind), kind)
            scripts[eid] = script_of(plans[eid][1], row["info"])
            inputs.append({"prompt": row["prompt"], "example_id": eid, "answer": row["answer"], "info": row["info"]})
    client = V.scripted_client(scripts)

    async def all_groups():
        groups = [inputs[i:i + PER_ROW] for i in range(0, len(inputs), PER_ROW)]
        return [s for g in await asyncio.gather(*(env._run_group_states(g, client, "m", {}) for g in groups)) for s in g]

    states = asyncio.run(all_groups())
    assert len(states) == N_ROWS * PER_ROW == 72
    assert len({id(s["world"]) for s in states}) == 72
    turns = [len(s["trajectory"]) for s in states]
    assert min(turns) >= 4, turns
    for st in states:
        row, calls, kind = plans[st["example_id"]]
        fresh = tools.new_world(row["info"]["world"])
        for name, args in calls:
            getattr(tools, name)(**args, world=fresh)
        assert st["world"].snapshot() == fresh.snapshot(), (kind, st["example_id"])
        shown = [m.content for m in st["completion"] if m.role == "tool"]
        replay = tools.new_world(row["info"]["world"])
        assert shown == [getattr(tools, n)(**a, world=replay) for n, a in calls]
        order = tools.order_of(row["info"]["order"])
        assert (st["reward"] == pytest.approx(1.0)) == (kind == "good"), (kind, st["reward"], st["world"].box, order)
        assert (st["world"].box == order) == (kind == "good")
