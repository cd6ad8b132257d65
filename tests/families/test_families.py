"""The family contract, checked for every registered family."""

from __future__ import annotations

import random

import pytest

from ait_env.hidden.secrets import hidden_set
from task_families import FAMILY_NAMES, get_family
from tests.helpers import load_reference_environment

FAMILIES = list(FAMILY_NAMES)


@pytest.mark.parametrize("name", FAMILIES)
def test_generator_is_deterministic_and_graded(name):
    fam = get_family(name)
    a, b = fam.generate(5, 20), fam.generate(5, 20)
    assert [i.model_dump() for i in a] == [i.model_dump() for i in b]
    assert [i.key for i in fam.generate(6, 20)] != [i.key for i in a]
    easy, hard = fam.generate(1, 1, difficulty=0.0)[0], fam.generate(1, 1, difficulty=1.0)[0]
    assert easy.difficulty == 0.0 and hard.difficulty == 1.0
    assert len(fam.solution(hard)) >= len(fam.solution(easy)) >= 1


@pytest.mark.parametrize("name", FAMILIES)
def test_checker_accepts_own_answers_and_rejects_wrong(name):
    fam = get_family(name)
    rng = random.Random(0)
    for inst in fam.generate(11, 40):
        assert fam.check(inst, fam.final_answer(inst)) == 1.0, inst
        assert fam.check(inst, "<think>hmm</think>" + fam.final_answer(inst)) == 1.0
        assert fam.check(inst, fam.wrong_answer(inst, rng)) < 1.0
        assert fam.check(inst, "") == 0.0


@pytest.mark.parametrize("name", FAMILIES)
def test_reference_solution_tools_reproduce_the_answer(name):
    fam = get_family(name)
    for inst in fam.generate(12, 25):
        transcript = fam.transcript(inst)
        tool_msgs = [m for m in transcript if m["role"] == "tool"]
        assert tool_msgs and not any(m["content"].startswith("error") for m in tool_msgs), transcript
        assert fam.check(inst, transcript[-1]["content"]) == 1.0


@pytest.mark.parametrize("name", FAMILIES)
def test_hidden_set_excludes_dev_examples(name):
    fam = get_family(name)
    hidden = hidden_set(name)
    assert len(hidden) == fam.hidden_eval_size >= 200
    keys = {i.key for i in hidden}
    assert len(keys) == len(hidden)
    assert not keys & {i.key for i in fam.dev_pool()}


@pytest.mark.parametrize("name", FAMILIES)
def test_task_data_is_what_the_task_text_shows_and_nothing_hidden(name):
    """The workspace's read-only ``task_data.py``: the spec's dev examples and the eval's system prompt, as the
    task text shows them; valid Python whatever quotes the texts hold; no hidden-eval question."""
    import json

    from task_families.base import Bounds

    fam = get_family(name)
    spec = fam.make_task(7, Bounds(base_models=["m"], max_steps=10, max_batch_size=64, max_group_size=8,
                                   max_seq_len=2048, max_tokens=256))
    space: dict = {}
    import sys
    from unittest import mock

    with mock.patch.dict(sys.modules, {"family_tools": fam.tools_module}):   # the workspace's read-only module
        exec(compile(fam.task_data_source(spec), "task_data.py", "exec"), space)
    assert space["FAMILY"] == name and space["SYSTEM_PROMPT"] == fam.eval_system_prompt
    assert f"> {space['SYSTEM_PROMPT']}" in spec.text
    assert space["DEV_EXAMPLES"] == [{"question": e.question, "answer": e.answer,
                                      **({"info": fam.job_info(e)} if fam.job_info(e) else {})}
                                     for e in spec.dev_examples]
    # how a rollout gets its world: a fresh one per call, equal to the family's own (none when stateless)
    assert space["STATE_ARGS"] == list(fam.state_args)
    for row, e in zip(space["DEV_EXAMPLES"], spec.dev_examples):
        state, again = space["rollout_state"](row.get("info")), space["rollout_state"](row.get("info"))
        assert set(state) == set(fam.state_args)
        for arg in fam.state_args:
            assert state[arg] is not again[arg] and state[arg].snapshot() == fam.new_world(e).snapshot()
    assert all(json.dumps(e["question"]) in spec.text for e in space["DEV_EXAMPLES"])
    assert not {i.key for i in spec.dev_examples} & {i.key for i in hidden_set(name)}


@pytest.mark.parametrize("name", FAMILIES)
def test_tools_are_plain_typed_documented_functions(name):
    fam = get_family(name)
    for schema in fam.tool_schemas():
        fn = schema["function"]
        assert fn["description"], fn
        for pname, prop in fn["parameters"]["properties"].items():
            assert prop["description"], (fn["name"], pname)


@pytest.mark.parametrize("name", FAMILIES)
def test_reference_job_loads_with_real_verifiers_and_rubric_separates(name, tmp_path):
    pytest.importorskip("verifiers")
    from ait_env.integrations import verifiers_v0 as V

    fam = get_family(name)
    env = load_reference_environment(name, "some/model", tmp_path, {"num_examples": 64})
    assert V.is_tool_env(env)
    assert sorted(V.tool_functions(env)) == sorted(fam.tool_names)
    answers = V.dataset_column(env, "answer")
    assert V.dataset_len(env) == len(answers) == 64 and all(answers)
    rng = random.Random(0)
    for inst in fam.generate(13, 10):
        row = {"prompt": fam.eval_messages(inst), "answer": inst.answer, "info": inst.info}
        good_t, bad_t = fam.transcript(inst), fam.transcript(inst, correct=False, rng=rng)
        if fam.state_args:  # a stateful family's rubric reads the world: score whole (scripted) rollouts
            runs = V.run_scripted(env, {**row, "info": fam.job_info(inst)},
                                  [[m for m in t if m["role"] == "assistant"] for t in (good_t, bad_t)])
            (good, bad), errors = [r["reward"] for r in runs], runs[0]["errors"] + [r["error"] for r in runs if r["error"]]
        else:
            good, _, errors = V.score_completion(env, row, good_t)
            bad, _, _ = V.score_completion(env, row, bad_t)
        assert not errors
        assert good == pytest.approx(1.0), (inst, good)
        assert bad < good
