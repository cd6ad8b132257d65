"""The workspace's read-only ``task_data.py``: one task's public data as Python, and how a rollout gets its world.

Contract of :func:`task_data_source`: the module it renders defines, for every family, ``FAMILY``,
``SYSTEM_PROMPT`` (the hidden eval's system prompt), ``DEV_EXAMPLES`` (the task text's dev examples as
``{"question", "answer"}`` dicts, with a stateful family's world in ``"info"``), ``STATE_ARGS`` (the tools'
world parameters; empty when stateless) and ``rollout_state(info)`` (a fresh ``{arg: world}`` per call; ``{}``
when stateless). It is valid Python whatever the texts hold and carries no hidden-eval question.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from task_families.base import TASK_DATA_MODULE_NAME, TOOLS_MODULE_NAME

if TYPE_CHECKING:
    from task_families.base import Instance, TaskFamily, TaskSpec


def task_data_source(family: "TaskFamily", spec: "TaskSpec") -> str:
    """The read-only workspace module ``task_data.py`` of one task of ``family``: the data the task text shows
    (the hidden eval's system prompt, the dev examples, a stateful family's dev worlds in each row's
    ``info``), importable so that a job uses it without copying it by hand, and how a rollout gets its
    world (``STATE_ARGS``, ``rollout_state``: the same names in every family, so one environment serves a
    stateless family and a stateful one). Public data only: the hidden eval never enters it.

    Convention of a stateful family: its tools module has ``new_world(spec)`` and :meth:`TaskFamily.job_info` carries
    that spec as ``info["world"]``."""
    def row(e: Instance) -> str:
        info = family.job_info(e)
        text = f"{json.dumps(e.question, ensure_ascii=False)}, \"answer\": {json.dumps(e.answer, ensure_ascii=False)}"
        return "    {\"question\": " + text + (f", \"info\": {info!r}" if info else "") + "},"
    rows = "\n".join(row(e) for e in spec.dev_examples)
    if family.state_args:
        state = (f"from {TOOLS_MODULE_NAME} import new_world\n\n"
                 f"#: the tools' parameters that are the rollout's world (the environment fills them; the model never\n"
                 f"#: sees them)\nSTATE_ARGS = {list(family.state_args)!r}\n\n\n"
                 "def rollout_state(info: dict | None) -> dict:\n"
                 "    \"\"\"A fresh world for one rollout, from its dataset row's ``info``: {arg: world} to put in the\n"
                 "    rollout's state and pass to every tool call.\"\"\"\n"
                 "    world = new_world((info or {})[\"world\"])\n"
                 "    return {arg: world for arg in STATE_ARGS}\n")
    else:
        state = ("#: this family's tools change nothing: a rollout has no world\nSTATE_ARGS: list[str] = []\n\n\n"
                 "def rollout_state(info: dict | None) -> dict:\n"
                 "    \"\"\"A rollout's world: none in this family.\"\"\"\n"
                 "    return {}\n")
    return (f'"""Public data of task {spec.instance_id} (read-only): what the task text shows.\n\n'
            f'Use it from your environment: ``from {TASK_DATA_MODULE_NAME} import SYSTEM_PROMPT, DEV_EXAMPLES``.\n"""\n\n'
            f"{state}\n\n"
            f"FAMILY = {family.name!r}\n"
            f"#: the system prompt the hidden eval gives the trained model\n"
            f"SYSTEM_PROMPT = {family.eval_system_prompt!r}\n"
            f"#: the task's dev examples (never in the hidden eval)\n"
            f"DEV_EXAMPLES = [\n{rows}\n]\n")
