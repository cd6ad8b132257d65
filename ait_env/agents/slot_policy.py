"""A small policy over a job's decision slots: the LLM-free outer-loop agent and the honest baseline for
any LLM agent.

The agent starts from the family's reference job for the local backend
(:func:`task_families.reference_files`) and decides each **slot** (:data:`SLOTS`): the base
model, the learning rate (with ``min_lr`` = lr / 10), ``max_steps`` (with the warmup kept below it), the
sampling temperature, batch and group size, the loss and algorithm variants, the rubric's weighting of
its reward functions and the dataset's difficulty range (the last two edit ``environment.py`` where the
family's reference has the line they change). It plays the episode through the env's ordinary text tool
calls: it reads the workspace's ``job.toml`` template, writes its ``job.toml`` and ``environment.py``,
then submits (:func:`play`).

In a research episode (``env.max_jobs_per_episode > 1``) a last slot, ``sweep`` (:data:`SWEEP`), decides
between one job (``single``: written at the workspace root, ``submit_job``) and a two-job learning-rate
sweep (``lr_pair``: the chosen learning rate and its neighbour on the menu, each in its own folder, run at
once with ``submit_jobs``); either way the agent then calls ``finish``. The env's reward (the best job less
the charge of the second) teaches it whether the sweep pays.

:class:`SlotPolicy` holds one categorical distribution per slot (independent logits), samples choices
from a seeded generator and takes group-relative policy-gradient steps with Adam on the logits. What it
cannot do: write a new reward function, a new dataset or any setting outside its menu; it picks from a
fixed set of knobs of a fixed recipe, like a hyperparameter search that learns from the env's reward.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ait_env.agents.reference import tool_call
from task_families import reference_files

Files = dict[str, str]


def _toml(files: Files, key: str, value: str) -> Files:
    """Set ``key = value`` on the first line that sets ``key`` in job.toml."""
    text, n = re.subn(rf"(?m)^{re.escape(key)} = .*$", f"{key} = {value}", files["job.toml"], count=1)
    if n != 1:
        raise ValueError(f"job.toml has no line '{key} = ...' to set")
    return {**files, "job.toml": text}


def _table_type(files: Files, table: str, value: str) -> Files:
    """Set ``type`` in ``[prime_rl.<table>]``."""
    text, n = re.subn(rf'(?ms)^(\[prime_rl\.{table}\]\ntype = )"[^"]*"', rf'\g<1>"{value}"', files["job.toml"], count=1)
    if n != 1:
        raise ValueError(f"job.toml has no [prime_rl.{table}] type to set")
    return {**files, "job.toml": text}


def _lr(files: Files, lr: float) -> Files:
    files = _toml(files, "lr", repr(float(lr)))
    if re.search(r"(?m)^min_lr = ", files["job.toml"]):
        files = _toml(files, "min_lr", repr(round(lr / 10, 12)))
    return files


def _steps(files: Files, steps: int) -> Files:
    """``max_steps``, with a warmup kept below it (a fifth of the steps at most, as a schedule needs)."""
    files = _toml(files, "max_steps", str(steps))
    warm = re.search(r"(?m)^warmup_steps = (\d+)", files["job.toml"])
    if warm and int(warm.group(1)) > steps // 5:
        files = _toml(files, "warmup_steps", str(min(int(warm.group(1)), steps // 5)))
    return files


def _batch(files: Files, bg: tuple[int, int]) -> Files:
    return _toml(_toml(files, "batch_size", str(bg[0])), "group_size", str(bg[1]))


def _env_text(old: str, new: Callable[[Any], str]) -> Callable[[Files, Any], Files]:
    """An edit of environment.py that replaces ``old`` (a family without that line keeps its file)."""
    def apply(files: Files, value: Any) -> Files:
        if old not in files["environment.py"]:
            return files
        return {**files, "environment.py": files["environment.py"].replace(old, new(value), 1)}
    return apply


@dataclass(frozen=True)
class Slot:
    name: str
    choices: tuple[Any, ...]
    apply: Callable[[Files, Any], Files]

    def label(self, i: int) -> str:
        c = self.choices[i]
        return "-".join(str(x) for x in c) if isinstance(c, tuple) else str(c)


#: The decision slots (the base model's choices are the backend's catalog, see :func:`slots_for`).
SLOTS: tuple[Slot, ...] = (
    Slot("lr", (0.0, 3e-7, 3e-6, 3e-5), _lr),
    Slot("max_steps", (5, 15, 27), _steps),
    Slot("temperature", (0.7, 1.0), lambda f, v: _toml(f, "temperature", str(v))),
    Slot("batch_group", ((48, 8), (32, 4)), _batch),
    Slot("loss", ("default", "ipo"), lambda f, v: _table_type(f, "loss", v)),
    Slot("algo", ("grpo", "max_rl"), lambda f, v: _table_type(f, "algo", v)),
    Slot("rubric", ((0.9, 0.1), (1.0, 0.0), (0.5, 0.5)),
         _env_text("weights=[0.9, 0.1]", lambda w: f"weights=[{w[0]}, {w[1]}]")),
    Slot("difficulty", ((0.3, 1.0), (0.0, 1.0), (0.0, 0.5)),
         _env_text("0.3 + 0.7 * rng.random()", lambda d: f"{d[0]} + {round(d[1] - d[0], 3)} * rng.random()")),
)


#: a research episode's last slot: one job, or a two-job learning-rate sweep run at once (``submit_jobs``)
SWEEP = Slot("sweep", ("single", "lr_pair"), lambda f, v: f)


def slots_for(models: list[str], research: bool = False) -> tuple[Slot, ...]:
    """The slots of a run: the base model (the catalog's models) first, then :data:`SLOTS`, and in a
    research episode :data:`SWEEP`."""
    return (Slot("base_model", tuple(models), lambda f, v: f), *SLOTS, *((SWEEP,) if research else ()))


def job_files(family: str, slots: tuple[Slot, ...], choice: dict[str, int], backend: str) -> Files:
    """The files the agent writes for these slot choices (the sweep slot writes nothing itself)."""
    pick = {s.name: s.choices[choice[s.name]] for s in slots}
    files = reference_files(family, pick["base_model"], backend)
    for s in slots[1:]:
        files = s.apply(files, pick[s.name])
    return files


def episode_jobs(family: str, slots: tuple[Slot, ...], choice: dict[str, int], backend: str) -> list[Files]:
    """The jobs of an episode: one, or with ``sweep`` = ``lr_pair`` two that differ only in the learning rate
    (the chosen one and the next on the menu; the highest's neighbour is the one below it)."""
    jobs = [job_files(family, slots, choice, backend)]
    if "sweep" in choice and SWEEP.choices[choice["sweep"]] == "lr_pair":
        n = len(SLOTS[0].choices)
        k = choice["lr"]
        jobs.append(job_files(family, slots, {**choice, "lr": k + 1 if k + 1 < n else k - 1}, backend))
    return jobs


def play(env: Any, family: str, seed: int, files_for: Callable[[str], Files | list[Files]]) -> tuple[dict[str, Any], int]:
    """One episode through the env's text tool calls: read the job template, write the files, submit.
    ``files_for`` gives one job's files, or several jobs (each written to its folder ``job<k>/`` and submitted
    at once with ``submit_jobs``). A research episode still open after its jobs ends with ``finish``.
    Returns the final ``info`` and the number of turns."""
    obs, info = env.reset(seed=seed, options={"family": family})
    env.step(tool_call("read_file", path="job.toml"))
    jobs = files_for(family)
    jobs = jobs if isinstance(jobs, list) else [jobs]
    folders = [f"job{k}" for k in range(len(jobs))] if len(jobs) > 1 else ["."]
    env.step("".join(tool_call("write_file", path=k if d == "." else f"{d}/{k}", content=v)
                     for d, files in zip(folders, jobs) for k, v in files.items()))
    turns, done = 2, False
    submit = tool_call("submit_job") if folders == ["."] else tool_call("submit_jobs", folders=folders)
    while not done:
        _, _, terminated, truncated, info = env.step(submit)
        turns += 1
        done = terminated or truncated
        if not done and info.get("jobs"):   # a research episode after its jobs ran: end it
            submit = tool_call("finish")
    return info, turns


class SlotPolicy:
    """Independent categorical distributions over the slots' choices; group-relative policy gradient
    with Adam on the logits (plain Python: a few dozen numbers)."""

    def __init__(self, slots: tuple[Slot, ...], lr: float, seed: int = 0, betas: tuple[float, float] = (0.9, 0.999)):
        self.slots = slots
        self.lr = lr
        self.rng = random.Random(seed)
        self.logits = {s.name: [0.0] * len(s.choices) for s in slots}
        self._m = {s.name: [0.0] * len(s.choices) for s in slots}
        self._v = {s.name: [0.0] * len(s.choices) for s in slots}
        self._betas = betas
        self._t = 0

    def probs(self, name: str) -> list[float]:
        z = self.logits[name]
        top = max(z)
        e = [math.exp(x - top) for x in z]
        total = sum(e)
        return [x / total for x in e]

    def sample(self) -> dict[str, int]:
        return {s.name: self.rng.choices(range(len(s.choices)), weights=self.probs(s.name))[0] for s in self.slots}

    def entropy(self) -> float:
        return sum(-sum(p * math.log(p) for p in self.probs(s.name) if p > 0) for s in self.slots)

    def update(self, choices: list[dict[str, int]], advantages: list[float]) -> float:
        """One Adam step on ``-mean(advantage * log pi(choices))``; returns the gradient's norm."""
        if not choices:
            return 0.0
        grads = {s.name: [0.0] * len(s.choices) for s in self.slots}
        for choice, adv in zip(choices, advantages, strict=True):
            for s in self.slots:
                p = self.probs(s.name)
                for j in range(len(p)):  # d log softmax / d logit_j = 1[j = choice] - p_j; descend -adv * that
                    grads[s.name][j] -= adv * ((1.0 if j == choice[s.name] else 0.0) - p[j]) / len(choices)
        self._t += 1
        b1, b2 = self._betas
        norm = 0.0
        for name, g in grads.items():
            for j, gj in enumerate(g):
                norm += gj * gj
                self._m[name][j] = b1 * self._m[name][j] + (1 - b1) * gj
                self._v[name][j] = b2 * self._v[name][j] + (1 - b2) * gj * gj
                m_hat = self._m[name][j] / (1 - b1 ** self._t)
                v_hat = self._v[name][j] / (1 - b2 ** self._t)
                self.logits[name][j] -= self.lr * m_hat / (math.sqrt(v_hat) + 1e-8)
        return math.sqrt(norm)

    def state(self) -> dict[str, Any]:
        return {"logits": self.logits, "m": self._m, "v": self._v, "t": self._t, "rng": self.rng.getstate()}
