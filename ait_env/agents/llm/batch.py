"""A run of many episodes (:func:`run`): ``episodes`` of each family, ``concurrency`` at a time on one shared
backend, each episode's record and transcript written as it ends, resumable (:class:`ResumeMismatch`), then the
results table, markdown and chart (the contract: :mod:`ait_env.agents.llm`)."""

from __future__ import annotations

import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import gymnasium as gym

import ait_env  # noqa: F401  (registers AIT/JobWriting-v0)
from ait_env.agents.llm.client import AgentSettings, make_client, redactor, served_model
from ait_env.agents.llm.episode import EpisodeRecord, play_episode, transcript, transcript_markdown
from ait_env.agents.llm.results import _fmt, chart, markdown, results_title, summarize
from ait_env.backends import Backend, make_backend
from ait_env.config import compose, split_families
from ait_env.hidden.secrets import hidden_seeds_label
from ait_env.observe.display import status_label
from task_families import FAMILY_NAMES


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
    client = make_client(agent)
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
