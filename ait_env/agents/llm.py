"""Score any LLM as a trainer agent: episodes of ``AIT/JobWriting-v0`` played by a model behind any
OpenAI-compatible chat endpoint (a hosted API, vLLM, Ollama, the local tiny-model endpoint).

    python -m ait_env.agents.llm --base-url https://api.example.com/v1 --model my-model \\
        [--api-key-env OPENAI_API_KEY] [--families train|all|arithmetic,units] [--episodes 4] \\
        [--concurrency 4] [--backend stub|local] [--tool-mode auto|native|text] \\
        [--price-in 0.5 --price-out 1.5 --prices-as-of 2026-12-01] [--max-jobs 3] [--out runs/llm/<name>]

Contract:

- **Tool calls**: ``native`` sends the episode's tools (``info["tools"]``: the six, plus ``submit_jobs``
  and ``finish`` when ``--max-jobs`` > 1 makes it a research episode) as OpenAI ``tools`` (the system prompt without
  its text tool sections) and turns each returned ``tool_calls`` entry into the env's
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` text
  (:func:`ait_env.episode.messages.action_text`, as every outer loop does); the conversation sent back is the
  env's own (``info["messages"]``: its assistant turns carry the tool calls, its ``tool`` messages the
  results). ``text`` sends no ``tools``: the model writes ``<tool_call>`` blocks itself and reads the
  env's observations as user messages. ``auto`` starts native and switches an episode to text when the
  endpoint refuses tools (HTTP 400 on the first turn).
- **Retries**: rate limits (429), server errors (5xx), dropped connections and timeouts are retried
  with exponential backoff (the official ``openai`` client's own retries, ``--max-retries``). An
  endpoint that still fails ends the episode as ``endpoint_failed``: never the agent's failure, left
  out of every reward statistic (like ``infra_failed``) and counted in the table. So does any answer
  that is not a usable chat completion (an HTML page with status 200, no choices, a body that does not
  parse): the episode ends, the run goes on.
- **Deadlines**: every attempt has an overall deadline of ``--timeout`` seconds from its start to the
  last byte of its answer (a server that drips a byte at a time is cut off; httpx's own timeouts apply
  per read), so a request lasts at most ``(max_retries + 1) × timeout`` plus the backoff.
- **The API key never leaves the runner**: it is removed from the endpoint's answers before they reach
  the env and from every text the runner writes or logs (an endpoint that echoes the ``Authorization``
  header in an error cannot put it in ``episodes.jsonl``).
- **One backend for the run**, shared by every episode (``gym.make(..., backend=<Backend>)``), closed at
  the end; episodes run ``--concurrency`` at a time in threads.
- **Costs**: each completion's prompt and completion tokens and their USD (``--price-in``/``--price-out``
  USD per million tokens, dated by ``--prices-as-of``) go to the env's cost ledger as ``kind="llm"``
  records of the episode, so the episode budget counts them; jobs add their ``gpu_job`` records.
- **Resume**: ``--resume`` keeps the episodes that an interrupted run with the same settings (``run.json`` in
  ``--out``: model, served weights hash, backend, tool mode, sampling, hidden seeds) wrote and plays only the
  rest; other settings there are refused, saying which.
- **Results** in ``--out``: ``episodes.jsonl`` (one record per episode), ``results.json`` and
  ``results.md`` (per family and overall: episodes, mean reward with a 95% CI over the scored,
  job_failed, invalid and unparsable episodes, validation rate, status mix, mean uplift of scored jobs,
  the share of validated jobs on each base model, mean turns, LLM and job USD; jobs per episode, the share
  of dispatches that were batches of several jobs, the best job's reward gain over the first job's, and
  the cost per episode), and ``results.png``; the
  three and the table printed on stdout carry one title (:func:`results_title`: the model, the backend,
  ``SURROGATE scores`` on the stub backend). The chart draws a CI only where one exists (n ≥ 2).
- **Hidden eval**: this installation's private seeds unless ``--hidden-seeds published`` (or
  ``AIT_HIDDEN_SEEDS``) chooses the public ones; ``results.json``'s ``meta.hidden_seeds`` and the last line
  on stderr say which (:mod:`ait_env.hidden.secrets`).
- **Exit status**: 0 when at least one episode was kept (has a reward, even 0); 1 when none was (every
  episode ``endpoint_failed`` or ``infra_failed``: nothing measured the agent), with a line saying so;
  3 when an extra is missing (:mod:`ait_env.extras`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
from pydantic import BaseModel, Field

import ait_env  # noqa: F401  (registers AIT/JobWriting-v0)
from ait_env.backends import Backend, make_backend
from ait_env.config import compose, split_families
from ait_env.observe.metrics import Prices, episode_metrics, fill_model_share, model_key
from ait_env.episode.messages import action_text
from ait_env.observe.display import status_label
from ait_env.jobs.schema import Job, parse_job
from ait_env.observe.ledger import CostRecord
from ait_env.episode.spec import strip_tool_sections
from ait_env.hidden.secrets import default_hidden_seeds, hidden_seeds_label
from task_families import FAMILY_NAMES

ToolMode = Literal["auto", "native", "text"]
#: statuses whose reward counts (infra_failed and endpoint_failed episodes are dropped)
KEPT = ("scored", "job_failed", "invalid", "unparsable")


class AgentSettings(BaseModel):
    """How the agent's model is called."""

    base_url: str
    model: str
    api_key: str = Field("none", repr=False)
    tool_mode: ToolMode = "auto"
    temperature: float = 0.7
    max_tokens: int = 4096
    timeout_s: float = 300.0
    max_retries: int = 6
    prices: Prices = Field(default_factory=lambda: Prices.from_dict({}))


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


