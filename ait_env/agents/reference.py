"""The scripted reference agent: a fixed sequence of tool calls that writes and submits the
family's reference job (``task_families/<family>/reference/``) through the env's text actions.

It reads the allowed base models from ``info["base_models"]`` and picks the one with role
``larger`` (else the first). The reference job is the yardstick for measurements: it is what a
competent engineer would write.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import task_families


def reference_files(family: str, base_model: str, backend: str | None = None) -> dict[str, str]:
    """The reference job's files for ``family`` with ``base_model`` filled in.

    A competent engineer sizes the job for the hardware: ``job.<backend>.toml`` (e.g. ``job.local.toml``
    for the tiny CPU models) replaces ``job.toml`` when it exists."""
    root = Path(task_families.__file__).parent / family / "reference"
    if not root.is_dir():
        raise FileNotFoundError(f"family {family!r} has no reference job ({root})")
    out = {}
    for p in sorted(root.iterdir()):
        if p.is_file() and not p.name.startswith(".") and p.suffix in (".py", ".toml", ".md") \
                and not (p.suffix == ".toml" and p.name != "job.toml"):
            out[p.name] = p.read_text(encoding="utf-8").replace("{base_model}", base_model)
    variant = root / f"job.{backend}.toml"
    if backend and variant.is_file():
        out["job.toml"] = variant.read_text(encoding="utf-8").replace("{base_model}", base_model)
    return out


def tool_call(name: str, **arguments: Any) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def pick_model(info: dict[str, Any]) -> str:
    models = info.get("base_models") or []
    for m in models:
        if m.get("role") == "larger":
            return m["name"]
    if not models:
        raise ValueError("info has no base_models")
    return models[0]["name"]


class ScriptedReferenceAgent:
    """Call :meth:`act` with the last observation and info; returns the next assistant turn."""

    def __init__(self, files: dict[str, str] | None = None) -> None:
        self._override = files
        self._plan: list[str] = []

    def reset(self, info: dict[str, Any]) -> None:
        files = self._override or reference_files(info["family"], pick_model(info), info.get("backend"))
        writes = "\n".join(tool_call("write_file", path=k, content=v) for k, v in files.items())
        self._plan = [
            "I'll look at the workspace first.\n" + tool_call("list_files") + "\n"
            + tool_call("read_file", path="INSTRUCTIONS.md"),
            tool_call("get_baseline_scores"),
            "Writing the job and its environment.\n" + writes,
            tool_call("submit_job"),
        ]

    def act(self, observation: str, info: dict[str, Any]) -> str:  # noqa: ARG002
        if not self._plan:
            return tool_call("submit_job")
        return self._plan.pop(0)
