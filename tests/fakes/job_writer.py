"""A scripted job-writing agent for the outer loop, as a policy of :mod:`tests.fakes.openai_server`.

It plays ``AIT/JobWriting-v0`` through OpenAI chat messages, one turn per request (the turn is the number
of assistant messages so far): ``read_file job.toml`` (the family is in it), ``get_baseline_scores``,
``write_file`` of the family's reference job for the ``larger`` model, then ``submit_job``. A
``careless`` agent writes the job for the ``small`` model with a batch size prime-rl refuses, submits,
then fixes the batch size and submits again.

For the families in ``infra_families`` the job is marked ``simulate_infra_failure``, which
``tests/integrations/flaky_backend.py`` fails on. ``structured=True`` answers with OpenAI ``tool_calls``
(a server with a tool parser), ``False`` with ``<tool_call>`` text in ``content`` (a server without one),
``None`` with tool calls exactly when the request offered tools.
"""

from __future__ import annotations

import json
import re
from typing import Any

from task_families import reference_files
from tests.fakes.openai_server import Policy

__all__ = ["job_writer_policy", "plan_files"]


def _text(messages: list[dict[str, Any]]) -> str:
    return "\n".join(str(m.get("content") or "") for m in messages)


def plan_files(text: str, infra_families: tuple[str, ...] = (), role: str = "larger") -> dict[str, str]:
    """The files the agent writes, read off the conversation ``text`` (for the model of ``role``)."""
    family = re.search(r'family = \\?"(\w+)\\?"', text)
    model = re.search(rf"- `([^`]+)` \({role}", text)
    backend = re.search(r"available on the `([\w-]+)` backend", text)
    name = family.group(1) if family else "arithmetic"
    files = reference_files(name, model.group(1) if model else "?", backend.group(1) if backend else None)
    if name in infra_families:
        files["job.toml"] = files["job.toml"].replace("[env]", "[env]\nsimulate_infra_failure = true", 1)
    return files


def job_writer_policy(structured: bool | None = True, infra_families: tuple[str, ...] = (),
                      careless: bool = False) -> Policy:
    def policy(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        files = plan_files(_text(messages), infra_families, "small" if careless else "larger") if turn > 1 else {}
        if careless and turn == 2:
            files["job.toml"] = re.sub(r"(?m)^batch_size = .*$", "batch_size = 100", files["job.toml"], count=1)
        if turn == 0:
            calls = [("read_file", {"path": "job.toml"})]
        elif turn == 1:
            calls = [("get_baseline_scores", {})]
        elif turn == 2 or (careless and turn == 4):
            calls = [("write_file", {"path": k, "content": v}) for k, v in files.items()]
        else:
            calls = [("submit_job", {})]
        if not (bool(tools) if structured is None else structured):
            blocks = [f"<tool_call>{json.dumps({'name': n, 'arguments': a})}</tool_call>" for n, a in calls]
            return {"content": "\n".join(blocks)}
        structured_calls = [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]
        return {"content": f"Turn {turn}.", "tool_calls": structured_calls}

    return policy


def sweep_policy(structured: bool = True) -> Policy:
    """A research episode's agent (``env.max_jobs_per_episode`` >= 4): ``read_file job.toml``,
    ``get_baseline_scores``, writes an lr sweep of the reference job for the ``larger`` model in three
    folders (:func:`ait_env.agents.reference.lr_sweep`), runs them at once (``submit_jobs``), then ``finish``.
    The same script as the Tinker dry run's ``research_batch`` plan."""
    from ait_env.agents.reference import lr_sweep

    def policy(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        sweep = lr_sweep(plan_files(_text(messages))) if turn > 1 else {}
        calls: list[tuple[str, dict[str, Any]]]
        if turn == 0:
            calls = [("read_file", {"path": "job.toml"})]
        elif turn == 1:
            calls = [("get_baseline_scores", {})]
        elif turn == 2:
            calls = [("write_file", {"path": k, "content": v}) for k, v in sweep.items()]
        elif turn == 3:
            calls = [("submit_jobs", {"folders": sorted({p.split("/")[0] for p in sweep})})]
        else:
            calls = [("finish", {})]
        if not structured:
            return {"content": "\n".join(f"<tool_call>{json.dumps({'name': n, 'arguments': a})}</tool_call>"
                                         for n, a in calls)}
        return {"content": f"Turn {turn}.",
                "tool_calls": [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]}

    return policy
