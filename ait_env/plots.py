"""Charts of one inner training job (matplotlib, headless): the training reward per GRPO step and the
hidden-eval score at the evaluated steps (step 0 = the untrained base), with the best untrained
baseline as a reference line."""

from __future__ import annotations

from pathlib import Path

from ait_env.backends.base import JobResult


def plot_job_curves(result: JobResult, path: str | Path, title: str = "") -> Path | None:
    """Write the chart to ``path`` (PNG or SVG by suffix); returns None when the result has no curves."""
    curves = result.curves or {}
    reward = curves.get("train_reward") or []
    eval_steps = curves.get("eval_step") or []
    eval_score = curves.get("eval_score") or []
    if len(eval_steps) != len(eval_score):
        eval_steps = list(range(len(eval_score)))
    if not reward and not eval_score:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    if reward:
        ax.plot(range(1, len(reward) + 1), reward, color="tab:blue", alpha=0.8, label="training reward (batch mean)")
    if eval_score:
        ax.plot(eval_steps, eval_score, "o-", color="tab:red", label="hidden-eval score")
    if result.baselines:
        best = max(result.baselines.values())
        ax.axhline(best, color="grey", ls="--", lw=1, label=f"best untrained baseline ({best:.2f})")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("score / reward")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    tag = " [SURROGATE]" if result.surrogate else ""
    ax.set_title((title or f"job {result.job_id}") + tag, fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
