"""A run's results: the table per family and overall (:func:`summarize`), as markdown and as a chart, under one
title (:func:`results_title`: the model, the backend, ``SURROGATE scores`` on the stub backend)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from ait_env.agents.llm.episode import KEPT, EpisodeRecord
from ait_env.observe.metrics import fill_model_share, mean_ci, model_key


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
