"""The agent's system prompt (tools and call format) and its first user message (the task spec)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ait_env.jobs.toolcalls import CALL_FORMAT
from ait_env.jobs.settings import ModelInfo
from ait_env.episode.tools import tool_schemas
from task_families.base import TaskSpec

if TYPE_CHECKING:
    from ait_env.config import Settings


@dataclass(frozen=True)
class ResearchTerms:
    """What the system prompt of a research episode (several jobs) tells the agent."""

    max_jobs: int
    budget_usd: float | None     # the episode's USD budget (env.ledger.episode_budget_usd); None: none
    per_extra_job: float         # reward charged per job after the first
    per_usd: float               # reward charged per USD the jobs after the first cost

    @classmethod
    def from_settings(cls, settings: Settings) -> ResearchTerms | None:
        """The terms of a research episode under ``settings`` (None: ``env.max_jobs_per_episode`` is 1, an
        episode of one job). Every outer loop builds the prompt and the tools from this one answer."""
        es, charge = settings.env, settings.reward.research
        if es.max_jobs_per_episode <= 1:
            return None
        return cls(es.max_jobs_per_episode, es.ledger.episode_budget_usd, charge.per_extra_job, charge.per_usd)

    def rules(self, max_turns: int, max_attempts: int) -> str:
        budget = f" within a budget of ${self.budget_usd:.2f}" if self.budget_usd is not None else ""
        usd = f" and {self.per_usd:g} per USD they cost" if self.per_usd else ""
        return f"""- You have {max_turns} messages in total and {max_attempts} submit_job attempts per job.
- submit_job validates your job; if it is invalid you get every problem and may fix and resubmit.
- A valid job is trained and evaluated on hidden questions, and you see its result: scores, the curve of
  eval points during training, time, cost (and the log of a job that failed).
- You may run up to {self.max_jobs} jobs{budget}. Your reward is the reward of your best job, less
  {self.per_extra_job:g} for each job after the first{usd}: run another job only if you expect it to
  be better. A job identical to one that already ran is served from the cache and not charged.
- To run several experiments at once (e.g. a sweep), write each complete job (job.toml and its
  environment module) in its own folder and call submit_jobs with the folders: each is validated on its
  own, the valid ones train at the same time and their results come back together. Each counts as a job.
- The episode ends after the last job, when the budget cannot pay for another, at the message limit, or
  when you call finish."""


def system_prompt(max_turns: int, max_attempts: int, research: ResearchTerms | None = None) -> str:
    """The agent's system prompt; ``research``: the terms of an episode of several jobs (None: one job)."""
    schemas = tool_schemas(research=research is not None)
    tools = "\n".join(json.dumps(t, separators=(",", ":")) for t in schemas)
    head = f"""\
You are an ML engineer. You write complete reinforcement-learning training jobs that make a small
language model better at a task. You work in a sandboxed workspace through tool calls.

# Tools
<tools>
{tools}
</tools>

# How to call tools
Put each call in its own block; you may make several calls in one message:
{CALL_FORMAT}
"arguments" must be a JSON object; escape newlines (\\n) and quotes (\\") inside JSON strings.

# Rules
"""
    if research is not None:
        return head + research.rules(max_turns, max_attempts)
    return head + f"""- You have {max_turns} messages in total and {max_attempts} submit_job attempts.
- submit_job validates your job; if it is invalid you get every problem and may fix and resubmit.
- A valid job is trained and evaluated on hidden questions; that ends the episode."""


def episode_system_prompt(settings: Settings) -> str:
    """The system prompt of an episode under ``settings`` (research terms when it allows several jobs)."""
    return system_prompt(settings.env.max_turns, settings.env.max_attempts, ResearchTerms.from_settings(settings))


def episode_tools(settings: Settings) -> list[dict[str, object]]:
    """The tool schemas of an episode under ``settings``: the six, plus ``submit_jobs`` and ``finish`` exactly
    when ``env.max_jobs_per_episode > 1`` (what ``info["tools"]`` declares)."""
    return tool_schemas(research=ResearchTerms.from_settings(settings) is not None)


def strip_tool_sections(system_text: str) -> str:
    """The system prompt without its "# Tools" and "# How to call tools" sections, for an agent whose
    chat API or renderer declares the tools natively (the Tinker adapter, the LLM runner's native mode)."""
    start = system_text.find("\n# Tools")
    rules = system_text.find("\n# Rules")
    if start < 0 or rules < start:
        return system_text
    return system_text[:start].rstrip() + "\n" + system_text[rules:]


def task_message(spec: TaskSpec, catalog: list[ModelInfo], backend: str, surrogate: bool) -> str:
    roles = "\n".join(f"- `{m.name}`" + (f" ({m.role}{', ' + m.params if m.params else ''})" if m.role else "")
              for m in catalog if m.name in spec.bounds.base_models)
    note = (" This backend is a SURROGATE: scores come from a formula of the job's settings, "
            "not from training.") if surrogate else ""
    return f"{spec.text}\n## Base models available on the `{backend}` backend\n{roles}\n{note}".rstrip() + "\n"
