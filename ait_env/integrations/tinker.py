"""``AIT/JobWriting-v0`` as a tinker-cookbook RL environment (pinned: tinker-cookbook 0.5.8, tinker 0.38).

Every cookbook-specific call of the project lives here, in :mod:`ait_env.integrations.tinker_datasets` (the
groups and datasets) and in the offline helpers (:mod:`ait_env.integrations.tinker_offline`). The shape:

- :class:`JobWritingMessageEnv` (a cookbook ``MessageEnv``): one gym episode. Its first
  observation is the episode's system prompt *without* the env's own tool section, with the
  episode's tools (``info["tools"]``: the six, plus ``finish`` in a research episode,
  ``env.max_jobs_per_episode > 1`` in ``env_overrides``) declared by the model's renderer
  (``create_conversation_prefix_with_tools``, so each model sees its native tool-call format), followed
  by the task message. Each assistant message (already parsed by the renderer) becomes the env's text
  action (:func:`message_to_action`); the env's new tool results come back as ``tool`` messages and its
  notes as ``user`` messages; the whole conversation is returned each step, as ``MessageEnv`` requires.
  In a research episode the job results come back as tool messages and the reward arrives when the
  episode ends (the last job, the budget, ``finish``, the turn limit); the metrics count the best job
  and the research charge. A turn the renderer cannot parse (or one over ``max_tokens``, a context
  overflow) ends the rollout with the cookbook's parse-error / overflow reward only when no job ran yet:
  once jobs ran, :class:`MeteredEnv` ends the gym episode scored on them
  (:meth:`ait_env.env.JobWritingEnv.end_episode`, ``end`` ``aborted``), as the gym env scores them at its
  turn limit. ``reset``/``step`` are blocking
  (``submit_job`` waits for the job: minutes) and run in a dedicated thread pool
  (``env_threads``), never on the event loop and never in asyncio's small default pool.
- :class:`MeteredEnv` (``EnvFromMessageEnv``): the token-level env the cookbook samples against. It
  appends one ``kind="llm"`` record per sampling call to the env's cost ledger (prompt, cached and
  sampled tokens, USD from dated config prices) *before* the env step, under the env's
  ``episode_id``, so the env's per-episode budget counts the agent's tokens too.
- :class:`~ait_env.integrations.tinker_datasets.JobWritingGroupBuilder`: G envs of the **same** (family, instance). ``compute_group_rewards``
  adds no reward (the env's reward arrives on the last step) but attaches the per-episode metrics of
  :mod:`ait_env.observe.metrics` and logs the group's train tokens.
- :class:`~ait_env.integrations.tinker_datasets.JobWritingDataset` over the training families only (``split_families``), and
  :class:`EvalDataset`: the held-out families (tag ``heldout``) plus a comparison arm of training
  families (tag ``train``), with fixed instances so evaluations at different checkpoints compare.
- One backend per run (:func:`run_backend`): every episode's env is given the run's backend instance
  (``gym.make(..., backend=<Backend>)``), never builds or closes one; :func:`close_run_backends` closes
  it when the run ends (``trainers/tinker_grpo.py``) or at exit. ``backend_factory`` builds a custom
  backend class once per run.
- ``infra_failed`` episodes: the message env raises :class:`InfraFailedEpisode`; the rollout strategy
  :func:`~ait_env.integrations.tinker_datasets.drop_infra_strategy` (the cookbook's ``MinViableGroup``) removes that trajectory from its
  group (optionally re-running a fresh episode of the same instance) and keeps the group when at
  least ``min_group`` episodes remain, else drops the group. A dropped episode is never scored.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import gymnasium as gym
from tinker_cookbook import renderers
from tinker_cookbook.rl import types
from tinker_cookbook.rl.message_env import EnvFromMessageEnv, MessageEnv, MessageStepResult
from tinker_cookbook.tokenizer_utils import get_tokenizer

import ait_env  # noqa: F401  (registers AIT/JobWriting-v0)
from ait_env.backends import Backend, backend_factory
from ait_env.config import compose
from ait_env.observe.metrics import Prices, common_prefix_len
from ait_env.episode.messages import action_text
from ait_env.observe.ledger import CostRecord
from ait_env.episode.spec import strip_tool_sections

logger = logging.getLogger(__name__)

ENV_ID = "AIT/JobWriting-v0"
Message = renderers.Message


class InfraFailedEpisode(RuntimeError):
    """The episode ended ``infra_failed`` (our side failed): it must be dropped, never scored."""


class RunBudgetExhausted(RuntimeError):
    """The run's ledger reached ``budgets.run_usd``: no new episode starts."""