class EndpointFailed(Exception):
    """The endpoint's answer is not a usable chat completion (the episode ends ``endpoint_failed``)."""


def _deadline_stream(inner: Any, deadline: float, request: Any) -> Any:
    """An httpx response body that raises ``httpx.ReadTimeout`` once ``deadline`` has passed."""
    import httpx

    class DeadlineStream(httpx.SyncByteStream):
        def __iter__(self) -> Any:
            for chunk in inner:
                if time.monotonic() > deadline:
                    raise httpx.ReadTimeout("the answer did not complete within its deadline", request=request)
                yield chunk

        def close(self) -> None:
            inner.close()

    return DeadlineStream()


def _deadline_transport(total_s: float) -> Any:
    """An httpx transport whose every request must complete (headers and body) within ``total_s``."""
    import httpx

    class DeadlineTransport(httpx.HTTPTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            deadline = time.monotonic() + total_s
            resp = super().handle_request(request)
            if time.monotonic() > deadline:
                resp.close()
                raise httpx.ReadTimeout("the answer did not start within its deadline", request=request)
            return httpx.Response(resp.status_code, headers=resp.headers, request=request,
                                  stream=_deadline_stream(resp.stream, deadline, request),
                                  extensions=resp.extensions)

    return DeadlineTransport()


def _client(agent: AgentSettings) -> Any:
    import httpx
    from openai import OpenAI

    http = httpx.Client(transport=_deadline_transport(agent.timeout_s),
                        timeout=httpx.Timeout(agent.timeout_s, connect=min(30.0, agent.timeout_s)))
    return OpenAI(base_url=agent.base_url, api_key=agent.api_key, timeout=agent.timeout_s,
                  max_retries=agent.max_retries, http_client=http)


def redactor(secret: str) -> Any:
    """``redact(text)``: ``text`` without ``secret`` (and its JSON-escaped form); identity for no secret."""
    forms = sorted({f for f in (secret, json.dumps(secret)[1:-1]) if f and len(f) >= 4 and f != "none"},
                   key=len, reverse=True)

    def redact(text: Any) -> Any:
        if not isinstance(text, str):
            return text
        for f in forms:
            text = text.replace(f, "<redacted>")
        return text

    return redact


def _count(value: Any) -> int:
    """A token count as an int (0 for anything that is not a finite non-negative number)."""
    try:
        n = float(value)
    except (TypeError, ValueError, OverflowError):
        return 0
    return int(n) if math.isfinite(n) and 0 <= n < 1e12 else 0


def _text(content: Any) -> str | None:
    """Message content as text: a string, or the text of a list of content parts."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            part = part.model_dump() if hasattr(part, "model_dump") else part
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
        return "".join(parts)
    raise EndpointFailed(f"the message content is a {type(content).__name__}, not text")


def read_reply(resp: Any, native: bool) -> tuple[str | None, list[tuple[str, Any]], int, int]:
    """(content, tool calls as (name, raw arguments), prompt tokens, completion tokens) of a chat completion,
    or :class:`EndpointFailed` saying why it is not one."""
    choices = getattr(resp, "choices", None)
    if not isinstance(choices, list):
        raise EndpointFailed(f"the endpoint answered with something that is not a chat completion: "
                             f"{str(resp)[:200]!r}")
    if not choices:
        raise EndpointFailed("the endpoint answered with no choices")
    message = getattr(choices[0], "message", None)
    if message is None or isinstance(message, (str, int, float, bool, list)) \
            or not (hasattr(message, "content") or hasattr(message, "tool_calls")):
        raise EndpointFailed(f"the endpoint's first choice has no message ({str(message)[:80]!r})")
    content = _text(getattr(message, "content", None))
    calls: list[tuple[str, Any]] = []
    if native:
        for c in getattr(message, "tool_calls", None) or []:
            fn = getattr(c, "function", None)
            if fn is not None and isinstance(getattr(fn, "name", None), str):
                calls.append((fn.name, getattr(fn, "arguments", None)))
    usage = getattr(resp, "usage", None)
    return content, calls, _count(getattr(usage, "prompt_tokens", 0)), _count(getattr(usage, "completion_tokens", 0))


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


# ------------------------------------------------------------------------------------------ statistics
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


def mean_ci(values: list[float], z: float = 1.96) -> tuple[float | None, float | None]:
    """Mean and the half-width of its normal-approximation 95% interval (None without values)."""
    n = len(values)
    if n == 0:
        return None, None
    mean = sum(values) / n
    if n == 1:
        return mean, None
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, z * sd / math.sqrt(n)


def summarize(records: list[EpisodeRecord], catalog: list[str]) -> dict[str, Any]:
    """The results table: one row per family and an ``all`` row (see the module docstring)."""
    rows: dict[str, Any] = {}
    groups = {f: [r for r in records if r.family == f] for f in sorted({r.family for r in records})}
    for name, recs in {**groups, "all": records}.items():
        kept = [r for r in recs if r.reward is not None and r.status in KEPT]
        metrics = [dict(r.metrics) for r in kept]
        fill_model_share(metrics, catalog)
        validated = [m for m in metrics if m.get("ait/validated")]
        mean, half = mean_ci([r.reward for r in kept if r.reward is not None])
        uplift, _ = mean_ci([float(r.breakdown["uplift"]) for r in kept
                             if r.status == "scored" and r.breakdown.get("uplift") is not None])
        rows[name] = {
            "episodes": len(recs), "kept": len(kept), "mean_reward": mean, "ci95": half,
            "validation_rate": (sum(m.get("ait/validated", 0.0) for m in metrics) / len(metrics)) if metrics else None,
            "status": dict(Counter(r.status for r in recs)), "mean_uplift": uplift,
            "model_share": {m: (sum(v.get(f"ait/model/{model_key(m)}", 0.0) for v in validated) / len(validated))
                            for m in catalog} if validated else {},
            "mean_turns": (sum(r.turns for r in recs) / len(recs)) if recs else None,
            "jobs_per_episode": _mean_of(metrics, "ait/jobs"), "batch_share": _mean_of(metrics, "ait/batch_share"),
            "best_vs_first": _mean_of(metrics, "ait/best_vs_first"),
            "usd_per_episode": (sum(r.llm_usd + r.job_usd for r in recs) / len(recs)) if recs else None,
            "llm_usd": round(sum(r.llm_usd for r in recs), 6), "job_usd": round(sum(r.job_usd for r in recs), 6),
            "tokens_in": sum(r.tokens_in for r in recs), "tokens_out": sum(r.tokens_out for r in recs)}
    return rows


def _mean_of(metrics: list[dict[str, float]], key: str) -> float | None:
    """The mean of ``key`` over the episodes that have it (None: none has)."""
    vals = [m[key] for m in metrics if key in m]
    return sum(vals) / len(vals) if vals else None


def _fmt(v: Any, spec: str = ".3f") -> str:
    return "–" if v is None else format(v, spec)


def markdown(rows: dict[str, Any], title: str) -> str:
    lines = [f"# {title}", "", "| family | episodes (kept) | mean reward ± 95% CI | validated | status mix | "
             "mean uplift | base-model share | turns | LLM USD | job USD | jobs/episode | batch share | "
             "best − first job | USD/episode |", "|" + "---|" * 14]
    for name, r in rows.items():
        reward = f"{_fmt(r['mean_reward'])} ± {_fmt(r['ci95'])}" if r["ci95"] is not None else _fmt(r["mean_reward"])
        status = ", ".join(f"{k} {v}" for k, v in sorted(r["status"].items()))
        share = ", ".join(f"{model_key(m)} {v:.0%}" for m, v in r["model_share"].items()) or "–"
        lines.append(f"| {name} | {r['episodes']} ({r['kept']}) | {reward} | {_fmt(r['validation_rate'], '.0%')} | "
                     f"{status} | {_fmt(r['mean_uplift'], '+.3f')} | {share} | {_fmt(r['mean_turns'], '.1f')} | "
                     f"{r['llm_usd']:.4f} | {r['job_usd']:.4f} | {_fmt(r.get('jobs_per_episode'), '.2f')} | "
                     f"{_fmt(r.get('batch_share'), '.0%')} | {_fmt(r.get('best_vs_first'), '+.3f')} | "
                     f"{_fmt(r.get('usd_per_episode'), '.4f')} |")
    return "\n".join(lines) + "\n"


def results_title(model: str, backend: str, surrogate: bool) -> str:
    """The one title of a run's results: ``results.md``, ``results.png`` and the table printed on stdout."""
    return f"{model} as a trainer agent ({backend} backend{', SURROGATE scores' if surrogate else ''})"


def chart_figure(rows: dict[str, Any], title: str) -> Any:
    """The results chart: mean reward per family (families without a kept episode are left out), each
    bar labelled with its kept episodes; the 95% CI is drawn only where there is one (two or more kept
    episodes: one episode has no interval, and a bar without a whisker says so, "n=1, no CI"). The title
    is wrapped to the figure's width so that none of it is cut off."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n, r in rows.items() if r["mean_reward"] is not None]
    width = max(1.2 * len(names) + 2, 4.5)
    fig, ax = plt.subplots(figsize=(width, 3.8), layout="constrained")
    means = [rows[n]["mean_reward"] for n in names]
    ax.bar(names, means, color=["#4c72b0" if n != "all" else "#555555" for n in names])
    with_ci = [i for i, n in enumerate(names) if rows[n]["ci95"]]
    if with_ci:
        ax.errorbar([names[i] for i in with_ci], [means[i] for i in with_ci],
                    yerr=[rows[names[i]]["ci95"] for i in with_ci], fmt="none", ecolor="black", capsize=4)
    for i, n in enumerate(names):
        note = f"n={rows[n]['kept']}" + ("" if rows[n]["ci95"] else ", no CI")
        ax.annotate(note, (i, means[i]), xytext=(0, 3 if means[i] >= 0 else -10), textcoords="offset points",
                    ha="center", fontsize=7)
    ax.axhline(0, color="black", linewidth=0.6)
    ax.margins(y=0.15)
    ax.set_ylabel("mean episode reward (95% CI)")
    chars = max(20, int(width * 72 / (10 * 0.62)))  # ~characters of a 10 pt title per line at this width
    ax.set_title("\n".join(textwrap.wrap(title, chars)), fontsize=10)
    return fig


def chart(rows: dict[str, Any], path: Path, title: str) -> None:
    """Write :func:`chart_figure` to ``path``."""
    import matplotlib.pyplot as plt

    fig = chart_figure(rows, title)
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ------------------------------------------------------------------------------------------ the run
class ResumeMismatch(ValueError):
    """``--resume`` met a run in ``--out`` that was played with other settings."""


def _scored_before(out: Path, plan: list[tuple[str, int]], fingerprint: dict[str, Any],
                   resume: bool) -> list[EpisodeRecord]:
    """The episodes of ``plan`` that a run with the same ``fingerprint`` already wrote to ``out`` (``resume``),
    else none; ``out/run.json`` records the fingerprint of the run now playing."""
    kept: list[EpisodeRecord] = []
    path = out / "run.json"
    if resume and path.is_file():
        before = json.loads(path.read_text() or "{}")
        differ = {k: (before.get(k), v) for k, v in fingerprint.items() if before.get(k) != v}
        if differ:
            raise ResumeMismatch(f"{out} holds a run with other settings {differ} (before, now): give another "
                                 "--out, or leave out --resume to score again from the start")
        wanted, seen = set(plan), set()
        for line in (out / "episodes.jsonl").read_text().splitlines() if (out / "episodes.jsonl").is_file() else []:
            try:  # a line torn by a kill is played again
                rec = EpisodeRecord.model_validate_json(line)
            except ValueError:
                continue
            if (rec.family, rec.seed) in wanted and (rec.family, rec.seed) not in seen:
                seen.add((rec.family, rec.seed))
                kept.append(rec)
    path.write_text(json.dumps(fingerprint, indent=1) + "\n")
    return kept


def run(agent: AgentSettings, families: list[str], episodes: int, *, backend: str | Backend = "stub",
        out: Path, concurrency: int = 4, seed: int = 0, overrides: dict[str, Any] | None = None,
        log: Any = print, resume: bool = False) -> dict[str, Any]:
    """Play ``episodes`` episodes of each family, ``concurrency`` at a time, on one backend; write the
    results to ``out`` and return the table. ``resume``: keep the episodes an interrupted run with the same
    settings (model and served weights, backend, tool mode, sampling, hidden seeds, overrides) wrote to ``out``
    and play only the others; a run with other settings there raises :class:`ResumeMismatch`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    given = dict(overrides or {})
    overrides = {**given, "env": {"runs_dir": str(out / "runs"), **dict(given.get("env") or {})}}
    settings = compose(backend=backend if isinstance(backend, str) else "stub", overrides=overrides)
    shared = backend if isinstance(backend, Backend) else make_backend(settings.backend, settings.env.runs_path)
    client = _client(agent)
    redact = redactor(agent.api_key)
    catalog = [m.name for m in shared.catalog()]
    plan = [(f, seed + i) for f in families for i in range(episodes)]
    records: list[EpisodeRecord] = []
    lock = threading.Lock()
    t0 = time.time()

    def one(item: tuple[str, int]) -> EpisodeRecord:
        fam, s = item
        env = gym.make("AIT/JobWriting-v0", family=fam, backend=shared, overrides=overrides)
        episode_log: dict[str, Any] = {}
        try:
            rec = play_episode(env, client, agent, fam, s, episode_log, on_turn=lambda t: log(
                f"[{time.time() - t0:.0f}s] {fam} seed {s} turn {t['turn']}: {t['tokens_out']} tokens, "
                f"{len(re.findall(r'<tool_call>', t['action']))} tool call(s)"))
        finally:
            env.close()
        with lock:
            t = transcript(rec, episode_log, agent.model, shared.name)
            stem = f"transcripts/{fam}-{s}-{rec.episode_id or 'none'}"
            (out / f"{stem}.json").write_text(redact(json.dumps(t, indent=1, default=str)) + "\n")
            (out / f"{stem}.md").write_text(redact(transcript_markdown(t)))
            rec.transcript = f"{stem}.md"
            records.append(rec)
            with open(out / "episodes.jsonl", "a") as f:
                f.write(redact(rec.model_dump_json()) + "\n")
            log(redact(f"[{len(records)}/{len(plan)} {time.time() - t0:.0f}s] {fam} seed {s}: "
                       f"{status_label(rec.status, shared.name, shared.surrogate)} "
                       f"reward {_fmt(rec.reward)} turns {rec.turns} ({rec.tool_mode}) LLM ${rec.llm_usd:.4f}"
                       + (f" — {rec.error}" if rec.error else "")))
        return rec

    served = served_model(client, agent.model)
    fingerprint = {"model": agent.model, "served_weights": served.get("ait_weights_hash"), "backend": shared.name,
                   "tool_mode": agent.tool_mode, "temperature": agent.temperature, "max_tokens": agent.max_tokens,
                   "hidden_seeds": hidden_seeds_label(), "overrides": json.loads(json.dumps(given, default=str))}
    try:
        records.extend(_scored_before(out, plan, fingerprint, resume))
    except BaseException:
        if not isinstance(backend, Backend):
            shared.close()
        raise
    done = {(r.family, r.seed) for r in records}
    if records:
        log(f"[resume] {len(records)} of {len(plan)} episodes scored before in {out}; playing {len(plan) - len(done)}")
    (out / "episodes.jsonl").write_text("".join(redact(r.model_dump_json()) + "\n" for r in records))
    (out / "transcripts").mkdir(exist_ok=True)
    try:
        with ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="ait-llm") as pool:
            list(pool.map(one, [p for p in plan if p not in done]))
    finally:
        if not isinstance(backend, Backend):
            shared.close()
    records.sort(key=lambda r: (r.family, r.seed))
    rows = summarize(records, catalog)
    title = results_title(agent.model, shared.name, shared.surrogate)
    meta = {"model": agent.model, "base_url": agent.base_url, "backend": shared.name, "surrogate": shared.surrogate,
            "tool_mode": agent.tool_mode, "temperature": agent.temperature, "episodes_per_family": episodes,
            "prices": {"as_of": agent.prices.as_of, "source": agent.prices.source, "in": agent.prices.prefill,
                       "out": agent.prices.sample}, "seconds": round(time.time() - t0, 1),
            "date": time.strftime("%Y-%m-%d"), "served_model": served}
    meta["hidden_seeds"] = hidden_seeds_label()   # which hidden-eval seeds scored the run
    (out / "results.json").write_text(redact(json.dumps({"meta": meta, "rows": rows}, indent=1)) + "\n")
    (out / "results.md").write_text(redact(markdown(rows, title)))
    chart(rows, out / "results.png", title)
    return rows


