"""One episode played by the agent's model (:func:`play_episode`: never raises for endpoint or agent failures),
what it did (:class:`EpisodeRecord`) and its transcript, as JSON and as markdown for a person to read."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from ait_env.agents.llm.client import AgentSettings, context_overflow, read_reply, redactor
from ait_env.episode.messages import action_text
from ait_env.episode.spec import strip_tool_sections
from ait_env.jobs.schema import Job, parse_job
from ait_env.observe.ledger import CostRecord
from ait_env.observe.metrics import episode_metrics

#: statuses whose reward counts (infra_failed and endpoint_failed episodes are dropped)
KEPT = ("scored", "job_failed", "invalid", "unparsable")


class EpisodeRecord(BaseModel):
    """What one episode did."""

    family: str
    seed: int
    episode_id: str = ""
    status: str = ""                 # the env's reward status, or endpoint_failed
    reward: float | None = None      # None when dropped (infra_failed / endpoint_failed)
    breakdown: dict[str, Any] = Field(default_factory=dict)
    base_model: str | None = None    # of the submitted job, when one validated
    tool_mode: str = ""
    turns: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    llm_usd: float = 0.0
    job_usd: float = 0.0
    seconds: float = 0.0
    error: str = ""
    metrics: dict[str, float] = Field(default_factory=dict)
    transcript: str = ""             # the episode's transcript, relative to the run's folder


def _native_messages(info: dict[str, Any]) -> list[dict[str, Any]]:
    """The env's conversation for a native-tools endpoint (its system prompt without the text tool sections)."""
    msgs = [dict(m) for m in info["messages"]]
    msgs[0]["content"] = strip_tool_sections(msgs[0]["content"])
    return msgs


def _submitted_job(env: Any, info: dict[str, Any]) -> Job | None:
    """The job the reward counts: its bundle's (a research episode's best job), else the workspace's."""
    if "jobs_left" in info and info.get("job"):
        from ait_env.jobs.bundle import JobBundle

        try:
            return JobBundle.load(Path(env.unwrapped.runs_dir) / "jobs" / info["job"]["job_id"]).job
        except Exception:  # noqa: BLE001 - metrics never break a run
            return None
    ws = env.unwrapped.workspace
    try:
        job, _ = parse_job(ws.read("job.toml")) if ws is not None else (None, [])
    except Exception:  # noqa: BLE001 - a missing or broken job.toml is simply no job
        return None
    return job