# --------------------------------------------------------------------------- configuration
@dataclass(frozen=True)
class AdapterConfig:
    """Plain, picklable settings shared by every env of a run (see the pilot configs)."""

    model_name: str
    renderer_name: str
    backend: str = "stub"
    env_overrides: dict[str, Any] = field(default_factory=dict)   # nested dict for ait_env.config.compose
    max_tokens: int = 4096                  # per assistant turn
    max_trajectory_tokens: int | None = None
    failed_parse_reward: float = -0.1       # turn without a clean end of message (as "unparsable")
    context_overflow_reward: float = -0.1   # turn over max_tokens / episode over max_trajectory_tokens
    prices: dict[str, Any] = field(default_factory=dict)
    run_budget_usd: float | None = None
    run_id: str = ""
    #: "module:callable(settings, runs_dir) -> Backend" building the run's backend; default make_backend
    backend_factory: str | None = None
    env_threads: int = 64


_EXECUTORS: dict[int, ThreadPoolExecutor] = {}
_EXECUTOR_LOCK = threading.Lock()


def env_executor(n: int) -> ThreadPoolExecutor:
    """The process-wide pool that runs blocking env calls (one per requested size)."""
    with _EXECUTOR_LOCK:
        if n not in _EXECUTORS:
            _EXECUTORS[n] = ThreadPoolExecutor(max_workers=n, thread_name_prefix="ait-env")
        return _EXECUTORS[n]


