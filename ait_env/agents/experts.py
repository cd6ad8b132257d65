"""Expert demonstrations for warm-starting an LLM agent: scripted strategies that play ``AIT/JobWriting-v0``
through its public text actions, recorded as the chat conversations a model is cloned on.

Strategies (:data:`STRATEGIES`); every one opens the same way (read the workspace's ``job.toml`` template,
which names the family, and ``get_baseline_scores`` in one turn), then writes ``job.toml`` and
``environment.py`` in one turn and calls ``submit_job``:

- ``reference``: the family's reference job (:func:`task_families.reference_files`) on the base model with the
  best baseline (the scripted reference agent's choice, :func:`ait_env.agents.reference.pick_model`);
- ``slot``: a job of the slot policy's menu (:mod:`ait_env.agents.slot_policy`) with every slot drawn at random,
  the base model included one time in five (else the best baseline): varied, not always good, so that RL later
  has choices to tell apart;
- ``generic``: a family-agnostic job any task allows: the task's dev examples as the dataset and the eval's
  system prompt, both imported from the workspace's read-only ``task_data`` module (never copied by hand), a
  reward for the answer appearing in the model's final message, one ``job.toml`` (:data:`GENERIC_TOML`) within
  every task's bounds. Both files are the same text for every task but the family and the base model, so it is
  what transfers to a family never seen. It serves a stateful family too: ``task_data``'s ``STATE_ARGS`` and
  ``rollout_state`` (empty in a stateless family) give each rollout its own world from its row's ``info``, and
  there the reward also needs a tool call (an answer alone is not the state the eval reads);
- ``recover``: a flawed first submission (the untouched template, another family's environment, an unfilled
  base model, or the generic job with too short a ``seq_len`` for its turns), the probe's answer, then the ``generic`` job. The flawed turn is in the conversation
  but not trained on (:attr:`Demonstration.trained`): the model learns to read an error and recover, not to
  make the error.

:func:`demonstrate` plays one strategy on an env (any backend) and returns a :class:`Demonstration`: the
conversation in text tool mode (the env's whole system prompt, the task, then assistant turns and the env's
observations as user messages: what ``python -m ait_env.agents.llm --tool-mode text`` and the verifiers env's
``tool_format="text"`` show a model). The last ``submit_job`` of a job meant to be valid is checked by the
env's own validation probe but **not dispatched** (nothing is trained; the demonstration ends at that call);
a demonstration whose intended job fails validation raises :class:`ExpertError` (an expert bug, never data).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any

from ait_env.agents.reference import baseline_scores, pick_model, tool_call
from ait_env.agents.slot_policy import job_files, slots_for
from task_families import FAMILY_NAMES, get_family, reference_files

STRATEGIES = ("reference", "slot", "generic", "recover")
Files = dict[str, str]


class ExpertError(RuntimeError):
    """An expert's job that should validate did not (a bug in the expert, reported with the probe's text)."""


@dataclass
class Demonstration:
    family: str
    seed: int
    backend: str
    strategy: str
    messages: list[dict[str, str]]
    #: per message: True for the assistant turns the model is trained on
    trained: list[bool]
    choices: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"family": self.family, "seed": self.seed, "backend": self.backend, "strategy": self.strategy,
                "messages": self.messages, "trained": self.trained, "choices": self.choices}


# --------------------------------------------------------------------------- reading the task
def template_family(job_toml: str) -> str:
    m = re.search(r'(?m)^family = "([^"]+)"', job_toml)
    return m.group(1) if m else ""


# --------------------------------------------------------------------------- the generic job
GENERIC_ENV = '''import verifiers as vf
from datasets import Dataset

from family_tools import TOOLS
from task_data import DEV_EXAMPLES, STATE_ARGS, SYSTEM_PROMPT, rollout_state


def reward(completion, answer, **kwargs) -> float:
    said = [m["content"] or "" for m in completion if m["role"] == "assistant"]
    acted = not STATE_ARGS or any(m.get("tool_calls") for m in completion if m["role"] == "assistant")
    return 1.0 if acted and said and str(answer) in said[-1].split("</think>")[-1] else 0.0


class TaskEnv(vf.StatefulToolEnv):
    def __init__(self, **kwargs):
        super().__init__(tools=[], **kwargs)
        for tool in TOOLS:
            self.add_tool(tool, args_to_skip=STATE_ARGS)

    async def setup_state(self, state):
        state.update(rollout_state(state.get("info")))  # one world per rollout (none in a stateless family)
        return await super().setup_state(state)

    def update_tool_args(self, tool_name, tool_args, messages, state, **kwargs):
        return {**tool_args, **{arg: state[arg] for arg in STATE_ARGS}}


def load_environment(num_examples: int = 64, **kwargs) -> vf.Environment:
    rows = (DEV_EXAMPLES * num_examples)[:num_examples]
    rubric = vf.Rubric(funcs=[reward])
    return TaskEnv(dataset=Dataset.from_list(rows), rubric=rubric, system_prompt=SYSTEM_PROMPT, max_turns=8)
'''
#: the generic ``job.toml``: the same settings for every family and backend (within every task's bounds: the
#: local backend's 1,536-token context and 64-token turns are the tightest), so that only the family (named in the
#: template the agent reads first) and the base model change; a small model cannot tell which of a dozen
#: per-family, per-backend reference settings a task wants (the fourth run wrote the local backend's on stub)
GENERIC_TOML = """[job]
family = "{family}"
base_model = "{model}"
environment = "environment.py"

[prime_rl]
max_steps = 40
seq_len = 1536
batch_size = 64
group_size = 8

[prime_rl.sampling]
temperature = 0.7
max_tokens = 64

[prime_rl.optim]
lr = 3e-6

