"""``AIT/JobWriting-v0`` for TRL's ``GRPOTrainer`` (pinned: trl 1.16.0, transformers 5.24.0).

TRL trains agents on stateful multi-turn environments through ``GRPOTrainer(environment_factory=...)``
(docs: "Agent Training" in the GRPO trainer guide, and the OpenEnv guide, whose environments plug into
the same slot). The contract, and how this module meets it:

- **The factory** is called with no argument, once for each rollout that runs at the same time; TRL
  keeps the instances and calls ``reset`` before each episode. :class:`EnvironmentFactory` is that
  callable: it holds the run's one backend (an env never closes a backend it was given) and the env
  settings, builds one :class:`JobWritingToolEnv` per call, and :meth:`EnvironmentFactory.close` closes
  their envs (removing the workspaces) when the run ends.
- **``reset(**row)``** gets the dataset row's columns: :meth:`EnvironmentFactory.dataset` gives rows with
  ``prompt`` (the system prompt without its tool sections, then an empty user message), ``family`` and
  ``instance``, and ``reset`` returns the task text, which TRL appends to that user message. GRPO repeats
  each row ``num_generations`` times, so a group shares one task instance. Without a dataset, ``reset``
  samples a task and returns the system prompt and the task as one text.
- **Tools**: every public method but ``reset`` and ``get_reward`` is a tool. The six methods are the
  env's tools (their docstrings come from :func:`ait_env.episode.tools.tool_docs`, the env's own schemas); a
  research episode (``env.max_jobs_per_episode > 1`` in the factory's ``overrides``) gets
  :class:`ResearchToolEnv`, which adds ``submit_jobs`` and ``finish`` and the research ``submit_job``; the
  model's chat template declares them and TRL parses the calls. Each call is **one env step** (one turn
  of ``env.max_turns``), sent as a ``<tool_call>`` action (:func:`ait_env.episode.messages.call_block`:
  whatever values TRL parsed, the env reads them through :mod:`ait_env.jobs.guard` and answers a value it
  cannot use with what to fix); the tool result is the env's observation. A call after the episode ended
  raises ``ValueError``, which TRL feeds back to the model as the tool's error.
- **``get_reward()``**: the env's reward. TRL ends a rollout when the model answers without a tool call
  or the token budget (``max_completion_length``) runs out; an episode still open then is played out
  with empty turns until the env's turn limit, so the env itself scores it (``invalid`` 0 or
  ``unparsable`` -0.1). An ``infra_failed`` episode returns ``None``: TRL 1.16 turns ``None`` into NaN,
  and a completion whose every reward source is NaN is "unscorable" — left out of its group's mean and
  std, advantage forced to 0, left out of the logged reward — so it is dropped, never scored as zero
  (``GRPOTrainer._calculate_rewards`` and ``_generate_and_score_completions``). Keep the env the only
  reward source, or return ``None`` from every other reward function for such rollouts.
- **Tokenizers**: :func:`prepare_tokenizer` lets TRL parse the tool calls of the project's own tiny
  models (their chat format, :mod:`cpu.tiny_models.chat`) and gives a ChatML model whose template has no
  tools (SmolLM2-135M-Instruct) a ChatML template with Hermes tool calls; models whose chat template TRL knows
  (Qwen3, Llama 3, ...) need nothing.

Every TRL- and transformers-version-specific detail of the project lives in this module.
"""

from __future__ import annotations

import importlib.util
import logging
import random
from typing import Any

import gymnasium as gym

import ait_env  # noqa: F401  (registers AIT/JobWriting-v0)
from ait_env.backends import Backend
from ait_env.config import Settings, compose, split_families
from cpu.tiny_models.chat import CHAT_TEMPLATE
from ait_env.episode.messages import call_block
from ait_env.episode.spec import ResearchTerms, episode_system_prompt, strip_tool_sections
from ait_env.episode.tools import TOOL_DOCS, tool_docs
from task_families import FAMILY_NAMES

logger = logging.getLogger(__name__)


def static_probe_without_verifiers(overrides: list[str] | dict[str, Any] | None,
                                   has_verifiers: bool | None = None) -> list[str] | dict[str, Any] | None:
    """``overrides`` for a venv without verifiers (TRL's, ``.venv-trl``: verifiers 0.2.0 cannot be installed
    next to TRL): the probe's dynamic stage switched off by setting, which is the probe the env builds
    anyway without verifiers (static stage only), minus its per-env warning whose advice (install the
    ``inner`` extra) cannot be followed there. Unchanged where verifiers is installed."""
    if has_verifiers is None:
        has_verifiers = importlib.util.find_spec("verifiers") is not None
    if has_verifiers:
        return overrides
    if overrides is None or isinstance(overrides, list):
        return [*(overrides or []), "env.probe.enabled=false"]
    env = dict(overrides.get("env") or {})
    env["probe"] = {**dict(env.get("probe") or {}), "enabled": False}
    return {**overrides, "env": env}