async def _in_thread(cfg: AdapterConfig, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(env_executor(cfg.env_threads), lambda: fn(*args, **kwargs))


_TOKENIZER_LOCK = threading.RLock()


def serialize_tokenizer(tokenizer: Any) -> Any:
    """Make an HF fast tokenizer safe to share between threads, in place (idempotent).

    The cookbook renders prompts in worker threads (``EnvFromMessageEnv._render_in_thread``) while
    parsing on the event loop, and its Qwen3 renderers switch ``split_special_tokens`` on and off
    between calls, which mutates the shared Rust tokenizer: concurrent calls fail with
    ``RuntimeError: Already borrowed`` (measured here with tokenizers 0.22.2 / transformers 5.5.4)
    or could encode with the other call's setting. Every encode/decode path takes one lock.
    """
    if getattr(tokenizer, "_ait_serialized", False):
        return tokenizer
    for name in ("_encode_plus", "_decode", "convert_tokens_to_ids", "apply_chat_template"):
        fn = getattr(tokenizer, name, None)
        if callable(fn):
            def locked(*args: Any, __fn: Callable[..., Any] = fn, **kwargs: Any) -> Any:
                with _TOKENIZER_LOCK:
                    return __fn(*args, **kwargs)
            setattr(tokenizer, name, locked)
    try:
        tokenizer._ait_serialized = True
    except AttributeError:  # a tokenizer that refuses attributes is left as it is
        pass
    return tokenizer


@cache
def get_renderer(renderer_name: str, model_name: str) -> renderers.Renderer:
    """The cookbook renderer for ``model_name`` (its tokenizer via ``get_tokenizer``: register a local
    one with ``tinker_cookbook.tokenizer_utils.register_tokenizer`` to work offline). The tokenizer
    is made thread-safe with :func:`serialize_tokenizer`."""
    tokenizer = serialize_tokenizer(get_tokenizer(model_name))
    return renderers.get_renderer(renderer_name, tokenizer, model_name=model_name)


_RUN_BACKENDS: dict[str, tuple[str, Backend]] = {}  # adapter-config key -> (run id, backend)
_RUN_BACKENDS_LOCK = threading.Lock()


def run_backend(cfg: AdapterConfig) -> Backend:
    """The one backend of a run, shared by every episode (envs never close it; :func:`close_run_backends`
    does, at the end of the run or at exit). A run is identified by its whole adapter config."""
    key = json.dumps([cfg.run_id, cfg.backend, cfg.backend_factory, cfg.env_overrides], sort_keys=True, default=str)
    with _RUN_BACKENDS_LOCK:
        if key not in _RUN_BACKENDS or _RUN_BACKENDS[key][1].closed:
            settings = compose(backend=cfg.backend, overrides=cfg.env_overrides)
            factory = backend_factory(cfg.backend_factory)
            _RUN_BACKENDS[key] = (cfg.run_id, factory(settings.backend, settings.env.runs_path))
        return _RUN_BACKENDS[key][1]


def close_run_backends(run_id: str | None = None) -> None:
    """Close the backends of the run ``run_id`` (every run's when None, as at exit); running jobs stop
    and a later episode of that run builds a new one. Another run in the same process keeps its own."""
    with _RUN_BACKENDS_LOCK:
        keys = [k for k, (rid, _) in _RUN_BACKENDS.items() if run_id is None or rid == run_id]
        backends = [_RUN_BACKENDS.pop(k)[1] for k in keys]
    for backend in backends:
        backend.close()


atexit.register(close_run_backends)


def make_gym_env(cfg: AdapterConfig) -> gym.Env:
    """One episode's env, on the run's shared backend."""
    return gym.make(ENV_ID, family="train", backend=run_backend(cfg), overrides=cfg.env_overrides)


# --------------------------------------------------------------------------- messages <-> actions
def tool_specs(tools: list[dict[str, Any]]) -> list[renderers.ToolSpec]:
    """The renderer's tool specs for an episode's OpenAI-style tool schemas (``info["tools"]``)."""
    return [t["function"] for t in tools]  # type: ignore[misc]


def message_to_action(message: Message) -> str:
    """The env's text action for a parsed assistant message (:func:`ait_env.episode.messages.action_text`):
    its visible text (thinking dropped), one ``<tool_call>`` block per parsed call (values a renderer
    decoded as JSON, e.g. Qwen3.5's XML parameters, go back to their JSON text), then the raw text of
    each call the renderer could not parse (so the env explains the problem)."""
    return action_text(renderers.get_text_content(message),
                       [(tc.function.name, tc.function.arguments) for tc in message.get("tool_calls", []) or []],
                       [u.raw_text for u in message.get("unparsed_tool_calls", []) or []])


def canonical_assistant(message: Message) -> Message:
    """The assistant message as it goes back into the history: when it has tool calls, its text loses
    the trailing whitespace the parser leaves before/between the calls. cookbook 0.5.8's Qwen renderers
    re-render ``text + "\n" + calls``, so without this a turn with text before its calls renders with
    extra newlines, the next prompt is no longer an extension of the sampled tokens, and the
    trajectory splits into one datum per turn (measured: 3 datums instead of 1 with qwen3_instruct)."""
    if not message.get("tool_calls"):
        return message
    content = message.get("content")
    out = Message(**message)  # type: ignore[typeddict-item]
    if isinstance(content, str):
        out["content"] = content.rstrip()
    elif isinstance(content, list):
        parts = [dict(p) for p in content]
        for p in reversed(parts):
            if p.get("type") == "text":
                p["text"] = p["text"].rstrip()
                if p["text"]:
                    break
        out["content"] = [p for p in parts if p.get("type") != "text" or p["text"]]  # type: ignore[misc]
    return out


def _to_renderer_message(m: dict[str, Any]) -> Message:
    if m["role"] == "tool":
        return Message(role="tool", content=m.get("content") or "", tool_call_id=m.get("tool_call_id", ""),
                       name=m.get("name", ""))
    return Message(role=m["role"], content=m.get("content") or "")


# --------------------------------------------------------------------------- the message-level env
class JobWritingMessageEnv(MessageEnv):
    """One episode of ``AIT/JobWriting-v0`` on one (family, instance). Single use."""

    def __init__(self, cfg: AdapterConfig, family: str, instance: int, split: str) -> None:
        self.cfg = cfg
        self.family = family
        self.instance = instance
        self.split = split
        self.episode_id = f"{cfg.run_id or 'run'}-{uuid.uuid4().hex[:10]}"
        self.example_id = f"{family}:{instance}"
        self.history: list[Message] = []
        self.env: gym.Env | None = None
        self.info: dict[str, Any] = {}
        self.finished = False
        self.dropped = False
        self.turns = 0
        self.llm_usd = 0.0
        self.tokens_in = 0
        self.tokens_out = 0

    @property
    def renderer(self) -> renderers.Renderer:
        return get_renderer(self.cfg.renderer_name, self.cfg.model_name)

    async def initial_observation(self) -> list[Message]:
        self.env = await _in_thread(self.cfg, make_gym_env, self.cfg)
        ledger = self.env.unwrapped.ledger
        if self.cfg.run_budget_usd is not None:
            spent = await _in_thread(self.cfg, ledger.spent)
            if spent >= self.cfg.run_budget_usd:
                raise RunBudgetExhausted(f"run budget reached: ${spent:.2f} >= ${self.cfg.run_budget_usd:.2f} "
                                         f"(ledger {ledger.path}); raise pilot.budgets.run_usd to continue")
        _, self.info = await _in_thread(self.cfg, self.env.reset, seed=self.instance, options={
            "family": self.family, "instance": self.instance, "episode_id": self.episode_id})
        system, task = self.info["messages"][0]["content"], self.info["messages"][1]["content"]
        prefix = self.renderer.create_conversation_prefix_with_tools(tool_specs(self.info["tools"]),
                                                                     strip_tool_sections(system))
        self.history = list(prefix) + [Message(role="user", content=task)]
        return list(self.history)

    async def step(self, message: Message) -> MessageStepResult:
        assert self.env is not None, "initial_observation() must run first"
        n_before = len(self.info["messages"])
        _, _, terminated, truncated, self.info = await _in_thread(self.cfg, self.env.step, message_to_action(message))
        self.turns += 1
        self.history.append(canonical_assistant(message))
        # the env's own copy of the assistant turn is at n_before; what follows is its answer
        self.history.extend(_to_renderer_message(m) for m in self.info["messages"][n_before + 1:])
        done = bool(terminated or truncated)
        metrics: types.Metrics = {}
        reward = 0.0
        if done:
            reward = self._final_reward()
            metrics[f"{types.STOP_METRIC_PREFIX}"
                    f"{types.StopReason.MAX_TURNS if truncated else types.StopReason.TOOL_STOPPED}"] = 1.0
        return MessageStepResult(reward=reward, episode_done=done, next_messages=list(self.history),
                                 metrics=metrics)

    async def record_llm_call(self, prompt_tokens: int, cached_tokens: int, sampled_tokens: int) -> None:
        """Append one ``kind="llm"`` record to the env's ledger (called before the env step)."""
        prices = Prices.from_dict(self.cfg.prices)
        usd = prices.call_usd(prompt_tokens, cached_tokens, sampled_tokens)
        self.llm_usd += usd
        self.tokens_in += prompt_tokens
        self.tokens_out += sampled_tokens
        if self.env is None:
            return
        rec = CostRecord(kind="llm", episode_id=self.episode_id, tokens_in=prompt_tokens, tokens_out=sampled_tokens,
                         usd=usd, meta={"model": self.cfg.model_name, "cached_in": cached_tokens,
                                        "turn": self.turns + 1, "run": self.cfg.run_id, "split": self.split,
                                        "prices_as_of": prices.as_of, "billing": "estimate"})
        await _in_thread(self.cfg, self.env.unwrapped.ledger.append, rec)

    @property
    def jobs_ran(self) -> int:
        return len(self.info.get("jobs") or [])

    async def end_early(self, reason: str) -> float:
        """The outer loop stops the episode (a turn it could not parse, ...) after jobs ran: the gym env ends
        it scored on those jobs; returns that reward (an infra_failed episode raises, as in :meth:`step`)."""
        assert self.env is not None
        self.info = await _in_thread(self.cfg, self.env.unwrapped.end_episode, reason)
        return self._final_reward()

    def _final_reward(self) -> float:
        """The ended episode's reward from its info (an ``infra_failed`` episode raises
        :class:`InfraFailedEpisode`: dropped, never scored)."""
        self.finished = True
        breakdown = self.info.get("reward") or {}
        if breakdown.get("drop"):
            self.dropped = True
            raise InfraFailedEpisode(f"episode {self.episode_id} ({self.example_id}) infra_failed: "
                                     f"{breakdown.get('reason', '')}"[:500])
        return float(breakdown.get("total") or 0.0)

    def job(self) -> Any:
        """The job the reward counts (from its bundle; a research episode's best job), or None."""
        job_info = self.info.get("job")
        if not job_info or self.env is None:
            return None
        from ait_env.jobs.bundle import JobBundle

        try:
            return JobBundle.load(Path(self.env.unwrapped.runs_dir) / "jobs" / job_info["job_id"]).job
        except Exception as exc:  # noqa: BLE001 - metrics must never break training
            logger.warning("could not load the job bundle of %s: %s", self.episode_id, exc)
            return None

    def close(self) -> None:
        if self.env is not None:
            self.env.close()


class MeteredEnv(EnvFromMessageEnv):
    """``EnvFromMessageEnv`` that records every sampling call's tokens and USD in the cost ledger."""

    message_env: JobWritingMessageEnv

    def __init__(self, renderer: renderers.Renderer, message_env: JobWritingMessageEnv, **kwargs: Any) -> None:
        super().__init__(renderer, message_env, **kwargs)
        self._ob: list[int] = []
        self._prev: list[int] = []      # previous prompt + action
        self.turns: list[tuple[list[int], list[int]]] = []

    async def initial_observation(self) -> Any:
        out = await super().initial_observation()
        if isinstance(out, tuple):
            self._ob = out[0].to_ints()
        return out

    async def step(self, action: types.Action, *, extra: types.ActionExtra | None = None) -> types.StepResult:
        cached = common_prefix_len(self._prev, self._ob) if self._prev else 0
        await self.message_env.record_llm_call(len(self._ob), cached, len(action))
        self.turns.append((self._ob, list(action)))
        self._prev = self._ob + list(action)
        result = await super().step(action, extra=extra)
        me = self.message_env
        if result.episode_done and not me.finished and me.jobs_ran:
            # the cookbook ended the rollout (a turn it could not parse, max_tokens, context overflow) after
            # jobs ran: the episode is scored on them, never given the parse-error reward
            why = ("a turn the renderer could not parse" if result.metrics.get("parse_error")
                   else "a turn over the token limits")
            result.reward = await me.end_early(why)
            result.metrics = {**result.metrics, "ait/ended_early_scored": 1.0}
        if not result.episode_done:
            self._ob = result.next_observation.to_ints()
        return result


__all__ = ["AdapterConfig", "InfraFailedEpisode", "JobWritingMessageEnv", "MeteredEnv", "RunBudgetExhausted",
           "canonical_assistant", "close_run_backends", "get_renderer", "message_to_action", "run_backend",
           "serialize_tokenizer", "strip_tool_sections"]
