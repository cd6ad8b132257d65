"""``JobWritingEnv``: the Gymnasium contract of one episode = one agent writing and submitting one RL
training job (or, in a research episode, up to ``env.max_jobs_per_episode`` jobs, each result shown to the
agent).

The env keeps ``reset``, ``step``, the spaces, ``render`` and ``close``: actions are parsed by
:mod:`ait_env.jobs.toolcalls`, tools run through :class:`ait_env.episode.tools.ToolBox` on a
:class:`ait_env.sandbox.workspace.Workspace`, and ``submit_job`` / ``finish`` go to the episode's
:class:`ait_env.episode.submission.EpisodeJobs` (validation by the :class:`ait_env.probe.ValidationProbe`,
the bundle, the backend, the cost ledger, the reward of :mod:`ait_env.episode.reward`).

Observations and actions are strings. ``info`` always carries the whole conversation as
OpenAI-style ``messages``, the agent ``tools`` as JSON schemas, ``family``, ``instance_id``,
``turn``, ``attempts_left``, ``episode_id`` and ``hidden_seeds`` (``published`` or ``private:<hash>``: which
hidden-eval seeds score the episode, :mod:`ait_env.hidden.secrets`); at the end also ``reward`` (the full breakdown)
and ``job`` (the backend's result of the job the reward counts); ``jobs`` lists every job's result.

Research episodes (``env.max_jobs_per_episode > 1``): after each job the agent reads its result (pre and
post scores, the eval-point curve, wall time, cost, the log tail of a failed job) and how many jobs and how
much of the episode's USD budget (``env.ledger.episode_budget_usd``, the ledger's one per-episode budget)
remain, and may revise the workspace and submit again, submit several jobs at once (``submit_jobs``: one per
workspace folder, run concurrently, reported together), or call ``finish``. The episode ends after the last
allowed job, when what is left of the budget cannot pay for another job like the last one (or the ledger
refuses the next dispatch), at ``finish``, at the turn limit, or when a job's submit_job attempts run out;
it is then scored on the jobs that ran (:func:`ait_env.episode.reward.combine`). A failure on our side ends it
too, scored on the jobs that ran (the lost job is dropped alone, never the scored ones); only an episode in
which no job ran is dropped (``infra_failed``). ``info`` then also has ``jobs_left`` and ``budget_left_usd``.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import uuid
import warnings
from typing import Any

import gymnasium as gym

from ait_env.backends import Backend, make_backend
from ait_env.config import Settings, compose, split_families
from ait_env.episode.spaces import UnicodeText
from ait_env.episode.spec import ResearchTerms, system_prompt, task_message
from ait_env.episode.submission import EpisodeJobs
from ait_env.episode.tools import ToolBox, ToolOutcome, tool_schemas
from ait_env.hidden.baselines import seed_command
from ait_env.hidden.redact import for_agent
from ait_env.jobs.toolcalls import CALL_FORMAT, ToolCall, parse_action
from ait_env.observe.ledger import CostLedger
from ait_env.probe import ValidationProbe
from ait_env.probe.dynamic import DynamicProbe
from ait_env.sandbox.workspace import Workspace
from task_families import FAMILY_NAMES, get_family
from task_families.base import TASK_DATA_MODULE_NAME, TOOLS_MODULE_NAME, Bounds, TaskFamily, TaskSpec

_log = logging.getLogger("ait_env")


def _copy(obj: Any) -> Any:
    """Structural copy of JSON-like data (dicts and lists are new; strings are immutable)."""
    if isinstance(obj, dict):
        return {k: _copy(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_copy(v) for v in obj]
    return obj


class JobWritingEnv(gym.Env[str, str]):
    metadata = {"render_modes": ["ansi"], "render_fps": 1}

    def __init__(self, family: str = "train", backend: str | Backend = "stub", reward: str = "default",
                 env_config: str = "default", overrides: list[str] | dict[str, Any] | None = None,
                 settings: Settings | None = None, render_mode: str | None = None,
                 probe: ValidationProbe | None = None) -> None:
        """``backend``: a backend name (``conf/backend/<name>.yaml``; the env builds it and closes it in
        :meth:`close`), or a :class:`~ait_env.backends.Backend` instance shared with other envs (one per
        run; the env never closes it, its owner does)."""
        given = backend if isinstance(backend, Backend) else None
        self.settings = settings or compose(env=env_config, family=family, reward=reward,
                                            backend="stub" if given is not None else str(backend),
                                            overrides=overrides)
        if given is not None:  # the instance's settings are the backend's, whatever its config says
            self.settings = self.settings.model_copy(update={"backend": given.settings})
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}")
        self.render_mode = render_mode
        es = self.settings.env
        self.runs_dir = es.runs_path
        self._owns_backend = given is None
        self.backend: Backend = given if given is not None else make_backend(self.settings.backend, self.runs_dir)
        self.ledger = CostLedger.from_settings(es.ledger, self.runs_dir)
        self.probe = probe or self._default_probe()
        self.research = es.max_jobs_per_episode > 1
        self._tool_schemas = tool_schemas(research=self.research)
        self.observation_space = UnicodeText(es.max_observation_chars)
        self.action_space = UnicodeText(es.max_action_chars)
        self._ws: Workspace | None = None
        self._messages: list[dict[str, Any]] = []
        self._spec: TaskSpec | None = None
        self._family: TaskFamily | None = None
        self.episode_id = ""
        self.turn = 0
        self._jobs: EpisodeJobs | None = None        # this episode's submissions and jobs
        self._hidden_seeds = ""                       # which hidden-eval seeds score this episode (at reset)

    def _default_probe(self) -> ValidationProbe:
        ps = self.settings.env.probe
        dynamic = None
        if ps.enabled:
            if importlib.util.find_spec("verifiers") is None:
                warnings.warn("verifiers is not installed: submit_job runs only the static probe stage. "
                              "Install the inner stack with: pip install 'ai-trains-ai[inner]'", stacklevel=3)
            else:
                dynamic = DynamicProbe(ps, token_counter=self.backend.token_counter())
        return ValidationProbe(quota=self.settings.env.workspace, dynamic=dynamic)

    # ------------------------------------------------------------------ gym API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        options = dict(options or {})
        self._cleanup()
        name = options.get("family") or self.settings.family.name
        if name == "train":
            train, _ = split_families(FAMILY_NAMES)
            name = train[int(self.np_random.integers(len(train)))]
        self._family = get_family(name)
        instance = options.get("instance")
        instance_seed = int(instance) if instance is not None else int(self.np_random.integers(0, 2**31 - 1))
        self._spec = self._family.make_task(instance_seed, self._bounds())
        extra = {TOOLS_MODULE_NAME + ".py": self._family.tools_source(),
                 TASK_DATA_MODULE_NAME + ".py": self._family.task_data_source(self._spec)}
        self._ws = Workspace.from_template(self._family.template_dir, quota=self.settings.env.workspace,
                                           read_only=extra)
        self._ws.root.joinpath("INSTRUCTIONS.md").write_text(self._family.instructions_text(), encoding="utf-8")
        self.probe.warm()  # start the validation sandbox while the agent works
        from ait_env.hidden.secrets import hidden_seeds_label

        self._hidden_seeds = hidden_seeds_label()   # private per installation unless chosen (first use creates them)
        self.episode_id = options.get("episode_id") or uuid.uuid4().hex[:12]
        self.turn = 0
        self._jobs = EpisodeJobs(self.settings, self.backend, self.ledger, self.probe, self.runs_dir, self.episode_id,
                                 self._ws, self._spec, self._family)
        self._toolbox = ToolBox(self._ws, self._baseline_text, self._jobs.submit,
                                finish=self._jobs.finish if self.research else None,
                                submit_many=self._jobs.submit_many if self.research else None)
        es = self.settings.env
        terms = ResearchTerms.from_settings(self.settings)
        sys_text = system_prompt(es.max_turns, es.max_attempts, terms)
        user_text = task_message(self._spec, self.backend.catalog(), self.backend.name, self.backend.surrogate)
        self._messages = [{"role": "system", "content": sys_text}, {"role": "user", "content": user_text}]
        return self._clip(sys_text + "\n\n" + user_text), self._info()

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._jobs is None or self._jobs.done or self._ws is None:
            obs = "The episode is over; call reset() to start a new one."
            return obs, 0.0, True, False, self._info()
        self.turn += 1
        text = action if isinstance(action, str) else repr(action)
        if len(text) > self.settings.env.max_action_chars:
            parsed = parse_action("")
            parsed.errors[0].message = (f"your message has {len(text)} characters; the limit is "
                                        f"{self.settings.env.max_action_chars}. Write large files in parts.")
        else:
            parsed = parse_action(text)
        calls = [ToolCall(c.name, c.arguments, id=f"call_{self.turn}_{i}") for i, c in enumerate(parsed.calls)]
        self._messages.append(self._assistant_message(text, parsed.text, calls))
        observations: list[str] = []
        if not calls:
            msg = ("error: " + " ".join(e.message for e in parsed.errors)
                   + f"\nCall a tool like this:\n{CALL_FORMAT}")
            self._messages.append({"role": "user", "content": msg})
            observations.append(msg)
        else:
            ended_at = ""
            for call in calls:
                if ended_at:
                    outcome = ToolOutcome(call.name, False, f"skipped: the episode ended at {ended_at}")
                else:
                    outcome = self._run_tool(call)
                    ended_at = call.name if outcome.ends_episode else ""
                content = self._clip(outcome.text)
                self._messages.append({"role": "tool", "tool_call_id": call.id, "name": call.name,
                                       "content": content})
                observations.append(f"<tool_response>\n{content}\n</tool_response>")
            if parsed.errors:
                note = "note: some of your tool calls could not be parsed: " + " ".join(
                    e.message for e in parsed.errors)
                self._messages.append({"role": "user", "content": note})
                observations.append(note)
        jobs = self._jobs
        terminated = jobs.done
        truncated = False
        if not terminated and self.turn >= self.settings.env.max_turns:
            truncated = True
            ran, limit = jobs.jobs_ran, self.settings.env.max_turns
            jobs.end("turn_limit", reason=f"turn limit ({limit}) reached")
            observations.append(f"The turn limit ({limit}) was reached; the episode ends."
                                + (f" {jobs.closing()}" if ran else ""))
        reward = jobs.breakdown.gym_reward if (terminated or truncated) and jobs.breakdown else 0.0
        return self._clip("\n".join(observations)), float(reward), terminated, truncated, self._info()

    def end_episode(self, reason: str) -> dict[str, Any]:
        """End the episode now, for an outer loop that cannot go on with it (a turn its parser could not
        read, a context overflow): scored on the jobs that ran, as at the turn limit (``end`` ``aborted``);
        without a job, ``invalid`` or ``unparsable``. Returns the final ``info``; an episode already over
        is left as it is. Never raises."""
        jobs = self._jobs
        if jobs is not None and not jobs.done:
            jobs.end("aborted", reason=reason)
            note = f"The episode was ended by the outer loop: {reason}." + (f" {jobs.closing()}"
                                                                            if jobs.jobs_ran else "")
            self._messages.append({"role": "user", "content": note})
        return self._info()

    def _run_tool(self, call: ToolCall) -> ToolOutcome:
        """One tool call; an unexpected exception (our bug, a full disk) becomes the call's error text."""
        try:
            return self._toolbox.run(call)
        except Exception as exc:  # noqa: BLE001 - the contract: step never raises
            _log.exception("tool %s failed inside the env (episode %s)", call.name, self.episode_id)
            return ToolOutcome(call.name, False, for_agent(f"error: {call.name} failed on our side "
                                                           f"({type(exc).__name__}: {exc}); try again."))

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        parts = []
        for m in self._messages:
            head = m["role"] + (f" ({m['name']})" if m.get("name") else "")
            body = m.get("content") or ""
            if m.get("tool_calls"):
                body += "".join(f"\n<tool_call>{json.dumps({'name': c['function']['name'], 'arguments': json.loads(c['function']['arguments'])})}</tool_call>"
                                for c in m["tool_calls"])
            parts.append(f"=== {head} ===\n{body}")
        if self._jobs is not None and self._jobs.breakdown is not None:
            parts.append("=== reward ===\n" + self._jobs.breakdown.model_dump_json(indent=1))
        return "\n".join(parts) + "\n"

    def close(self) -> None:
        """Remove the workspace; close the backend if this env built it (never a backend it was given)."""
        self._cleanup()
        if self._owns_backend and not self.backend.closed:
            self.backend.close()
        super().close()

    # ------------------------------------------------------------------ helpers
    @property
    def workspace(self) -> Workspace | None:
        return self._ws

    @property
    def task(self) -> TaskSpec | None:
        return self._spec

    def _cleanup(self) -> None:
        if self._ws is not None:
            self._ws.destroy()
            self._ws = None

    def _clip(self, text: str) -> str:
        limit = self.settings.env.max_observation_chars
        if len(text) <= limit:
            return text
        marker = f"\n... [truncated {len(text) - limit + 200} characters]"
        return text[: limit - 200] + marker

    def _bounds(self) -> Bounds:
        b = self.settings.backend.bounds
        return Bounds(base_models=[m.name for m in self.backend.catalog()], max_steps=b.max_steps,
                      max_batch_size=b.batch_size, max_group_size=b.group_size, max_seq_len=b.seq_len,
                      max_tokens=b.max_tokens, wall_clock_minutes=b.wall_clock_minutes,
                      model_renderers=self.backend.model_renderers())

    @staticmethod
    def _assistant_message(raw: str, prose: str, calls: list[ToolCall]) -> dict[str, Any]:
        if not calls:
            return {"role": "assistant", "content": raw}
        return {"role": "assistant", "content": prose, "tool_calls": [
            {"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
            for c in calls]}

    def _info(self) -> dict[str, Any]:
        jobs = self._jobs
        info: dict[str, Any] = {
            "messages": _copy(self._messages),
            "tools": _copy(self._tool_schemas),
            "family": self._spec.family if self._spec else None,
            "instance_id": self._spec.instance_id if self._spec else None,
            "episode_id": self.episode_id,
            "turn": self.turn,
            "max_turns": self.settings.env.max_turns,
            "attempts_left": jobs.attempts_left if jobs else self.settings.env.max_attempts,
            "backend": self.backend.name,
            "surrogate": self.backend.surrogate,
            "hidden_seeds": self._hidden_seeds,
            "base_models": [m.model_dump() for m in self.backend.catalog()
                            if self._spec is None or m.name in self._spec.bounds.base_models],
        }
        if self.research:
            info["jobs_left"] = jobs.jobs_left if jobs else self.settings.env.max_jobs_per_episode
            info["budget_left_usd"] = (jobs.budget_left() if jobs else self.ledger.episode_budget_usd)
        if jobs is not None and jobs.breakdown is not None:
            info["reward"] = jobs.breakdown.model_dump()
        if jobs is not None and jobs.result is not None:
            info["job"] = jobs.result.model_dump()
        if jobs is not None and jobs.results:
            info["jobs"] = [r.model_dump() for r in jobs.results]
        return info

    def _baseline_text(self) -> str:
        """``get_baseline_scores``: exactly the untrained scores the reward will use (the one baselines
        policy, :meth:`BaselineStore.for_job`); a model whose score does not hold for this machine's build
        or the current hidden set is said to be measured by the job, not shown with a stale figure."""
        assert self._spec is not None
        models = self._spec.bounds.base_models
        holding, missing = self.backend.baselines.for_job(self.backend.job_context(self._spec.family, models))
        fam = self._spec.family
        why = {m: (f"not seeded; `{seed_command(self.backend.name, fam)}` measures it ahead of time"
                   if r == "not seeded" else r) for m, r in missing.items()}
        lines = [f"{m}: {holding[m]:.3f}" if m in holding else
                 f"{m}: not measured for this machine's build yet ({why[m]}): your job measures it before "
                 "training, and the reward uses that measurement" for m in models]
        head = "Hidden-eval scores of the untrained base models (fraction correct):\n" + "\n".join(lines)
        if not holding:
            return head + "\nYour reward compares the trained model with the best of these, once measured."
        best = max(holding.values())
        if missing:
            return head + (f"\nYour reward compares the trained model with the best of these: {best:.3f} so far, "
                           "higher if a model your job measures scores more.")
        return head + f"\nYour reward compares the trained model with the best of these ({best:.3f})."