ENV_ID = "AIT/JobWriting-v0"

# How transformers (>= 5.13, ``tokenizer.response_template``) splits a generated turn of the local models'
# chat format into text and tool calls: ``text<tool_call>{json}</tool_call>...<|im_end|>``.
LOCAL_RESPONSE_TEMPLATE: dict[str, Any] = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {"open": "<tool_call>", "close_pattern": r"</tool_call>\s*", "repeats": True,
                       "content": "json", "transform": {"type": "function", "function": "{content}"}},
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}


def prepare_tokenizer(tokenizer: Any) -> Any:
    """Make ``tokenizer`` one TRL can train a tool-calling agent with:

    - the project's local models (chat template :data:`cpu.tiny_models.chat.CHAT_TEMPLATE`) get the response
      template TRL needs to parse their tool calls (transformers >= 5.13 reads it; the ``trl`` extra pins 5.24.0);
    - a ChatML model whose own template cannot render tools (SmolLM2-135M-Instruct's: ``GRPOTrainer`` refuses it,
      "The provided chat template does not support tool calling") gets TRL's Qwen2.5 template, which is ChatML
      with Hermes tool calls (tools listed in the system message, ``<tool_call>{json}</tool_call>`` in the reply,
      results as ``<tool_response>`` in a user turn: the env's own text format) and whose replies TRL parses
      (``trl.chat_template_utils.add_response_schema`` knows it), with a warning in the log. Note its default system
      message when a conversation has none ("You are Qwen, ..."): the env's prompts always have one;
    - any other tokenizer is returned unchanged (TRL sets a parser itself for the formats it knows)."""
    if tokenizer.chat_template == CHAT_TEMPLATE and getattr(tokenizer, "response_template", None) is None:
        tokenizer.response_template = LOCAL_RESPONSE_TEMPLATE
    elif "<|im_start|>" in (tokenizer.chat_template or "") and not _renders_tool_calls(tokenizer):
        from trl.chat_template_utils import qwen2_5_chat_template

        logger.warning("the tokenizer's ChatML chat template cannot render tool calls: using TRL's Qwen2.5 "
                       "template (ChatML with Hermes tool calls) so that GRPOTrainer can train it with tools")
        tokenizer.chat_template = qwen2_5_chat_template
    return tokenizer


def _renders_tool_calls(tokenizer: Any) -> bool:
    """TRL's own check (``supports_tool_calling``): the template renders a call's name, arguments and result."""
    from trl.chat_template_utils import supports_tool_calling

    return bool(supports_tool_calling(tokenizer))


def _docstring(name: str, research: bool = False) -> str:
    """A Google-style docstring for tool ``name`` from the env's own description and argument help (TRL
    builds each tool's JSON schema from its method's docstring and type hints)."""
    description, args_model = tool_docs(research)[name]
    lines = [description]
    if args_model.model_fields:
        fields = args_model.model_fields.items()
        lines += ["", "Args:"] + [f"    {k}: {f.description or k}" for k, f in fields]
    return "\n".join(lines + ["", "Returns:", "    The env's answer: the tool's output or what to fix."])


