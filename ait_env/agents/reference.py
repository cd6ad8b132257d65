"""The scripted reference agent: a fixed sequence of tool calls that writes and submits the
family's reference job (``task_families/<family>/reference/``) through the env's text actions.

It reads the allowed base models from ``info["base_models"]``, asks for their baseline scores and
trains the one that scores best before training (the reward measures uplift over the best of them, so
training a weaker model starts below the bar); ties, and a baseline tool that answers with an error,
fall back to the model with role ``larger`` (else the first). The reference job is the yardstick for
measurements: it is what a competent engineer would write.
"""

from __future__ import annotations

import json
import re
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


def baseline_scores(observation: str, names: list[str]) -> dict[str, float]:
    """``name: score`` lines of the ``get_baseline_scores`` answer, for the allowed ``names``."""
    out = {}
    for name, score in re.findall(r"(?m)^\s*(\S+): ([01](?:\.\d+)?)\s*$", observation):
        if name in names:
            out[name] = float(score)
    return out


def pick_model(info: dict[str, Any], scores: dict[str, float] | None = None) -> str:
    """The allowed model with the best baseline in ``scores``; without scores (or on a tie) the one with
    role ``larger``, else the first."""
    models = info.get("base_models") or []
    if not models:
        raise ValueError("info has no base_models")
    by_role = next((m["name"] for m in models if m.get("role") == "larger"), models[0]["name"])
    known = {m["name"]: (scores or {})[m["name"]] for m in models if m["name"] in (scores or {})}
    if not known:
        return by_role
    top = [name for name, s in known.items() if s == max(known.values())]
    return by_role if by_role in top else top[0]


_WRITE = "<write the job for the best base model>"   # plan placeholder: filled once the scores are known


class ScriptedReferenceAgent:
    """Call :meth:`act` with the last observation and info; returns the next assistant turn."""

    def __init__(self, files: dict[str, str] | None = None) -> None:
        self._override = files
        self._plan: list[str] = []

    def reset(self, info: dict[str, Any]) -> None:
        self._info = info
        self.model: str | None = None
        self._plan = [
            "I'll look at the workspace first.\n" + tool_call("list_files") + "\n"
            + tool_call("read_file", path="INSTRUCTIONS.md"),
            tool_call("get_baseline_scores"),
            _WRITE,
            tool_call("submit_job"),
        ]

    def _writes(self, observation: str) -> str:
        info = self._info
        names = [m["name"] for m in info.get("base_models") or []]
        self.model = pick_model(info, baseline_scores(observation, names))
        files = self._override or reference_files(info["family"], self.model, info.get("backend"))
        writes = "\n".join(tool_call("write_file", path=k, content=v) for k, v in files.items())
        return f"Training {self.model}, the best base model before training. Writing the job and its environment.\n" + writes

    def act(self, observation: str, info: dict[str, Any]) -> str:  # noqa: ARG002
        if not self._plan:
            return tool_call("submit_job")
        turn = self._plan.pop(0)
        return self._writes(observation) if turn == _WRITE else turn
