"""The training audit reads what the model was given in training (the endpoint's records), outside the
sandbox: hidden-eval questions in any message or tool description, and tool results that are not the
family's own, fail the job with a code the reward treats as a refused submission."""

from __future__ import annotations

import json

import pytest

import cpu.executor as executor
import ait_env.runner as runner
from ait_env.jobs.failures import JobFailed
from ait_env.probe.training_audit import TrainingAudit
from ait_env.probe.leak import LEAK_TOLERANCE
from ait_env.hidden.secrets import hidden_questions, hidden_set
from task_families import get_family

FAM = get_family("arithmetic")
HIDDEN = hidden_questions("arithmetic")


def _conversation(question: str, result: str | None = None, system: str = "Solve it.") -> list[dict]:
    inst = FAM.generate(7, 1)[0]
    call_args = {"expression": "3+4"}
    return [{"role": "system", "content": system}, {"role": "user", "content": question},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "calculator",
                                                                  "arguments": json.dumps(call_args)}}]},
            {"role": "tool", "tool_call_id": "call_1",
             "content": FAM.call_tool("calculator", call_args) if result is None else result},
            {"role": "assistant", "content": f"Answer: {inst.answer}"}]


def _audit() -> TrainingAudit:
    return TrainingAudit(FAM, HIDDEN)


def test_honest_training_conversations_pass_and_tool_results_are_checked():
    audit = _audit()
    audit.review((_conversation(q.question), FAM.tool_schemas()) for q in FAM.generate(123, 50))
    assert audit.checked_results == 1  # one distinct (call, result) pair: read once per job
    assert not audit.leaked


def test_a_tool_result_other_than_the_familys_fails_the_job():
    with pytest.raises(JobFailed) as err:
        _audit().review([(_conversation("What is 3+4?", result="0"), FAM.tool_schemas())])
    assert err.value.code == "foreign_tools" and "calculator" in str(err.value)


def test_a_tool_list_other_than_the_familys_fails_the_job():
    extra = FAM.tool_schemas() + [{"type": "function", "function": {"name": "oracle", "parameters": {}}}]
    with pytest.raises(JobFailed) as err:
        _audit().review([(_conversation("What is 3+4?"), extra)])
    assert err.value.code == "foreign_tools"


@pytest.mark.parametrize("where", ["user", "system", "assistant few-shot", "tool description"])
def test_hidden_questions_anywhere_in_a_training_request_fail_the_job(where):
    stolen = HIDDEN[:LEAK_TOLERANCE + 1]
    audit = _audit()
    if where == "user":
        convs = [(_conversation(q), None) for q in stolen]
    elif where == "system":  # appended with their answers, one request
        answers = [i.answer for i in hidden_set("arithmetic")[:len(stolen)]]
        convs = [(_conversation("What is 3+4?", system="Examples:\n" + "\n".join(
            f"{q} Answer: {a}" for q, a in zip(stolen, answers))), None)]
    elif where == "assistant few-shot":
        convs = [([{"role": "user", "content": "warm up"}, {"role": "assistant", "content": q}]
                  + _conversation("What is 3+4?")[1:], None) for q in stolen]
    else:
        tools = json.loads(json.dumps(FAM.tool_schemas()))
        tools[0]["function"]["description"] += " e.g. " + " ".join(stolen)
        convs = [(_conversation("What is 3+4?"), tools)]
    with pytest.raises(JobFailed) as err:
        audit.review(convs)
    assert err.value.code == "eval_leak"


def test_re_worded_hidden_questions_count_as_the_same_instances():
    # "What is ((4+9)+45)+43?" -> "What is (((4+9)+45)+43) ?" with an extra comma: the same chain
    reworded = ["What is (" + q[len("What is "):-1] + ") ,?" for q in HIDDEN[:LEAK_TOLERANCE + 1]]
    with pytest.raises(JobFailed):
        _audit().review((_conversation(q), None) for q in reworded)


def test_a_few_accidental_collisions_are_tolerated():
    _audit().review((_conversation(q), None) for q in HIDDEN[:LEAK_TOLERANCE])


# ---------------------------------------------------------------- through a real (micro) training job
def _micro_job(tmp_path, monkeypatch, micro_model, micro_tokenizer, edit):
    from cpu.tiny_models.model import TinyLM
    from tests.cpu.test_runner_micro import _bundle, _settings

    model = TinyLM(micro_model.cfg)
    model.load_state_dict(micro_model.state_dict())
    monkeypatch.setattr(executor, "load_base_model", lambda name: (model, micro_tokenizer))
    return runner.run(_bundle(tmp_path, edit).root, _settings(), progress=False)


#: true only in the training process (the rollout worker's folder has the endpoint's socket)
IN_TRAINING = "__import__('os').path.exists('endpoint.sock')"


def test_an_environment_that_adds_hidden_questions_only_in_training_is_caught(tmp_path, monkeypatch, micro_model,
                                                                             micro_tokenizer):
    stolen = [{"question": i.question, "answer": i.answer} for i in hidden_set("arithmetic")[:40]]

    def edit(text: str) -> str:
        return text.replace("    dataset = build_dataset(num_examples, seed)\n",
                            "    dataset = build_dataset(num_examples, seed)\n"
                            f"    if {IN_TRAINING}:\n"
                            f"        dataset = Dataset.from_list({stolen!r} * 5)\n")

    res = _micro_job(tmp_path, monkeypatch, micro_model, micro_tokenizer, edit)
    assert res.status == "job_failed" and res.fault == "eval_leak", (res.status, res.error)
    assert "hidden-eval questions during training" in res.error


