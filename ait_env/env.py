"""``JobWritingEnv``: one episode = one agent writing and submitting one RL training job (or, in a
research episode, up to ``env.max_jobs_per_episode`` jobs, each result shown to the agent).

The env only orchestrates: actions are parsed by :mod:`ait_env.jobs.toolcalls`, tools run through
:class:`ait_env.episode.tools.ToolBox` on a :class:`ait_env.sandbox.workspace.Workspace`, submissions go through the
:class:`ait_env.probe.ValidationProbe`, valid jobs are bundled (:mod:`ait_env.jobs.bundle`) and run by
a backend, and :mod:`ait_env.episode.reward` turns the result into the reward.

Observations and actions are strings. ``info`` always carries the whole conversation as
OpenAI-style ``messages``, the agent ``tools`` as JSON schemas, ``family``, ``instance_id``,
``turn``, ``attempts_left`` and ``episode_id``; at the end also ``reward`` (the full breakdown)
and ``job`` (the backend's result of the job the reward counts); ``jobs`` lists every job's result.

Research episodes (``env.max_jobs_per_episode > 1``): after each job the agent reads its result (pre and
post scores, the eval-point curve, wall time, cost, the log tail of a failed job) and how many jobs and how
much of the episode's USD budget (``env.ledger.episode_budget_usd``, the ledger's one per-episode budget)
remain, and may revise the workspace and submit again, or call ``finish``. The episode ends after the last
allowed job, when what is left of the budget cannot pay for another job like the last one (or the ledger
refuses the next dispatch), at ``finish``, at the turn limit, or when a job's submit_job attempts run out;
it is then scored on the jobs that ran (:func:`ait_env.episode.reward.combine`). An infrastructure failure in any
job drops the episode (``infra_failed``). ``info`` then also has ``jobs_left`` and ``budget_left_usd``.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import time
import warnings
import uuid
from pathlib import Path
from typing import Any

import gymnasium as gym

from ait_env.jobs.toolcalls import CALL_FORMAT, ToolCall, parse_action
from ait_env.backends import Backend, make_backend
from ait_env.jobs.result import JobResult
from ait_env.hidden.baselines import BaselinesNotSeeded
from ait_env.config import Settings, compose, split_families
from ait_env.jobs.bundle import build_bundle
from ait_env.observe.ledger import BudgetExceeded, CostLedger, CostRecord
from ait_env.probe import ValidationProbe
from ait_env.probe.dynamic import DynamicProbe
from ait_env.sandbox import SandboxError
from ait_env.hidden.redact import for_agent
from ait_env.episode.reward import End, RewardBreakdown, Status, best_job, combine, compose as compose_reward
from ait_env.episode.spaces import UnicodeText
from ait_env.episode.spec import ResearchTerms, system_prompt, task_message
from ait_env.episode.tools import ToolBox, ToolOutcome, tool_schemas
from ait_env.sandbox.workspace import Workspace
from task_families import FAMILY_NAMES, get_family
from task_families.base import TOOLS_MODULE_NAME, Bounds, TaskFamily, TaskSpec


_log = logging.getLogger("ait_env")
_CURVE_POINTS = 12  # eval points a research episode's job report shows at most


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
        self.runs_dir = Path(es.runs_dir)
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
        self._done = True
        self._spec: TaskSpec | None = None
        self._family: TaskFamily | None = None
        self.episode_id = ""
        self.turn = 0
        self.attempts = 0
        self._validated_attempt: int | None = None
        self._any_parsable = False
        self._breakdown: RewardBreakdown | None = None
        self._result: JobResult | None = None
        self._job_attempts = 0                       # submit_job calls since the last job ran
        self._job_scores: list[RewardBreakdown] = []  # each job that ran, scored as the episode's only job
        self._results: list[JobResult] = []

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
        extra = {TOOLS_MODULE_NAME + ".py": self._family.tools_source()}
        self._ws = Workspace.from_template(self._family.template_dir, quota=self.settings.env.workspace,
                                           read_only=extra)
        self._ws.root.joinpath("INSTRUCTIONS.md").write_text(self._family.instructions_text(), encoding="utf-8")
        self._toolbox = ToolBox(self._ws, self._baseline_text, self._submit,
                                finish=self._finish_tool if self.research else None)
        self.probe.warm()  # start the validation sandbox while the agent works
        self.episode_id = options.get("episode_id") or uuid.uuid4().hex[:12]
        self.turn = 0
        self.attempts = 0
        self._validated_attempt = None
        self._any_parsable = False
        self._breakdown = None
        self._result = None
        self._job_attempts = 0
        self._job_scores = []
        self._results = []
        self._done = False
        es, charge = self.settings.env, self.settings.reward.research
        terms = ResearchTerms(es.max_jobs_per_episode, es.ledger.episode_budget_usd, charge.per_extra_job,
                              charge.per_usd) if self.research else None
        sys_text = system_prompt(es.max_turns, es.max_attempts, terms)
        user_text = task_message(self._spec, self.backend.catalog(), self.backend.name, self.backend.surrogate)
        self._messages = [{"role": "system", "content": sys_text}, {"role": "user", "content": user_text}]
        return self._clip(sys_text + "\n\n" + user_text), self._info()

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._done or self._ws is None:
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
        terminated = self._done
        truncated = False
        if not terminated and self.turn >= self.settings.env.max_turns:
            truncated = True
            ran, limit = len(self._job_scores), self.settings.env.max_turns
            self._end("turn_limit", reason=f"turn limit ({limit}) reached")
            observations.append(f"The turn limit ({limit}) was reached; the episode ends."
                                + (f" {self._closing()}" if ran else ""))
        reward = self._breakdown.gym_reward if (terminated or truncated) and self._breakdown else 0.0
        return self._clip("\n".join(observations)), float(reward), terminated, truncated, self._info()

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
        if self._breakdown is not None:
            parts.append("=== reward ===\n" + self._breakdown.model_dump_json(indent=1))
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
        info: dict[str, Any] = {
            "messages": _copy(self._messages),
            "tools": _copy(self._tool_schemas),
            "family": self._spec.family if self._spec else None,
            "instance_id": self._spec.instance_id if self._spec else None,
            "episode_id": self.episode_id,
            "turn": self.turn,
            "max_turns": self.settings.env.max_turns,
            "attempts_left": self.settings.env.max_attempts - self._job_attempts,
            "backend": self.backend.name,
            "surrogate": self.backend.surrogate,
            "base_models": [m.model_dump() for m in self.backend.catalog()
                            if self._spec is None or m.name in self._spec.bounds.base_models],
        }
        if self.research:
            info["jobs_left"] = self.settings.env.max_jobs_per_episode - len(self._results)
            info["budget_left_usd"] = self._budget_left()
        if self._breakdown is not None:
            info["reward"] = self._breakdown.model_dump()
        if self._result is not None:
            info["job"] = self._result.model_dump()
        if self._results:
            info["jobs"] = [r.model_dump() for r in self._results]
        return info

    def _baseline_text(self) -> str:
        assert self._spec is not None
        store = self.backend.baselines
        try:
            pins = [store.lookup(self._spec.family, m, self.backend.built_weights_hash(m))
                    for m in self._spec.bounds.base_models]
        except BaselinesNotSeeded as exc:
            return f"error: {exc}"
        entries = [e for e, _ in pins]
        lines = [f"{e.model}: {e.score:.3f}" + (" (measured on other weights than this machine built, or on "
                                                 "another hidden set: the job measures this model's base "
                                                 "itself, and the reward uses that)" if stale else "")
                 for e, stale in pins]
        return ("Hidden-eval scores of the untrained base models (fraction correct):\n" + "\n".join(lines)
                + f"\nYour reward compares the trained model with the best of these "
                f"({max(e.score for e in entries):.3f}).")

    def _no_job_status(self) -> Status:
        return "invalid" if self._any_parsable else "unparsable"

    def _end(self, end: End, reason: str = "") -> None:
        """End the episode, scored on the jobs that ran (the best, less the research charge); without one,
        ``invalid`` or ``unparsable``."""
        if self._job_scores:
            self._breakdown = combine(self._job_scores, self.settings.reward, attempts=self.attempts, end=end,
                                      reason=reason)
            best = self._breakdown.best_job
            self._result = self._results[best if best is not None else -1]
        else:
            b = compose_reward(self._no_job_status(), self.settings.reward, attempts=self.attempts,
                               reason=reason)
            self._breakdown = b.model_copy(update={"end": end})
        self._done = True

    def _drop(self, reason: str) -> None:
        """End the episode ``infra_failed`` outside a job's run (sandbox, our bug, a budget refusal of the
        first job): unscored, never blamed on the agent."""
        b = compose_reward("infra_failed", self.settings.reward, attempts=self.attempts,
                           validated_attempt=self._validated_attempt, reason=reason)
        self._breakdown = b.model_copy(update={"jobs": list(self._job_scores), "end": "infra_failed"})
        self._done = True

    def _add_job(self, result: JobResult, status: Status, **kw: Any) -> RewardBreakdown:
        """Score the job that just ran as if it were the episode's only job; the next job's attempts start
        from zero. Between jobs, ``info["job"]`` is the best job so far."""
        score = compose_reward(status, self.settings.reward, attempts=self._job_attempts,
                               validated_attempt=self._validated_attempt, **kw)
        score = score.model_copy(update={"job_id": result.job_id, "cost_usd": result.cost_usd})
        self._job_scores.append(score)
        self._job_attempts = 0
        self._validated_attempt = None
        if status != "infra_failed":
            self._result = self._results[best_job(self._job_scores)]
        return score

    def _budget_left(self) -> float | None:
        """What is left of the episode's USD budget (``env.ledger.episode_budget_usd``); None: no budget."""
        budget = self.ledger.episode_budget_usd
        return None if budget is None else budget - self.ledger.spent(self.episode_id)

    def _closing(self) -> str:
        """How the episode's reward was made up, for the agent's last observation."""
        b = self._breakdown
        assert b is not None and b.total is not None and b.best_job is not None
        n, best = len(b.jobs), b.jobs[b.best_job]
        if not b.charge:
            return f"Reward {b.total:.3f}" + (f": job {b.best_job + 1} of {n}, the best." if n > 1 else ".")
        return (f"Reward {b.total:.3f}: job {b.best_job + 1}'s {best.gym_reward:.3f} less a charge of "
                f"{b.charge:.3f} for {n - 1} more job{'s' if n > 2 else ''}.")

    # ------------------------------------------------------------------ submit_job
    def _submit(self) -> ToolOutcome:
        """``submit_job``: validate, dispatch, score. Never raises, whatever the submission holds: an
        unexpected exception is our bug, so the episode ends ``infra_failed`` (unscored, never blamed on
        the agent) and the traceback goes to the ``ait_env`` log. What the agent reads has every host
        path redacted (:func:`ait_env.hidden.redact.for_agent`)."""
        try:
            outcome = self._submit_checked()
        except Exception as exc:  # noqa: BLE001 - the contract: step never raises
            _log.exception("submit_job failed inside the env (episode %s)", self.episode_id)
            self._drop(f"internal error in submit_job: {type(exc).__name__}: {exc}")
            outcome = ToolOutcome("submit_job", False, "Your submission could not be processed because of an "
                                  f"internal error on our side ({type(exc).__name__}: {exc}); this is not counted "
                                  "against you. The episode ends unscored.", ends_episode=True)
        outcome.text = for_agent(outcome.text)
        return outcome

    def _submit_checked(self) -> ToolOutcome:
        assert self._ws is not None and self._spec is not None and self._family is not None
        max_attempts = self.settings.env.max_attempts
        self.attempts += 1
        self._job_attempts += 1
        try:
            report, job = self.probe.run(self._ws.root, self._spec, self._family)
        except SandboxError as exc:
            self._drop(f"validation sandbox failed: {exc}")
            return ToolOutcome("submit_job", False, f"The validation sandbox failed ({exc}); this is our fault, "
                               "not yours. The episode ends unscored.", ends_episode=True)
        self._any_parsable = self._any_parsable or report.parsable
        ours = [f for f in report.failures if f.code == "backend_config"]
        if ours:   # the backend cannot run what it offers: our configuration, never the agent's fault
            self._drop(f"backend configuration: {ours[0].message}")
            return ToolOutcome("submit_job", False, f"Your job could not be run because of our configuration "
                               f"({ours[0].message}); this is not counted against you. The episode ends "
                               "unscored.", ends_episode=True)
        if job is None:
            left = max_attempts - self._job_attempts
            text = report.render()
            if left > 0:
                return ToolOutcome("submit_job", False, f"{text}\n\nFix these and call submit_job again "
                                   f"({left} attempt{'s' if left != 1 else ''} left).")
            ran = len(self._job_scores)
            self._end("attempts", reason="no valid submission within the attempt limit")
            return ToolOutcome("submit_job", False, f"{text}\n\nNo attempts left; the episode ends."
                               + (f" It counts your best job. {self._closing()}" if ran else ""),
                               ends_episode=True)
        self._validated_attempt = self._job_attempts
        return self._dispatch(job)

    def _dispatch(self, job: Any) -> ToolOutcome:
        assert self._ws is not None and self._family is not None and self._spec is not None
        try:
            bundle = build_bundle(self._ws.root, job, self._family, self.runs_dir / "jobs",
                                  episode_id=self.episode_id,
                                  renderer=self._spec.bounds.model_renderers.get(job.job.base_model))
            # the job's bound is held against the budgets until its charge replaces it (ait_env/observe/ledger.py)
            estimate = self.backend.estimate_cost_usd(bundle)
            hold = self.ledger.reserve(self.episode_id, estimate, what=bundle.job_id)
        except BudgetExceeded as exc:
            if self._job_scores:  # a research episode whose budget cannot pay for one more job
                self._end("budget", reason=f"dispatch refused: {exc}")
                return ToolOutcome("submit_job", False, f"Your job is valid, but the episode's budget cannot "
                                   f"pay for it: {exc}. It is not run and not charged; the episode ends with "
                                   f"your best job. {self._closing()}", ends_episode=True)
            self._drop(f"dispatch refused: {exc}")
            return ToolOutcome("submit_job", False, f"Your job is valid, but it could not be dispatched: {exc}. "
                               "This is not counted against you; the episode ends.", ends_episode=True)
        t0 = time.time()
        try:
            result = self.backend.run(bundle)
        except Exception as exc:  # noqa: BLE001 - any backend crash is an infrastructure failure
            result = JobResult(job_id=bundle.job_id, backend=self.backend.name, status="infra_failed",
                               error=f"{type(exc).__name__}: {exc}", wall_seconds=time.time() - t0)
        self._results.append(result)
        self._result = result
        self.ledger.settle(hold, CostRecord(kind="gpu_job", episode_id=self.episode_id, seconds=result.wall_seconds,
                                            usd=result.cost_usd, meta={"job_id": result.job_id,
                                                                       "backend": result.backend,
                                                                       "status": result.status}))
        try:   # the run's own costs (idle, always-on workers) catch up: the global budget sees them
            self.backend.charge_run_costs(self.ledger)
        except Exception:  # noqa: BLE001 - accounting must not end the episode; the journal keeps the figures
            _log.exception("charging the backend's run costs to %s failed", self.ledger.path)
        if not (bundle.root / "result.json").exists():  # written by the runner for the jobs it ran
            result.save(bundle.root / "result.json")
        if result.status == "infra_failed":
            self._add_job(result, "infra_failed", reason=result.error or "infrastructure failure")
            self._end("infra_failed")
            return ToolOutcome("submit_job", True, "Your job was valid but the infrastructure failed "
                               f"({result.error}); this episode is not scored.", ends_episode=True)
        if result.status == "job_failed":
            score = self._add_job(result, "job_failed", reason=result.error,
                                  best_pre=self._best_pre_if_known(result), fault=result.fault)
            if self.research:
                return self._after_job(result, score, bundle)
            self._end("job_limit")
            return ToolOutcome("submit_job", True, f"Your job was valid but failed while running: {result.error}\n"
                               f"{result.log_tail[-1500:]}", ends_episode=True)
        try:
            best_pre = self._best_pre(result)
        except BaselinesNotSeeded as exc:
            self._add_job(result, "infra_failed", reason=str(exc))
            self._end("infra_failed")
            return ToolOutcome("submit_job", True, f"Your job ran but could not be scored ({exc}); this episode "
                               "is not scored.", ends_episode=True)
        score = self._add_job(result, "scored", post=result.post_score, best_pre=best_pre,
                              train_seconds=result.train_seconds,
                              wall_clock_limit_s=self._spec.bounds.wall_clock_minutes * 60)
        if self.research:
            return self._after_job(result, score, bundle)
        self._end("job_limit")
        b = self._breakdown
        assert b is not None and b.total is not None
        label = " [SURROGATE score: stub backend, nothing was trained]" if result.surrogate else ""
        return ToolOutcome("submit_job", True,
                           f"Job {result.job_id} finished{label}: hidden-eval score {result.post_score:.3f} "
                           f"(best untrained base {best_pre:.3f}, uplift {b.uplift:+.3f}). Reward {b.total:.3f}.",
                           ends_episode=True)

    def _finish_tool(self) -> ToolOutcome:
        """``finish`` (research episodes only): end now, scored on the jobs that ran."""
        ran = len(self._job_scores)
        self._end("finish", reason="the agent called finish")
        b = self._breakdown
        assert b is not None
        if not ran:
            return ToolOutcome("finish", True, f"Episode finished without a job ({b.status}): reward "
                               f"{b.gym_reward:.3f}.", ends_episode=True)
        return ToolOutcome("finish", True, f"Episode finished after {ran} job{'s' if ran != 1 else ''}. "
                           f"{self._closing()}", ends_episode=True)

    def _after_job(self, result: JobResult, score: RewardBreakdown, bundle: Any) -> ToolOutcome:
        """A research episode's answer to a job that ran: its result, then either the end (the job limit, or
        a budget that cannot pay for another job like this one) or what is left and how to go on."""
        es, charge = self.settings.env, self.settings.reward.research
        text = self._job_report(result, score, bundle.job.job.base_model)
        n, limit = len(self._job_scores), es.max_jobs_per_episode
        if n >= limit:
            self._end("job_limit")
            return ToolOutcome("submit_job", True, f"{text}\n\nThat was the last of your {limit} jobs; the "
                               f"episode ends. {self._closing()}", ends_episode=True)
        left, estimate = self._budget_left(), self.backend.estimate_cost_usd(bundle)
        if left is not None and left < estimate:
            self._end("budget")
            return ToolOutcome("submit_job", True, f"{text}\n\nThe episode's budget cannot pay for another "
                               f"job like this one (${left:.2f} left, ${estimate:.2f} a job); the episode "
                               f"ends. {self._closing()}", ends_episode=True)
        best = best_job(self._job_scores)
        budget = ("no USD budget" if left is None
                  else f"${left:.2f} of ${self.ledger.episode_budget_usd:.2f} left")
        usd = f" plus {charge.per_usd:g} per USD it costs" if charge.per_usd else ""
        return ToolOutcome("submit_job", True,
                           f"{text}\n\nBest so far: job {best + 1} (reward "
                           f"{self._job_scores[best].gym_reward:.3f} on its own). Jobs left: {limit - n} "
                           f"of {limit}; budget: {budget}. Revise the workspace and call submit_job to run "
                           f"another job (charged {charge.per_extra_job:g} in reward{usd}), or call finish "
                           "to end the episode with your best job.")

    def _job_report(self, result: JobResult, score: RewardBreakdown, model: str) -> str:
        """What a research episode's agent reads about a job that ran."""
        k, limit = len(self._job_scores), self.settings.env.max_jobs_per_episode
        label = " [SURROGATE score: stub backend, nothing was trained]" if result.surrogate else ""
        if score.status == "job_failed":
            lines = [f"Job {k} of {limit} ({result.job_id}) was valid but failed while running: "
                     f"{result.error}", result.log_tail[-1500:]]
        else:
            assert result.post_score is not None and score.best_pre is not None and score.uplift is not None
            ci = f" ± {result.post_ci95:.3f}" if result.post_ci95 is not None else ""
            pre = result.baselines.get(model)
            mine = f"{model} before training {pre:.3f}; " if pre is not None else ""
            lines = [f"Job {k} of {limit} ({result.job_id}) finished{label}: hidden-eval score "
                     f"{result.post_score:.3f}{ci} ({mine}best untrained base {score.best_pre:.3f}; uplift "
                     f"{score.uplift:+.3f})."]
        steps, scores = result.curves.get("eval_step") or [], result.curves.get("eval_score") or []
        if steps and len(steps) == len(scores):
            shown = list(range(len(steps)))
            if len(steps) > _CURVE_POINTS:  # evenly thinned, first and last kept
                last = len(steps) - 1
                shown = sorted({round(i * last / (_CURVE_POINTS - 1)) for i in range(_CURVE_POINTS)})
            lines.append("Eval points during training (step: score): "
                         + ", ".join(f"{steps[i]:g}: {scores[i]:.3f}" for i in shown))
        lines.append(f"Wall time {result.wall_seconds:.1f} s (training {result.train_seconds:.1f} s); "
                     f"cost ${result.cost_usd:.2f}. This job's reward on its own: {score.gym_reward:.3f}.")
        return "\n".join(line for line in lines if line)

    def _best_pre_if_known(self, result: JobResult) -> float | None:
        """:meth:`_best_pre`, or None where no baseline is known (a failed job's reward does not use it: a job
        that dies before any base model was measured must still be charged to the agent)."""
        try:
            return self._best_pre(result)
        except BaselinesNotSeeded:
            return None

    def _best_pre(self, result: JobResult) -> float:
        """The best untrained score of the allowed models: what the job was compared with (its result's
        baselines), completed by the same baselines policy the runner applies."""
        assert self._spec is not None
        allowed = self._spec.bounds.base_models
        scores = {m: s for m, s in result.baselines.items() if m in allowed}
        rest = [m for m in allowed if m not in scores]
        if rest:
            holding, _ = self.backend.baselines.for_job(self._spec.family, rest,
                                                        {m: self.backend.built_weights_hash(m) for m in rest})
            scores.update(holding)
        if not scores:
            raise BaselinesNotSeeded(f"no baselines for family {self._spec.family!r} on backend "
                                     f"{self.backend.name!r}")
        return max(scores.values())
