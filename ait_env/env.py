"""``JobWritingEnv``: one episode = one agent writing and submitting one RL training job.

The env only orchestrates: actions are parsed by :mod:`ait_env.toolcalls`, tools run through
:class:`ait_env.tools.ToolBox` on a :class:`ait_env.workspace.Workspace`, submissions go through the
:class:`ait_env.probe.ValidationProbe`, valid jobs are bundled (:mod:`ait_env.jobs.bundle`) and run by
a backend, and :mod:`ait_env.reward` turns the result into the reward.

Observations and actions are strings. ``info`` always carries the whole conversation as
OpenAI-style ``messages``, the agent ``tools`` as JSON schemas, ``family``, ``instance_id``,
``turn``, ``attempts_left`` and ``episode_id``; at the end also ``reward`` (the full breakdown)
and ``job`` (the backend's result).
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

from ait_env.toolcalls import CALL_FORMAT, ToolCall, parse_action
from ait_env.backends import Backend, JobResult, make_backend
from ait_env.baselines import BaselinesNotSeeded
from ait_env.config import Settings, compose, split_families
from ait_env.jobs.bundle import build_bundle
from ait_env.ledger import BudgetExceeded, CostLedger, CostRecord
from ait_env.probe import ValidationProbe
from ait_env.probe.dynamic import DynamicProbe
from ait_env.sandbox import SandboxError
from ait_env.redact import for_agent
from ait_env.reward import RewardBreakdown, compose as compose_reward
from ait_env.spaces import UnicodeText
from ait_env.spec import system_prompt, task_message
from ait_env.tools import ToolBox, ToolOutcome, tool_schemas
from ait_env.workspace import Workspace
from task_families import FAMILY_NAMES, get_family
from task_families.base import TOOLS_MODULE_NAME, Bounds, TaskFamily, TaskSpec


_TOOL_SCHEMAS = tool_schemas()
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
        self.runs_dir = Path(es.runs_dir)
        self._owns_backend = given is None
        self.backend: Backend = given if given is not None else make_backend(self.settings.backend, self.runs_dir)
        self.ledger = CostLedger.from_settings(es.ledger, self.runs_dir)
        self.probe = probe or self._default_probe()
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
        self._toolbox = ToolBox(self._ws, self._baseline_text, self._submit)
        self.probe.warm()  # start the validation sandbox while the agent works
        self.episode_id = options.get("episode_id") or uuid.uuid4().hex[:12]
        self.turn = 0
        self.attempts = 0
        self._validated_attempt = None
        self._any_parsable = False
        self._breakdown = None
        self._result = None
        self._done = False
        sys_text = system_prompt(self.settings.env.max_turns, self.settings.env.max_attempts)
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
            ended = False
            for call in calls:
                if ended:
                    outcome = ToolOutcome(call.name, False, "skipped: the episode ended at submit_job")
                else:
                    outcome = self._run_tool(call)
                    ended = outcome.ends_episode
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
            self._finish(self._no_job_status(), reason=f"turn limit ({self.settings.env.max_turns}) reached")
            observations.append(f"The turn limit ({self.settings.env.max_turns}) was reached; the episode ends.")
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
            "tools": _copy(_TOOL_SCHEMAS),
            "family": self._spec.family if self._spec else None,
            "instance_id": self._spec.instance_id if self._spec else None,
            "episode_id": self.episode_id,
            "turn": self.turn,
            "max_turns": self.settings.env.max_turns,
            "attempts_left": self.settings.env.max_attempts - self.attempts,
            "backend": self.backend.name,
            "surrogate": self.backend.surrogate,
            "base_models": [m.model_dump() for m in self.backend.catalog()
                            if self._spec is None or m.name in self._spec.bounds.base_models],
        }
        if self._breakdown is not None:
            info["reward"] = self._breakdown.model_dump()
        if self._result is not None:
            info["job"] = self._result.model_dump()
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

    def _no_job_status(self) -> str:
        return "invalid" if self._any_parsable else "unparsable"

    def _finish(self, status: str, reason: str = "", **kw: Any) -> None:
        self._breakdown = compose_reward(status, self.settings.reward, attempts=self.attempts,  # type: ignore[arg-type]
                                         validated_attempt=self._validated_attempt, reason=reason, **kw)
        self._done = True

    # ------------------------------------------------------------------ submit_job
    def _submit(self) -> ToolOutcome:
        """``submit_job``: validate, dispatch, score. Never raises, whatever the submission holds: an
        unexpected exception is our bug, so the episode ends ``infra_failed`` (unscored, never blamed on
        the agent) and the traceback goes to the ``ait_env`` log. What the agent reads has every host
        path redacted (:func:`ait_env.redact.for_agent`)."""
        try:
            outcome = self._submit_checked()
        except Exception as exc:  # noqa: BLE001 - the contract: step never raises
            _log.exception("submit_job failed inside the env (episode %s)", self.episode_id)
            self._finish("infra_failed", reason=f"internal error in submit_job: {type(exc).__name__}: {exc}")
            outcome = ToolOutcome("submit_job", False, "Your submission could not be processed because of an "
                                  f"internal error on our side ({type(exc).__name__}: {exc}); this is not counted "
                                  "against you. The episode ends unscored.", ends_episode=True)
        outcome.text = for_agent(outcome.text)
        return outcome

    def _submit_checked(self) -> ToolOutcome:
        assert self._ws is not None and self._spec is not None and self._family is not None
        max_attempts = self.settings.env.max_attempts
        self.attempts += 1
        try:
            report, job = self.probe.run(self._ws.root, self._spec, self._family)
        except SandboxError as exc:
            self._finish("infra_failed", reason=f"validation sandbox failed: {exc}")
            return ToolOutcome("submit_job", False, f"The validation sandbox failed ({exc}); this is our fault, "
                               "not yours. The episode ends unscored.", ends_episode=True)
        self._any_parsable = self._any_parsable or report.parsable
        if job is None:
            left = max_attempts - self.attempts
            text = report.render()
            if left > 0:
                return ToolOutcome("submit_job", False, f"{text}\n\nFix these and call submit_job again "
                                   f"({left} attempt{'s' if left != 1 else ''} left).")
            self._finish(self._no_job_status(), reason="no valid submission within the attempt limit")
            return ToolOutcome("submit_job", False, f"{text}\n\nNo attempts left; the episode ends.",
                               ends_episode=True)
        self._validated_attempt = self.attempts
        return self._dispatch(job)

    def _dispatch(self, job: Any) -> ToolOutcome:
        assert self._ws is not None and self._family is not None and self._spec is not None
        try:
            bundle = build_bundle(self._ws.root, job, self._family, self.runs_dir / "jobs",
                                  episode_id=self.episode_id,
                                  renderer=self._spec.bounds.model_renderers.get(job.job.base_model))
            estimate = self.backend.estimate_cost_usd(bundle)
            self.ledger.check_budget(self.episode_id, estimate)
        except BudgetExceeded as exc:
            self._finish("infra_failed", reason=f"dispatch refused: {exc}")
            return ToolOutcome("submit_job", False, f"Your job is valid, but it could not be dispatched: {exc}. "
                               "This is not counted against you; the episode ends.", ends_episode=True)
        t0 = time.time()
        try:
            result = self.backend.run(bundle)
        except Exception as exc:  # noqa: BLE001 - any backend crash is an infrastructure failure
            result = JobResult(job_id=bundle.job_id, backend=self.backend.name, status="infra_failed",
                               error=f"{type(exc).__name__}: {exc}", wall_seconds=time.time() - t0)
        self._result = result
        self.ledger.append(CostRecord(kind="gpu_job", episode_id=self.episode_id, seconds=result.wall_seconds,
                                      usd=result.cost_usd, meta={"job_id": result.job_id, "backend": result.backend,
                                                                 "status": result.status}))
        if not (bundle.root / "result.json").exists():  # written by the runner for the jobs it ran
            result.save(bundle.root / "result.json")
        if result.status == "infra_failed":
            self._finish("infra_failed", reason=result.error or "infrastructure failure")
            return ToolOutcome("submit_job", True, "Your job was valid but the infrastructure failed "
                               f"({result.error}); this episode is not scored.", ends_episode=True)
        if result.status == "job_failed":
            self._finish("job_failed", reason=result.error, best_pre=self._best_pre(result))
            return ToolOutcome("submit_job", True, f"Your job was valid but failed while running: {result.error}\n"
                               f"{result.log_tail[-1500:]}", ends_episode=True)
        try:
            best_pre = self._best_pre(result)
        except BaselinesNotSeeded as exc:
            self._finish("infra_failed", reason=str(exc))
            return ToolOutcome("submit_job", True, f"Your job ran but could not be scored ({exc}); this episode "
                               "is not scored.", ends_episode=True)
        self._finish("scored", post=result.post_score, best_pre=best_pre, train_seconds=result.train_seconds,
                     wall_clock_limit_s=self._spec.bounds.wall_clock_minutes * 60)
        b = self._breakdown
        assert b is not None and b.total is not None
        label = " [SURROGATE score: stub backend, nothing was trained]" if result.surrogate else ""
        return ToolOutcome("submit_job", True,
                           f"Job {result.job_id} finished{label}: hidden-eval score {result.post_score:.3f} "
                           f"(best untrained base {best_pre:.3f}, uplift {b.uplift:+.3f}). Reward {b.total:.3f}.",
                           ends_episode=True)

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
