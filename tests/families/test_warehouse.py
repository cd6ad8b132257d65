"""The warehouse family, the first stateful one: a world per episode that the tools change, irreversible
picks and seal, a score that reads the final state, and a world the model can neither see nor pass."""

from __future__ import annotations

import json
import random

from task_families.warehouse import tools
from task_families.warehouse.family import FAMILY, parse_label
from task_families.teacher import oracle_ladder, teacher_completion

SPEC = {"seed": "abc", "bins": {"b1": {"mug": 3, "lamp": None}, "b2": {"mug": 9}, "b3": {}, "b4": {},
                                "b5": {"lamp": 4}, "b6": {}}}


def test_tools_change_the_world_and_picks_cannot_be_undone():
    w = tools.new_world(SPEC)
    assert tools.find_item("mugs", w) == "b2: 9, b1: 3"          # most first; None counts (a datasets row): none
    assert tools.pick("b1", "mug", 4, w) == "error: b1 holds only 3 mug"   # a failed pick changes nothing
    assert w.box == {} and w.bins["b1"] == {"mug": 3}
    assert tools.pick("B2", "mug", 4, w) == "box: 4 mug"
    assert tools.find_item("mug", w) == "b2: 5, b1: 3"
    assert tools.pick("b5", "lamp", 2, w) == "box: 2 lamp, 4 mug"
    sealed = tools.seal_box(w)
    label = tools.box_label("abc", {"mug": 4, "lamp": 2})
    assert sealed == f"sealed {label}: 2 lamp, 4 mug" and w.label == label
    assert tools.pick("b5", "lamp", 1, w).startswith("error: the box is sealed")
    assert tools.seal_box(w).startswith("error: the box is already sealed")
    assert w.box == {"mug": 4, "lamp": 2}
    assert tools.new_world(json.dumps(SPEC)).snapshot() == tools.new_world(SPEC).snapshot()


def test_bad_arguments_are_error_text_and_change_nothing():
    w = tools.new_world(SPEC)
    for out in (tools.pick("b9", "mug", 1, w), tools.pick("bin", "mug", 1, w), tools.pick("b1", "gizmo", 1, w),
                tools.pick("b1", "mug", 0, w), tools.pick("b1", "mug", "many", w), tools.find_item("", w),
                tools.seal_box(w)):
        assert out.startswith("error:"), out
    assert w.box == {} and not w.sealed


def test_the_label_depends_on_the_worlds_seed_and_the_contents():
    assert tools.box_label("abc", {"mug": 4}) != tools.box_label("abd", {"mug": 4})
    assert tools.box_label("abc", {"mug": 4}) != tools.box_label("abc", {"mug": 5})
    assert tools.box_label("abc", {"mug": 4, "lamp": 2}) == tools.box_label("abc", {"lamp": 2, "mug": 4})


def test_the_score_reads_the_final_state_not_only_the_answer():
    for inst in FAMILY.generate(3, 40):
        good = FAMILY.transcript(inst)
        assert FAMILY.score_completion(inst, good) == 1.0
        assert FAMILY.check(inst, good[-1]["content"]) == 1.0
        # the right label with no packing, or with the box left open, scores 0
        assert FAMILY.score_completion(inst, good[-1:]) == 0.0
        assert FAMILY.score_completion(inst, good[:-3] + good[-1:]) == 0.0
        # a wrong pick cannot be undone: the right label text does not save it
        world = FAMILY.new_world(inst)
        b, item = next((b, i) for b, items in inst.info["world"]["bins"].items() for i in items
                       if i not in inst.info["order"])
        assert FAMILY.call_tool("pick", {"bin": b, "item": item, "quantity": 1}, world).startswith("box:")
        for step in FAMILY.solution(inst):
            FAMILY.call_tool(step.name, step.arguments, world)
        assert FAMILY.score(inst, f"Answer: {inst.answer}", world) == 0.0


def test_a_correct_episode_makes_at_least_three_state_changing_calls_in_order():
    for inst in FAMILY.generate(5, 60):
        names = [s.name for s in FAMILY.solution(inst)]
        assert names.count("pick") >= 2 and names[-1] == "seal_box" and len(names) - names.count("find_item") >= 3


def test_the_model_never_sees_or_passes_the_world():
    for schema in FAMILY.tool_schemas():
        assert "world" not in json.dumps(schema)
    inst = FAMILY.generate(1, 1)[0]
    world = FAMILY.new_world(inst)
    forged = {"seed": "x", "bins": {"b1": {"mug": 99}}}
    assert FAMILY.call_tool("find_item", {"item": "mug", "world": forged}, world) == tools.find_item("mug", world)
    try:
        FAMILY.call_tool("seal_box", {})
    except ValueError as exc:
        assert "stateful" in str(exc)
    else:
        raise AssertionError("a stateful tool ran without a world")


def test_episodes_never_share_a_world():
    inst = FAMILY.generate(2, 1)[0]
    a, b = FAMILY.new_world(inst), FAMILY.new_world(inst)
    for step in FAMILY.solution(inst):
        FAMILY.call_tool(step.name, step.arguments, a)
    assert b.box == {} and not b.sealed and a.sealed
    assert inst.info["world"] == FAMILY.generate(2, 1)[0].info["world"]  # the spec itself never changes


def test_difficulty_sets_items_and_decoy_bins():
    easy, hard = FAMILY.generate(1, 50, difficulty=0.0), FAMILY.generate(1, 50, difficulty=1.0)
    assert all(len(i.info["order"]) == 2 for i in easy) and all(len(i.info["order"]) == 3 for i in hard)
    assert all(tools.find_item(item, FAMILY.new_world(i)).count(":") == 3 for i in hard for item in i.info["order"])


def test_labels_parse_in_common_forms():
    assert parse_label("W-0421") == parse_label("w 0421") == parse_label("the box W0421.") == "W-0421"
    assert parse_label("0421") is None and parse_label(None) is None


def test_the_teacher_solves_every_hidden_question_when_clean_and_its_flaws_are_graded():
    from ait_env.hidden.secrets import hidden_set

    hidden = hidden_set("warehouse")
    assert all(FAMILY.score_completion(i, teacher_completion("warehouse", i, mode="clean")[0]) == 1.0
               for i in hidden[:100])
    ladder = [s for _, s in oracle_ladder("warehouse", hidden)]
    assert 0.1 < ladder[0] < 0.5 and ladder == sorted(ladder) and ladder[-1] == 1.0


def test_hidden_questions_yield_their_own_signatures():
    from ait_env.hidden.secrets import hidden_set

    rng = random.Random(0)
    for inst in rng.sample(hidden_set("warehouse"), 50):
        sig = FAMILY.instance_signatures(inst.question.lower())
        pairs = " and ".join(f"{i}: {q}" for i, q in reversed(list(inst.info["order"].items())))
        assert len(sig) == 1 and FAMILY.instance_signatures(f"pack {pairs} please") == sig


def test_the_task_the_agent_sees_says_it_is_stateful():
    from task_families import get_family
    from task_families.base import Bounds

    b = Bounds(base_models=["m"], max_steps=1, max_batch_size=1, max_group_size=1, max_seq_len=1, max_tokens=1)
    text = FAMILY.make_task(0, b).text
    assert "**stateful**" in text and "one world per rollout" in text and "`world`" in text
    assert "stateful" not in get_family("arithmetic").make_task(0, b).text
    assert "StatefulToolEnv" in FAMILY.instructions_text() and "update_tool_args" in FAMILY.instructions_text()