class JobWritingToolEnv:
    """One ``AIT/JobWriting-v0`` env as a TRL environment. Built by :class:`EnvironmentFactory`."""

    def __init__(self, env: gym.Env) -> None:
        self.env = env
        self.info: dict[str, Any] = {}
        """The env's last ``info`` (at the end: ``reward``, the breakdown, and ``job``)."""
        self.done = True

    # ---- reserved by TRL: not tools
    def reset(self, family: str | None = None, instance: int | None = None, **row: Any) -> str:
        """Start an episode on the row's ``family`` and ``instance`` (sampled when absent)."""
        options = {k: v for k, v in (("family", family), ("instance", instance)) if v is not None}
        _, self.info = self.env.reset(options=options)
        self.done = False
        task = self.info["messages"][1]["content"]
        if "prompt" in row:  # the dataset's prompt holds the system message (EnvironmentFactory.dataset)
            return task
        return strip_tool_sections(self.info["messages"][0]["content"]) + "\n\n" + task

    def get_reward(self) -> float | None:
        """The env's reward for the episode; ``None`` for an ``infra_failed`` one (dropped by TRL)."""
        while not self.done:  # TRL ended the rollout first: the remaining turns pass without a call
            self._step("")
        breakdown = self.info["reward"]
        return None if breakdown["drop"] else float(breakdown["total"])

    # ---- the six tools (docstrings from ait_env.episode.tools.TOOL_DOCS, set below)
    def read_file(self, path: str) -> str:
        return self._call("read_file", path=path)

    def write_file(self, path: str, content: str) -> str:
        return self._call("write_file", path=path, content=content)

    def edit_file(self, path: str, old_text: str, new_text: str) -> str:
        return self._call("edit_file", path=path, old_text=old_text, new_text=new_text)

    def list_files(self) -> str:
        return self._call("list_files")

    def get_baseline_scores(self) -> str:
        return self._call("get_baseline_scores")

    def submit_job(self) -> str:
        return self._call("submit_job")

    # ---- plumbing
    def _call(self, name: str, **arguments: Any) -> str:
        if self.done:
            raise ValueError("The episode is over; answer without calling tools.")
        obs = self._step(call_block(name, arguments))  # whatever TRL parsed: the env refuses what it cannot use
        # One call per step: the observation is "<tool_response>\n{result}\n</tool_response>" and maybe a
        # note (the turn limit); TRL wraps the result in the chat template's tool message itself.
        body, wrapped, note = obs.removeprefix("<tool_response>\n").rpartition("\n</tool_response>")
        return body + note if wrapped else obs

    def _step(self, action: str) -> str:
        obs, _, terminated, truncated, self.info = self.env.step(action)
        self.done = terminated or truncated
        return obs


class ResearchToolEnv(JobWritingToolEnv):
    """A research episode's TRL environment: the six tools, ``submit_jobs`` (several jobs at once, one per
    workspace folder) and ``finish`` (docstrings from :data:`ait_env.episode.tools.RESEARCH_TOOL_DOCS`)."""

    def submit_job(self) -> str:
        return self._call("submit_job")

    def submit_jobs(self, folders: list[str]) -> str:
        return self._call("submit_jobs", folders=folders)

    def finish(self) -> str:
        return self._call("finish")


for _name in TOOL_DOCS:
    getattr(JobWritingToolEnv, _name).__doc__ = _docstring(_name)
for _name in tool_docs(research=True):
    getattr(ResearchToolEnv, _name).__doc__ = _docstring(_name, research=True)


class EnvironmentFactory:
    """``environment_factory`` for ``GRPOTrainer``: one :class:`JobWritingToolEnv` per call, all sharing
    ``backend`` (one per run; its owner closes it). Use as a context manager, or call :meth:`close`.

    ``family``: one family, or ``"train"`` (the families not held out); ``overrides``: env settings as
    for ``gym.make`` (e.g. ``["env.max_turns=8"]``)."""

    def __init__(self, backend: Backend, *, family: str = "train",
                 overrides: list[str] | dict[str, Any] | None = None) -> None:
        if not isinstance(backend, Backend):
            raise TypeError("backend must be a Backend instance shared by the run, got "
                            f"{type(backend).__name__}; build one with ait_env.backends.make_backend("
                            "ait_env.config.compose(backend='stub').backend)")
        self.backend = backend
        self.family = family
        self.overrides = static_probe_without_verifiers(overrides)
        if self.overrides is not overrides:
            logger.info("verifiers is not installed (TRL's venv cannot have it): submit_job runs the validation "
                        "probe's static stage only (docs/trl.md)")
        self.envs: list[JobWritingToolEnv] = []

    def __call__(self) -> JobWritingToolEnv:
        cls = ResearchToolEnv if ResearchTerms.from_settings(self.settings) else JobWritingToolEnv
        env = cls(gym.make(ENV_ID, family=self.family, backend=self.backend, overrides=self.overrides))
        self.envs.append(env)
        return env

    @property
    def settings(self) -> Settings:
        return compose(family=self.family, overrides=self.overrides)

    def dataset(self, n: int, seed: int = 0) -> Any:
        """``n`` rows (a ``datasets.Dataset``) of ``prompt`` (system message without tool sections, empty
        user message), ``family`` and ``instance``, drawn with ``seed``."""
        from datasets import Dataset

        system = strip_tool_sections(episode_system_prompt(self.settings))
        families = split_families(FAMILY_NAMES)[0] if self.family == "train" else [self.family]
        rng = random.Random(seed)
        rows = [(rng.choice(families), rng.randrange(2**31 - 1)) for _ in range(n)]
        return Dataset.from_dict({
            "prompt": [[{"role": "system", "content": system}, {"role": "user", "content": ""}]] * n,
            "family": [f for f, _ in rows], "instance": [i for _, i in rows]})

    def close(self) -> None:
        """Close every env built (removes their workspaces); the backend stays open."""
        for env in self.envs:
            env.env.close()
        self.envs.clear()

    def __enter__(self) -> EnvironmentFactory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