def served_model(client: Any, model: str) -> dict[str, Any]:
    """The endpoint's ``/v1/models`` entry for ``model`` (e.g. the project's endpoints add the weights hash,
    ``ait_weights_hash``), recorded with the results; ``{}`` when the endpoint does not list it."""
    try:
        for m in client.models.list().data:
            entry = m.model_dump() if hasattr(m, "model_dump") else dict(m)
            if entry.get("id") == model:
                return {k: v for k, v in entry.items() if isinstance(v, (str, int, float, bool)) and k != "object"}
    except Exception:  # noqa: BLE001 - a hosted API may not list models; nothing depends on it
        pass
    return {}


def family_list(spec: str) -> list[str]:
    if spec == "all":
        return list(FAMILY_NAMES)
    if spec == "train":
        return split_families(list(FAMILY_NAMES))[0]
    names = [f.strip() for f in spec.split(",") if f.strip()]
    unknown = [f for f in names if f not in FAMILY_NAMES]
    if unknown:
        raise SystemExit(f"unknown families {unknown}; choose from {', '.join(FAMILY_NAMES)}, train or all")
    return names


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ait_env.agents.llm", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", required=True, help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")
    ap.add_argument("--model", required=True)
    ap.add_argument("--api-key-env", default="OPENAI_API_KEY",
                    help="environment variable holding the API key (unset: 'none', fine for local servers)")
    ap.add_argument("--families", default="train", help="train (default), all, or a comma-separated list")
    ap.add_argument("--episodes", type=int, default=4, help="episodes per family")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--backend", default="stub", help="stub (surrogate scores, instant) or local (real training)")
    ap.add_argument("--tool-mode", choices=["auto", "native", "text"], default="auto")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--max-retries", type=int, default=6)
    ap.add_argument("--timeout", type=float, default=300.0,
                    help="seconds one attempt may take from its start to the last byte of the answer")
    ap.add_argument("--price-in", type=float, default=0.0, help="USD per million prompt tokens")
    ap.add_argument("--price-out", type=float, default=0.0, help="USD per million completion tokens")
    ap.add_argument("--prices-as-of", default="", help="the date the prices were read (recorded with each cost)")
    ap.add_argument("--max-jobs", type=int, default=1,
                    help="jobs per episode (env.max_jobs_per_episode); above 1: research episodes, with the "
                    "submit_jobs and finish tools")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hidden-seeds", choices=["private", "published"],
                    help="the hidden eval's seeds (default: $AIT_HIDDEN_SEEDS, else private: this installation's "
                    "own; published: the public ones, to reproduce pinned figures)")
    ap.add_argument("--out", type=Path, help="default: runs/llm/<model>-<backend>")
    ap.add_argument("--resume", action="store_true",
                    help="keep the episodes an interrupted run with the same settings wrote to --out; play the rest")
    args = ap.parse_args(argv)
    seeds = default_hidden_seeds("private", args.hidden_seeds)   # before any job runner starts: inherited
    if (args.price_in or args.price_out) and not args.prices_as_of:
        raise SystemExit("--prices-as-of is required with --price-in/--price-out (prices change; record when)")
    prices = Prices.from_dict({"prefill": args.price_in, "cached_prefill": args.price_in, "sample": args.price_out,
                               "train": 0.0, "as_of": args.prices_as_of, "source": "command line"})
    agent = AgentSettings(base_url=args.base_url, model=args.model, api_key=os.environ.get(args.api_key_env) or "none",
                          tool_mode=args.tool_mode, temperature=args.temperature, max_tokens=args.max_tokens,
                          max_retries=args.max_retries, timeout_s=args.timeout, prices=prices)
    out = args.out or Path("runs") / "llm" / re.sub(r"[^\w.-]+", "_", f"{args.model}-{args.backend}")
    try:
        rows = run(agent, family_list(args.families), args.episodes, backend=args.backend, out=out,
                   concurrency=args.concurrency, seed=args.seed, resume=args.resume,
                   overrides={"env": {"max_jobs_per_episode": args.max_jobs}} if args.max_jobs > 1 else None)
    except ResumeMismatch as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print((out / "results.md").read_text(), end="")  # the same title and table as results.md and results.png
    print(f"results: {out}/results.md, results.json, results.png, episodes.jsonl (hidden_seeds {seeds.label})",
          file=sys.stderr)
    if not rows["all"]["kept"]:
        status = ", ".join(f"{k} {v}" for k, v in sorted(rows["all"]["status"].items()))
        print(f"error: no episode was scored ({status}): nothing measured the agent; the episodes' errors are "
              f"in {out}/episodes.jsonl (check --base-url, --model and the API key in ${args.api_key_env})",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    # the canonical module's main, not this __main__ copy's: one class object per exception and type
    from ait_env.extras import missing_extras_exit

    with missing_extras_exit("python -m ait_env.agents.llm"):  # a missing extra: one line, exit 3
        from ait_env.agents.llm import main as _main
        from ait_env.processes import sigterm_as_exit

        with sigterm_as_exit():  # a SIGTERM stops the running jobs too, not only this process
            raise SystemExit(_main())