def play_episode(env: Any, client: Any, agent: AgentSettings, family: str, seed: int,
                 log: dict[str, Any] | None = None,
                 on_turn: Callable[[dict[str, Any]], None] | None = None) -> EpisodeRecord:
    """One episode on ``env`` (a gym env of the run); never raises for endpoint or agent failures.
    ``log``, when given, receives the episode's ``opening`` (the first messages, as the model saw them) and
    its ``turns`` (one entry per model turn: reply, tool calls, the env's action and observation, tokens);
    ``on_turn`` is called with each turn's entry as it ends (progress while a slow model plays)."""
    from openai import APIError, BadRequestError

    log = {} if log is None else log
    turns: list[dict[str, Any]] = log.setdefault("turns", [])
    t0 = time.time()
    redact = redactor(agent.api_key)
    rec = EpisodeRecord(family=family, seed=seed)
    obs, info = env.reset(seed=seed, options={"family": family})
    rec.episode_id = info["episode_id"]
    ledger = env.unwrapped.ledger
    mode = "native" if agent.tool_mode in ("auto", "native") else "text"
    text_msgs: list[dict[str, Any]] = [dict(m) for m in info["messages"]]
    done = False
    while not done:
        messages = _native_messages(info) if mode == "native" else text_msgs
        if not turns:
            log["opening"] = [dict(m) for m in messages[:2]]
        kwargs: dict[str, Any] = {"model": agent.model, "messages": messages, "temperature": agent.temperature,
                                  "max_tokens": agent.max_tokens}
        if mode == "native":
            kwargs["tools"] = info["tools"]
        try:
            resp = client.chat.completions.create(**kwargs)
            # text mode reads structured calls too: an endpoint with a tool parser (vLLM's, the tiny models')
            # takes the model's <tool_call> blocks out of the content even when no tools were sent
            content, calls, tin, tout = read_reply(resp, native=True)
        except BadRequestError as exc:
            if mode == "native" and agent.tool_mode == "auto" and rec.turns == 0:
                mode = "text"  # the endpoint refuses tools: the model writes <tool_call> blocks itself
                continue
            if rec.turns and context_overflow(exc):
                # the agent's own conversation outgrew the model's context (its long turns, long tool results):
                # the agent's outcome, not the endpoint's; the env scores the episode as at its turn limit
                rec.error = redact(f"the conversation outgrew the model's context: {exc}")[:500]
                info = env.unwrapped.end_episode("the conversation outgrew the model's context")
                break
            rec.status, rec.error = "endpoint_failed", redact(f"the endpoint refused the request: {exc}")[:500]
            break
        except APIError as exc:  # retries exhausted (429, 5xx, connection, timeout)
            rec.status, rec.error = "endpoint_failed", redact(f"{type(exc).__name__} after retries: {exc}")[:500]
            break
        except Exception as exc:  # noqa: BLE001 - any answer that is not a usable completion ends the episode
            rec.status, rec.error = "endpoint_failed", redact(f"unusable answer: {type(exc).__name__}: {exc}")[:500]
            break
        usd = agent.prices.call_usd(tin, 0, tout)
        rec.tokens_in, rec.tokens_out, rec.llm_usd = rec.tokens_in + tin, rec.tokens_out + tout, rec.llm_usd + usd
        ledger.append(CostRecord(kind="llm", episode_id=rec.episode_id, tokens_in=tin, tokens_out=tout, usd=usd,
                                 meta={"model": agent.model, "turn": rec.turns + 1, "tool_mode": mode,
                                       "prices_as_of": agent.prices.as_of}))
        content = redact(content)
        action = action_text(content, [(name, redact(args)) for name, args in calls])
        # the model's own text goes back unchanged (its calls written in, when the endpoint parsed them out)
        text_msgs.append({"role": "assistant", "content": action if calls else (content or "")})
        obs, _, terminated, truncated, info = env.step(action)
        text_msgs.append({"role": "user", "content": obs})
        rec.turns += 1
        turns.append({"turn": rec.turns, "tool_mode": mode, "content": content or "",
                      "tool_calls": [{"name": n, "arguments": redact(a) if isinstance(a, str) else a} for n, a in calls],
                      "action": action, "observation": obs, "tokens_in": tin, "tokens_out": tout})
        if on_turn is not None:
            on_turn(turns[-1])
        done = terminated or truncated
    rec.tool_mode = mode
    rec.seconds = round(time.time() - t0, 2)
    if rec.status != "endpoint_failed":
        breakdown = info.get("reward") or {}
        rec.breakdown = breakdown
        rec.status = str(breakdown.get("status", ""))
        rec.reward = None if breakdown.get("drop") else float(breakdown.get("total") or 0.0)
        job = _submitted_job(env, info) if breakdown.get("validated_attempt") is not None else None
        rec.base_model = job.job.base_model if job is not None else None
        rec.job_usd = float(sum(j.get("cost_usd") or 0.0 for j in info.get("jobs") or []))
        if rec.reward is not None:
            rec.metrics = episode_metrics(breakdown, job, family, rec.turns, rec.reward,
                                          research="jobs_left" in info)
    return rec


def transcript(rec: EpisodeRecord, log: dict[str, Any], model: str, backend: str) -> dict[str, Any]:
    """An episode's transcript: what the model saw and wrote, what the env answered, and the reward."""
    return {"family": rec.family, "seed": rec.seed, "episode_id": rec.episode_id, "model": model,
            "backend": backend, "status": rec.status, "reward": rec.reward, "breakdown": rec.breakdown,
            "error": rec.error, "opening": log.get("opening", []), "turns": log.get("turns", [])}


def transcript_markdown(t: dict[str, Any]) -> str:
    """:func:`transcript` as text a person reads top to bottom."""
    out = [f"# {t['model']} on {t['family']} (seed {t['seed']}, episode {t['episode_id']}, {t['backend']} backend)",
           "", f"status **{t['status']}**, reward {t['reward']}" + (f" — {t['error']}" if t.get("error") else ""), ""]
    for m in t.get("opening", []):
        out += [f"## {m.get('role')}", "", "```text", str(m.get("content") or ""), "```", ""]
    for turn in t.get("turns", []):
        out += [f"## turn {turn['turn']}: the agent ({turn['tokens_out']} tokens)", "", "```text", turn["action"], "```",
                "", "### the env's answer", "", "```text", str(turn["observation"]), "```", ""]
    return "\n".join(out) + "\n"
