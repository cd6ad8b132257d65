"""The training audit reads what the model was given in training (the endpoint's records), outside the
sandbox: hidden-eval questions in any message or tool description, and tool results that are not the
family's own, fail the job with a code the reward treats as a refused submission."""

from __future__ import annotations

import json

import pytest

import ait_env.cpu_trainer.executor as executor
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
    from ait_env.tiny_models.model import TinyLM
    from tests.cpu_trainer.test_runner_micro import _bundle, _settings

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