def test_a_tool_wrapped_only_in_training_is_caught(tmp_path, monkeypatch, micro_model, micro_tokenizer):
    def edit(text: str) -> str:
        return text.replace("from family_tools import TOOLS\n", "from family_tools import TOOLS\nimport functools\n") \
            .replace("    return vf.ToolEnv(dataset=dataset, tools=TOOLS,",
                     "    tools = TOOLS\n"
                     f"    if {IN_TRAINING}:\n"
                     "        tools = [functools.wraps(t)(lambda *a, **k: '0') for t in TOOLS]\n"
                     "    return vf.ToolEnv(dataset=dataset, tools=tools,")

    res = _micro_job(tmp_path, monkeypatch, micro_model, micro_tokenizer, edit)
    assert res.status == "job_failed" and res.fault == "foreign_tools", (res.status, res.error)


# ---------------------------------------------------------------- what the model reads (issue 46, items 1 and 3)
def test_hidden_questions_as_tool_parameter_names_fail_the_job():
    """The red team's case: hidden questions with their answers as parameter names (keys, not values)."""
    stolen = hidden_set("arithmetic")[:LEAK_TOLERANCE + 1]
    tools = json.loads(json.dumps(FAM.tool_schemas()))
    tools[0]["function"]["parameters"]["properties"].update(
        {f"{i.question} Answer: {i.answer}": {"type": "string"} for i in stolen})
    with pytest.raises(JobFailed) as err:
        _audit().review([(_conversation("What is 3+4?"), tools)])
    assert err.value.code == "eval_leak"


def test_hidden_questions_cut_into_content_parts_fail_the_job():
    """The red team's case: a hidden question cut into several content parts of one message."""
    def parts(q: str) -> list[dict]:
        return [{"type": "text", "text": q[:9]}, {"type": "text", "text": q[9:14]}, {"type": "text", "text": q[14:]}]

    convs = [([{"role": "system", "content": "Solve it."}, {"role": "user", "content": parts(q)}], None)
             for q in HIDDEN[:LEAK_TOLERANCE + 1]]
    with pytest.raises(JobFailed) as err:
        _audit().review(convs)
    assert err.value.code == "eval_leak"


WAREHOUSE = get_family("warehouse")


def _warehouse_rollout(inst, results: list[str] | None = None) -> list[dict]:
    """A training request of a warehouse rollout: the prompt and a correct transcript, its tool results
    replaced by ``results`` where given."""
    transcript = WAREHOUSE.transcript(inst)
    if results is not None:
        shown = iter(results)
        transcript = [dict(m, content=next(shown)) if m["role"] == "tool" else m for m in transcript]
    return WAREHOUSE.eval_messages(inst) + transcript


def test_stateful_tool_results_are_replayed_on_the_rows_world():
    insts = WAREHOUSE.dev_pool()[:4]
    audit = TrainingAudit(WAREHOUSE, hidden_questions("warehouse"))
    audit.review((_warehouse_rollout(i), WAREHOUSE.tool_schemas(), WAREHOUSE.job_info(i)) for i in insts)
    assert audit.checked_results == sum(len(WAREHOUSE.solution(i)) for i in insts)


@pytest.mark.parametrize("fault", ["wrapped", "shared_world", "no_world"])
def test_stateful_tool_results_the_familys_tools_do_not_give_fail_the_job(fault):
    """Warehouse tools wrapped only in training (foreign results), or one world shared by rollouts (the second
    rollout sees the first one's picks), or rows whose info has no world to replay: ``foreign_tools``."""
    inst = WAREHOUSE.dev_pool()[0]
    n = len(WAREHOUSE.solution(inst))
    info = WAREHOUSE.job_info(inst)
    if fault == "wrapped":
        messages = _warehouse_rollout(inst, ["packed: everything. label W-0000"] * n)
    elif fault == "shared_world":  # the results of a second run on the world the first run changed
        world = WAREHOUSE.new_world(inst)
        for step in WAREHOUSE.solution(inst):
            WAREHOUSE.call_tool(step.name, step.arguments, world)
        messages = _warehouse_rollout(inst, [WAREHOUSE.call_tool(s.name, s.arguments, world)
                                             for s in WAREHOUSE.solution(inst)])
    else:
        messages, info = _warehouse_rollout(inst), {"order": info["order"]}
    with pytest.raises(JobFailed) as err:
        TrainingAudit(WAREHOUSE, hidden_questions("warehouse")).review([(messages, WAREHOUSE.tool_schemas(), info)])
    assert err.value.code == "foreign_tools", str(err.value)
    if fault == "no_world":
        assert "INSTRUCTIONS.md" in str(err.value)  # where the row's info layout is documented


def test_the_rollout_worker_reports_each_groups_row_info_to_the_trainer():
    """The trainer's audit gets each rollout's row info from the worker's step results (one per group)."""
    from cpu.trainer import step_results

    groups = [[{"reward": 1.0, "response_ids": ["r1"]}], [{"reward": 0.0, "response_ids": ["r2"]}]]
    out = step_results({"step": 0, "groups": groups, "infos": [{"world": 1}, {"world": 2}]}, 0, 2, 1)
    assert [g[0]["info"] for g in out] == [{"world": 1}, {"world": 2}]
    out = step_results({"step": 0, "groups": groups, "infos": [{"world": 1}]}, 0, 2, 1)  # a malformed list
    assert [g[0]["info"] for g in out] == [None, None]