[env]
num_examples = 64
"""


def generic_files(family: str, model: str, backend: str, task_text: str) -> Files:
    """The ``generic`` strategy's job (module docstring): the same text for every task but the family and the
    base model, so that a small model copies it whole and it transfers to a family never seen."""
    return {"job.toml": GENERIC_TOML.format(family=family, model=model), "environment.py": GENERIC_ENV}


# --------------------------------------------------------------------------- flawed first attempts
def flawed_files(family: str, model: str, backend: str, template: Files, rng: random.Random) -> tuple[str, Files]:
    """A first submission the probe refuses: (kind, files)."""
    kinds = ["template", "unfilled_model", "short_seq_len"]
    others = [f for f in FAMILY_NAMES if f != family and f != "warehouse"]
    if others:
        kinds.append("foreign_environment")
    kind = rng.choice(kinds)
    if kind == "template":
        return kind, {"job.toml": template["job.toml"].replace("CHOOSE-A-BASE-MODEL", model),
                      "environment.py": template["environment.py"]}
    if kind == "short_seq_len":   # the probe's seq_len rule: prompt + max_turns x max_tokens must fit
        files = generic_files(family, model, backend, "")
        return kind, {**files, "job.toml": files["job.toml"].replace("seq_len = 1536", "seq_len = 512", 1)
                      .replace("max_tokens = 64", "max_tokens = 256", 1)}
    if kind == "unfilled_model":
        files = reference_files(family, model, backend)
        return kind, {**files, "job.toml": files["job.toml"].replace(f'"{model}"', '"CHOOSE-A-BASE-MODEL"', 1)}
    other = rng.choice(others)
    return f"foreign_environment:{other}", {**reference_files(family, model, backend),
                                            "environment.py": reference_files(other, model, backend)["environment.py"]}


# --------------------------------------------------------------------------- playing
def _writes(files: Files, note: str) -> str:
    return note + "\n" + "\n".join(tool_call("write_file", path=k, content=v) for k, v in files.items())


def _validate(env: Any) -> tuple[bool, str]:
    """The env's own probe on the workspace as it stands (what submit_job would run first)."""
    u = env.unwrapped
    report, job = u.probe.run(u.workspace.root, u.task, get_family(u.task.family))
    return job is not None, report.render()


def demonstrate(env: Any, family: str, seed: int, strategy: str, rng: random.Random) -> Demonstration:
    """One demonstration of ``strategy`` on ``env`` (module docstring)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose from {STRATEGIES}")
    obs, info = env.reset(seed=seed, options={"family": family})
    backend = str(info.get("backend") or "")
    messages = [{"role": m["role"], "content": m["content"]} for m in info["messages"][:2]]
    trained = [False, False]
    task_text = messages[1]["content"]

    def turn(action: str, train: bool = True, dispatch: bool = True) -> str:
        messages.append({"role": "assistant", "content": action})
        trained.append(train)
        if not dispatch:
            return ""
        out, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            raise ExpertError(f"the episode ended early on {family} seed {seed}: {out[:300]}")
        messages.append({"role": "user", "content": out})
        trained.append(False)
        return out

    obs = turn("I'll read the job template and the baseline scores first.\n"
               + tool_call("read_file", path="job.toml") + "\n" + tool_call("get_baseline_scores"))
    template = {"job.toml": env.unwrapped.workspace.read("job.toml"),
                "environment.py": env.unwrapped.workspace.read("environment.py")}
    names = [m["name"] for m in info.get("base_models") or []]
    model = pick_model(info, baseline_scores(obs, names))
    choices: dict[str, Any] = {"base_model": model}
    if strategy == "slot":
        slots = slots_for(names)
        ws = env.unwrapped.workspace
        for _ in range(20):  # some combinations are invalid (an easy dataset repeats hidden questions)
            pick = {s.name: rng.randrange(len(s.choices)) for s in slots}
            if rng.random() >= 0.2:
                pick["base_model"] = names.index(model)
            files = job_files(family, slots, pick, backend)
            for name, text in files.items():
                ws.write(name, text)
            if _validate(env)[0]:
                break
        else:
            raise ExpertError(f"no valid slot job found on {family}")
        model = names[pick["base_model"]]
        choices = {s.name: s.label(pick[s.name]) for s in slots}
        note = f"Training {model} with my own settings for this job."
    elif strategy == "reference":
        files = reference_files(family, model, backend)
        note = f"Training {model}, the best base model before training. Writing the job and its environment."
    else:
        files = generic_files(family, model, backend, task_text)
        note = (f"Training {model} on the task's dev examples, with a reward for the expected answer. "
                "Writing the job and its environment.")
    if strategy == "recover":
        ws = env.unwrapped.workspace
        for _ in range(10):  # a flaw the probe refuses (another family's environment may pass it)
            kind, flawed = flawed_files(family, model, backend, template, rng)
            for name, text in flawed.items():
                ws.write(name, text)
            if not _validate(env)[0]:
                break
        else:
            raise ExpertError(f"no flawed submission was refused on {family}")
        choices["flaw"] = kind
        turn(_writes(flawed, f"Training {model}. Writing the job and its environment."), train=False)
        answer = turn(tool_call("submit_job"), train=False)
        if "attempt" not in answer:
            raise ExpertError(f"the flawed submission ({kind}) was not refused on {family}: {answer[:300]}")
        note = "That submission was refused. I'll submit a simpler job: " + note[0].lower() + note[1:]
    turn(_writes(files, note))
    ok, report = _validate(env)
    if not ok:
        raise ExpertError(f"the {strategy} job did not validate on {family} seed {seed} ({backend}): {report[:1500]}")
    turn(tool_call("submit_job"), dispatch=False)
    return Demonstration(family, seed, backend, strategy, messages, trained, choices)
