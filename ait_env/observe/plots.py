"""Charts (matplotlib, headless): the conventions every chart of the project follows, and the chart of
one inner training job.

Conventions (:func:`step_figure`, :func:`finish_figure`, :func:`save_figure`): the x axis counts steps,
so its ticks are integers (a 2-step run shows 0 and 1, not 0.0, 0.2, ...); the legend stands below
the axes, so it never covers data (bars, points); a series says in its label what it measured, and two
measurements of different things never share a label. ``trainers/plot_run.py`` draws the outer-loop
charts with them.

A run that measured nothing real says so on every chart (``step_figure(..., label=...)``: a red line
above the title). A trainer writes that label once in its run folder (:func:`write_run_label`:
``SURROGATE scores`` for a stub backend, ``DRY RUN`` for Tinker's offline loop); ``trainers/plot_run.py``
reads it (:func:`read_run_label`), so charts drawn later from the same ``metrics.jsonl`` carry it too.

The job chart (:func:`plot_job_curves`) shows the training reward per GRPO step and the hidden-eval
scores the backend recorded (``curves["eval_step"]`` / ``curves["eval_score"]``). The local backend
records the untrained base model's score at step 0 and the post-training score at the last step, both
on the full hidden set, and between them curve points on a subset of it (the first ``eval_subset``
questions): the three are drawn and labelled apart. matplotlib is imported on first use.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ait_env.jobs.result import JobResult

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


#: the file in a run folder that holds the label of a run that measured nothing real (one line)
RUN_LABEL_FILE = "run_label.txt"


def run_label(*, surrogate: bool = False, backend: str = "stub", dry_run: bool = False,
              hidden_seeds: str = "") -> str | None:
    """The label of a run's outputs: None for a real run on this installation's private hidden-eval seeds
    (``hidden_seeds``: :attr:`ait_env.hidden.secrets.HiddenSeeds.label`; ``published``: a public hidden eval)."""
    parts = (["DRY RUN: a scripted policy, nothing learns, no LLM billed"] if dry_run else []) + \
        ([f"SURROGATE scores ({backend} backend's formula, nothing trained)"] if surrogate else []) + \
        (["PUBLISHED hidden-eval seeds (a public hidden eval: for reproduction only)"]
         if hidden_seeds == "published" else [])
    return "; ".join(parts) or None


def write_run_label(run_dir: str | Path, label: str | None) -> None:
    """Record ``label`` in ``run_dir`` (remove a stale one when None)."""
    path = Path(run_dir) / RUN_LABEL_FILE
    if label:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(label + "\n", encoding="utf-8")
    else:
        path.unlink(missing_ok=True)


def read_run_label(run_dir: str | Path) -> str | None:
    """The label :func:`write_run_label` left in ``run_dir``, or None."""
    path = Path(run_dir) / RUN_LABEL_FILE
    return (path.read_text(encoding="utf-8").strip() or None) if path.is_file() else None


def step_figure(title: str, ylabel: str, xlabel: str = "training step", *,
                label: str | None = None) -> tuple[Figure, Axes]:
    """A new figure with one axes whose x axis counts steps (integer ticks); ``label`` (a run that measured
    nothing real) is drawn in red above the title."""
    from matplotlib.ticker import MaxNLocator

    fig, ax = _pyplot().subplots(figsize=(8, 4), dpi=120, layout="constrained")
    if label:
        fig.suptitle(label, color="tab:red", fontsize=9, fontweight="bold")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def finish_figure(fig: Figure) -> None:
    """After drawing: a step axis spans at least 1.2 steps (so that a one-step chart gets its integer
    tick), and the legend goes below the axes (constrained layout makes room)."""
    for ax in fig.axes:
        lo, hi = ax.get_xlim()
        if hi - lo < 1.2:
            mid = (lo + hi) / 2
            ax.set_xlim(mid - 0.6, mid + 0.6)
    labels = [label for ax in fig.axes for label in ax.get_legend_handles_labels()[1]]
    if labels:
        widest = max(len(label) for label in labels)
        per_row = 3 if widest <= 28 else 2 if widest <= 60 else 1  # columns that fit the figure's width
        fig.legend(loc="outside lower center", ncols=min(len(labels), per_row), fontsize=8)


def save_figure(fig: Figure, path: str | Path) -> Path:
    """Write ``fig`` to ``path`` (PNG or SVG by suffix; folders created) and close it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    _pyplot().close(fig)
    return path


def _n(size: int | None) -> str:
    return f"{size} questions" if size else ""


def job_curves_figure(result: JobResult, title: str = "", *, full_size: int | None = None,
                      subset_size: int | None = None) -> Figure | None:
    """The finished job chart (see the module docstring); None when the result has no curves.

    ``full_size`` / ``subset_size``: how many hidden questions the full eval and the curve points
    scored, named in the labels when given."""
    curves = result.curves or {}
    reward = curves.get("train_reward") or []
    eval_steps = curves.get("eval_step") or []
    eval_score = curves.get("eval_score") or []
    if len(eval_steps) != len(eval_score):
        eval_steps = [float(i) for i in range(len(eval_score))]
    if not reward and not eval_score:
        return None
    tag = " [SURROGATE]" if result.surrogate else ""
    fig, ax = step_figure((title or f"job {result.job_id}") + tag, "score / reward", xlabel="GRPO step")
    if reward:
        ax.plot(range(1, len(reward) + 1), reward, color="tab:blue", alpha=0.8,
                label="training reward (batch mean)")
    points = list(zip(eval_steps, eval_score))
    full = ", ".join(filter(None, ["full hidden set", _n(full_size)]))
    if points and result.surrogate:
        ax.plot(*zip(*points), "o-", color="tab:red", label="surrogate score (a formula, nothing measured)")
        points = []
    if points and points[0][0] == 0:
        (x, y), points = points[0], points[1:]
        ax.plot([x], [y], "s", color="tab:green", ms=7, label=f"untrained base model ({full})")
    post = None
    if points and result.post_score is not None and points[-1][1] == result.post_score:
        post, points = points[-1], points[:-1]
    if points:
        subset = "hidden-eval subset" + (f" (first {subset_size} questions)" if subset_size else "")
        ax.plot(*zip(*points), "o--", color="tab:red", alpha=0.8, label=f"during training: {subset}")
    if post is not None:
        ci = result.post_ci95 or 0.0
        ax.errorbar([post[0]], [post[1]], yerr=[ci] if ci else None, fmt="D", color="darkred", ms=7,
                    capsize=3, label=f"after training ({full})" + (" ± 95% CI" if ci else ""))
    if result.baselines:
        best = max(result.baselines.values())
        ax.axhline(best, color="grey", ls="--", lw=1, label=f"best untrained baseline ({best:.2f})")
    ax.set_ylim(-0.02, 1.02)
    finish_figure(fig)
    return fig


def plot_job_curves(result: JobResult, path: str | Path, title: str = "", *, full_size: int | None = None,
                    subset_size: int | None = None) -> Path | None:
    """Write the job chart to ``path`` (PNG or SVG by suffix); returns None when the result has no curves."""
    fig = job_curves_figure(result, title, full_size=full_size, subset_size=subset_size)
    return None if fig is None else save_figure(fig, path)
