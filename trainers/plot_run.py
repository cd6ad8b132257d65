"""Charts of an outer-loop run (Tinker or the local trainer) from its ``metrics.jsonl``.

    python trainers/plot_run.py runs/tinker/7b                 # writes runs/tinker/7b/charts/*.png
    python trainers/plot_run.py path/to/metrics.jsonl --out charts/ --format svg

Contract: reads the cookbook's ``metrics.jsonl`` (one JSON object per line with ``step``; training rows
carry ``env/all/...``, evaluation rows ``test/env/...``; rows may share a step) and writes one file per
chart, skipping a chart whose metrics are absent (the command line names them in one line at the end):

- ``reward``: batch reward per step (``env/all/ait/reward``) with the validation rate;
- ``post``: post-training hidden-eval score and uplift per step (scored jobs);
- ``heldout``: evaluation arm means at checkpoints (``test/env/heldout`` vs ``test/env/train``);
- ``model_share``: share of validated jobs per base model (``env/all/ait/model/*``);
- ``adoption``: ``[prime_rl]`` surface adoption (any field changed / a field beyond the template);
- ``status_mix``: job status mix per step (stacked) and the infra-dropped share;
- ``cost``: LLM USD and tokens per episode;
- ``cache``: the share of jobs served from the job result cache (the local outer loop);
- ``research``: research episodes (``env.max_jobs_per_episode > 1``): jobs per episode, the share of the
  dispatches that ran several jobs at once (``submit_jobs``), the share where a later job beat the first;
- ``research_gain``: the best job's reward minus the first job's, the post-score gain, and the research charge.

Every chart follows :mod:`ait_env.observe.plots`' conventions: integer step ticks, the legend below the axes, and
the run folder's label (``run_label.txt``: a surrogate backend's scores, a dry run) in red above the title.
Returns (and prints) the written paths. Uses matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

from ait_env.extras import require
from ait_env.observe.plots import finish_figure, read_run_label, save_figure, step_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

STATUSES = ("scored", "job_failed", "invalid", "unparsable", "aborted")
#: the charts the last :func:`figures` call left out (none of their metrics in the run)
SKIPPED: list[str] = []


def load_series(path: Path) -> dict[str, list[tuple[int, float]]]:
    """key -> [(step, value)] sorted by step (the last value wins when a step repeats a key)."""
    by_key: dict[str, dict[int, float]] = defaultdict(dict)
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line
        step = row.get("step")
        if step is None:
            continue
        for k, v in row.items():
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                by_key[k][int(step)] = float(v)
    return {k: sorted(d.items()) for k, d in by_key.items()}


def _xy(series: dict[str, list[tuple[int, float]]], key: str) -> tuple[list[int], list[float]]:
    pts = series.get(key, [])
    return [p[0] for p in pts], [p[1] for p in pts]


def figures(series: dict[str, list[tuple[int, float]]], source: str = "metrics",
            label: str | None = None) -> dict[str, Figure]:
    """One finished figure per chart whose metrics are present (see the module docstring); ``label`` (a
    surrogate or dry run, :func:`ait_env.observe.plots.read_run_label`) goes on every one. The charts left out for
    want of metrics are in :data:`SKIPPED` (their names), not printed."""
    out: dict[str, Figure] = {}
    SKIPPED.clear()

    def chart(name: str, title: str, lines: list[tuple[str, str]], ylabel: str, *, marker: str = "o",
              ylim: tuple[float, float] | None = None) -> None:
        present = [(k, text) for k, text in lines if series.get(k)]
        if not present:
            SKIPPED.append(name)
            return
        fig, ax = step_figure(title, ylabel, label=label)
        for k, text in present:
            x, y = _xy(series, k)
            ax.plot(x, y, marker=marker, label=text)
        if ylim:
            ax.set_ylim(*ylim)
        finish_figure(fig)
        out[name] = fig

    chart("reward", "Batch reward per step", [("env/all/ait/reward", "mean episode reward"),
                                               ("env/all/ait/validated", "validation rate")], "value")
    chart("post", "Trained model's hidden-eval score (scored jobs)",
          [("env/all/ait/post", "post score"), ("env/all/ait/best_pre", "best untrained baseline"),
           ("env/all/ait/uplift", "uplift")], "score")
    if series.get("test/env/heldout/ait/reward"):
        arms = [("test/env/heldout/ait/reward", "held-out reward"),
                ("test/env/train/ait/reward", "train-family reward"),
                ("test/env/heldout/ait/post", "held-out post score"),
                ("test/env/train/ait/post", "train-family post")]
    else:  # no comparison arm: the cookbook reports a tag shared by every group only under env/all
        arms = [("test/env/all/ait/reward", "held-out reward"),
                ("test/env/all/ait/post", "held-out post score")]
    chart("heldout", "Evaluation at checkpoints: held-out vs training families", arms, "value", marker="s")
    models = sorted(k for k in series if k.startswith("env/all/ait/model/"))
    chart("model_share", "Base model chosen (share of validated jobs)",
          [(k, k.rsplit("/", 1)[-1]) for k in models], "share", ylim=(0, 1.05))
    chart("adoption", "[prime_rl] surface adoption (validated jobs)",
          [("env/all/ait/surface/adopted", "changed any field from the template"),
           ("env/all/ait/surface/beyond_template", "set a field the template does not show")], "share",
          ylim=(0, 1.05))
    chart("cost", "Cost per episode", [("env/all/ait/llm_usd", "LLM USD per episode (estimate)"),
                                        ("env/all/ait/job_usd", "job USD per episode")], "USD")
    chart("research", "Research episodes: jobs and batches",
          [("env/all/ait/jobs", "jobs per episode"), ("env/all/ait/batch_share", "share of dispatches that were batches"),
           ("env/all/ait/later_job_best", "a later job beat the first")], "value")
    chart("research_gain", "Research episodes: best job vs first job",
          [("env/all/ait/best_vs_first", "best job's reward − first job's"),
           ("env/all/ait/post_gain", "best job's post − first job's"), ("env/all/ait/charge", "research charge")],
          "reward / score")
    chart("cache", "Jobs served from the job result cache", [("env/all/ait/cache_hit", "share of the jobs run")],
          "share", ylim=(0, 1.05))

    keys = [f"env/all/ait/status/{s}" for s in STATUSES]
    if not any(series.get(k) for k in keys):
        SKIPPED.append("status_mix")
    else:
        steps = sorted({s for k in keys for s, _ in series.get(k, [])})
        fig, ax = step_figure("Job status mix per step", "share of kept episodes", label=label)
        bottom = [0.0] * len(steps)
        for s, k in zip(STATUSES, keys):
            vals = dict(series.get(k, []))
            ys = [vals.get(st, 0.0) for st in steps]
            ax.bar(steps, ys, bottom=bottom, label=s)
            bottom = [b + y for b, y in zip(bottom, ys)]
        x, y = _xy(series, "env/all/ait/infra_dropped_frac")
        if x:
            ax.plot(x, y, color="black", marker="x", label="infra_failed (dropped)")
        finish_figure(fig)
        out["status_mix"] = fig
    return out


def render(metrics: Path, out_dir: Path, fmt: str = "png") -> list[Path]:
    """Write every chart of ``metrics`` as ``<out_dir>/<chart>.<fmt>``, labelled as the run folder's
    :func:`ait_env.observe.plots.read_run_label` says; returns the written paths."""
    charts = figures(load_series(metrics), str(metrics), read_run_label(metrics.parent))
    return [save_figure(fig, out_dir / f"{name}.{fmt}") for name, fig in charts.items()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a run directory (with metrics.jsonl) or a metrics.jsonl file")
    ap.add_argument("--out", type=Path, default=None, help="output folder (default: <run dir>/charts)")
    ap.add_argument("--format", choices=("png", "svg"), default="png")
    args = ap.parse_args(argv)
    metrics = args.run / "metrics.jsonl" if args.run.is_dir() else args.run
    if not metrics.is_file():
        print(f"error: {metrics} not found; pass a run directory (runs/tinker/<pilot>) or its metrics.jsonl",
              file=sys.stderr)
        return 2
    out = args.out or metrics.parent / "charts"
    require("trainers/plot_run.py", "local", "matplotlib")
    written = render(metrics, out, args.format)
    for p in written:
        print(p)
    if SKIPPED:  # one line, not one per chart: a run without evaluations or a cache is normal
        print(f"not drawn (no such metrics in this run): {', '.join(SKIPPED)}", file=sys.stderr)
    return 0 if written else 1


if __name__ == "__main__":
    raise SystemExit(main())
