"""The training audit on a GPU reads prime-rl v0.7.0's rollout traces outside the jail. The trace files
here are written by verifiers' own v1 ``Trace.to_record()`` (the installed verifiers 0.2.0, the exact
submodule pin of prime-rl v0.7.0) and ``save_rollouts``' layout (one JSON record per line, under
``rollouts/step_<n>/train/all/traces.jsonl``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("verifiers")

from verifiers.v1.graph import MessageNode  # noqa: E402
from verifiers.v1.task import WireTaskData  # noqa: E402
from verifiers.v1.trace import Trace, TraceTask  # noqa: E402
from verifiers.v1.types import AssistantMessage, SystemMessage, ToolCall, ToolMessage, UserMessage  # noqa: E402

from ait_env.jobs.failures import JobFailed  # noqa: E402
from ait_env.hidden.secrets import hidden_questions  # noqa: E402
from gpu.primerl_traces import audit_traces, trace_files  # noqa: E402
from task_families import get_family  # noqa: E402

FAM = get_family("arithmetic")


def _trace(question: str, tool_result: str | None = None) -> dict:
    args = {"expression": "3+4"}
    result = FAM.call_tool("calculator", args) if tool_result is None else tool_result
    msgs = [SystemMessage(content="Solve it."), UserMessage(content=question),
            AssistantMessage(tool_calls=[ToolCall(id="c1", name="calculator", arguments=json.dumps(args))]),
            ToolMessage(tool_call_id="c1", content=result), AssistantMessage(content="Answer: 7")]
    nodes = [MessageNode(parent=i - 1 if i else None, message=m, sampled=m.role == "assistant")
             for i, m in enumerate(msgs)]
    trace = Trace(task=TraceTask(type="Task", data=WireTaskData.model_validate({"idx": 0, "prompt": question})), nodes=nodes)
    return trace.to_record()


def _write(out: Path, records: list[dict], step: int = 1, run_default: bool = True) -> None:
    base = out / "run_default" if run_default else out
    path = base / "rollouts" / f"step_{step}" / "train" / "all" / "traces.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        for r in records:
            f.write(json.dumps(r, default=str) + "\n")


def test_honest_traces_pass_and_their_tool_results_are_compared(tmp_path):
    _write(tmp_path, [_trace(i.question) for i in FAM.generate(5, 20)])
    _write(tmp_path, [_trace(i.question) for i in FAM.generate(6, 20)], step=2, run_default=False)
    assert len(trace_files(tmp_path)) == 2
    assert audit_traces(tmp_path, "arithmetic") == 1


def test_hidden_questions_in_the_traces_fail_the_job(tmp_path):
    _write(tmp_path, [_trace(q) for q in hidden_questions("arithmetic")[:5]])
    with pytest.raises(JobFailed) as err:
        audit_traces(tmp_path, "arithmetic")
    assert err.value.code == "eval_leak"


def test_a_tool_result_other_than_the_familys_fails_the_job(tmp_path):
    _write(tmp_path, [_trace("What is 3+4?", tool_result="0")])
    with pytest.raises(JobFailed) as err:
        audit_traces(tmp_path, "arithmetic")
    assert err.value.code == "foreign_tools"


def test_no_traces_is_reported_not_failed(tmp_path):
    lines: list[str] = []
    assert audit_traces(tmp_path, "arithmetic", lines.append) == 0 and "nothing to read" in lines[0]
