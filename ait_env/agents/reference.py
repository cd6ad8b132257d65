"""The scripted reference agent: a fixed sequence of tool calls that writes and submits the
family's reference job (``task_families/<family>/reference/``) through the env's text actions.

It reads the allowed base models from ``info["base_models"]``, asks for their baseline scores and
trains the one that scores best before training (the reward measures uplift over the best of them, so
training a weaker model starts below the bar); ties, and a baseline tool that answers with an error,
fall back to the model with role ``larger`` (else the first). The reference job is the yardstick for
measurements: it is what a competent engineer would write.

:class:`TwoJobReferenceAgent` plays a research episode (``env.max_jobs_per_episode >= 2``): a deliberately
short first job (the reference with ``first_steps`` steps), then, when that job's eval-point curve was still
rising at its end, the reference job with its own steps; otherwise (flat or falling, or a failed job) it
calls ``finish`` and keeps the first.
"""

from __future__ import annotations

import json
import re
from typing import Any

from task_families import reference_files


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
_DECIDE = "<read the first job's result: a longer job, or finish>"
_AFTER = "<finish, unless the episode already ended>"


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

    def _job_files(self, model: str) -> dict[str, str]:
        """The files of the job this agent submits (first) for ``model``."""
        return self._override or reference_files(self._info["family"], model, self._info.get("backend"))

    def _writes(self, observation: str) -> str:
        info = self._info
        names = [m["name"] for m in info.get("base_models") or []]
        self.model = pick_model(info, baseline_scores(observation, names))
        files = self._job_files(self.model)
        writes = "\n".join(tool_call("write_file", path=k, content=v) for k, v in files.items())
        return f"Training {self.model}, the best base model before training. Writing the job and its environment.\n" + writes

    def act(self, observation: str, info: dict[str, Any]) -> str:  # noqa: ARG002
        if not self._plan:
            return tool_call("submit_job")
        turn = self._plan.pop(0)
        return self._writes(observation) if turn == _WRITE else turn


def eval_curve(observation: str) -> list[tuple[float, float]]:
    """The ``step: score`` pairs of the "Eval points during training" line of a research episode's job
    result (empty when there is none)."""
    m = re.search(r"Eval points during training \(step: score\): (.*)", observation)
    if not m:
        return []
    return [(float(a), float(b)) for a, b in re.findall(r"(\d+(?:\.\d+)?): ([01](?:\.\d+)?)", m.group(1))]


def still_rising(curve: list[tuple[float, float]], min_rise: float) -> bool:
    """True when the curve's last segment rose by more than ``min_rise``."""
    return len(curve) >= 2 and curve[-1][1] - curve[-2][1] > min_rise


def with_steps(job_toml: str, steps: int) -> str:
    """``job_toml`` with ``max_steps = steps`` and its warmup cut to at most half of them (a cosine schedule
    needs warmup_steps < max_steps)."""
    text, n = re.subn(r"(?m)^max_steps = .*$", f"max_steps = {steps}", job_toml)
    if not n:
        raise ValueError("the job.toml has no max_steps line")
    return re.sub(r"(?m)^warmup_steps = (\d+)",
                  lambda m: f"warmup_steps = {min(int(m.group(1)), steps // 2)}", text)


#: the learning rates of :func:`lr_sweep` (the reference's 3e-6, a tenth of it, ten times it)
SWEEP_LRS: tuple[float, ...] = (3e-7, 3e-6, 3e-5)


def with_lr(job_toml: str, lr: float) -> str:
    """``job_toml`` with ``lr = lr`` and, where it sets one, ``min_lr`` a tenth of it."""
    text, n = re.subn(r"(?m)^lr = .*$", f"lr = {lr!r}", job_toml, count=1)
    if not n:
        raise ValueError("the job.toml has no lr line")
    return re.sub(r"(?m)^min_lr = .*$", f"min_lr = {round(lr / 10, 12)!r}", text, count=1)


def lr_sweep(files: dict[str, str], lrs: tuple[float, ...] = SWEEP_LRS) -> dict[str, str]:
    """A learning-rate sweep for ``submit_jobs``: the job ``files`` once per learning rate, each in its own
    folder ``lr_<k>/`` (workspace path -> text). The folders are ``sorted({p.split("/")[0] for p in ...})``."""
    out: dict[str, str] = {}
    for k, lr in enumerate(lrs):
        for name, text in files.items():
            out[f"lr_{k}/{name}"] = with_lr(text, lr) if name == "job.toml" else text
    return out


class TwoJobReferenceAgent(ScriptedReferenceAgent):
    """The reference agent for a research episode: a short first job of ``first_steps`` steps, then the
    reference job (its own steps) when the first job's eval curve rose by more than ``min_rise`` over its
    last segment, else ``finish``. :attr:`curve` and :attr:`second` say what it read and decided."""

    def __init__(self, first_steps: int = 5, min_rise: float = 0.01) -> None:
        super().__init__()
        self.first_steps = first_steps
        self.min_rise = min_rise

    def reset(self, info: dict[str, Any]) -> None:
        super().reset(info)
        self.curve: list[tuple[float, float]] = []
        self.second: bool | None = None
        self._plan = [*self._plan, _DECIDE, tool_call("submit_job"), _AFTER]

    def _job_files(self, model: str) -> dict[str, str]:
        files = reference_files(self._info["family"], model, self._info.get("backend"))
        self._reference_toml = files["job.toml"]
        return {**files, "job.toml": with_steps(files["job.toml"], self.first_steps)}

    def _decide(self, observation: str) -> str:
        self.curve = eval_curve(observation)
        self.second = still_rising(self.curve, self.min_rise)
        if not self.second:
            self._plan = []
            why = "was no longer rising" if self.curve else "is missing (the job failed)"
            return f"The first job's eval curve {why}; I stop here.\n" + tool_call("finish")
        return ("The first job's curve was still rising at its end: the same job with the reference's "
                "steps.\n" + tool_call("write_file", path="job.toml", content=self._reference_toml))

    def act(self, observation: str, info: dict[str, Any]) -> str:
        if self._plan and self._plan[0] == _DECIDE:
            self._plan.pop(0)
            return self._decide(observation)
        if (self._plan and self._plan[0] == _AFTER) or (not self._plan and self.second is not None):
            self._plan = []
            return tool_call("finish")
        return super().act(observation, info)
