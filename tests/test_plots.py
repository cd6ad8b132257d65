"""Charts say what they show (ait_env/observe/plots.py): distinct labels for different measurements, integer step
ticks, the legend outside the axes."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")

from ait_env.jobs.result import JobResult
from ait_env.observe.plots import job_curves_figure, plot_job_curves


def legend_labels(fig) -> list[str]:
    return [t.get_text() for t in fig.legends[0].get_texts()]


def assert_readable(fig) -> None:
    """Integer ticks inside the step range, and a legend that covers no part of the axes."""
    import matplotlib.pyplot as plt

    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    lo, hi = ax.get_xlim()
    ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks
    legend, frame = fig.legends[0].get_window_extent(renderer), ax.get_window_extent(renderer)
    assert legend.y1 <= frame.y0, (legend, frame)  # below the axes
    plt.close(fig)


def local_result(**kw) -> JobResult:
    curves = {"train_reward": [0.1, 0.2, 0.3, 0.35], "eval_step": [0.0, 2.0, 4.0],
              "eval_score": [0.3, 0.33, 0.4]}
    return JobResult(job_id="j1", backend="local", status="succeeded", post_score=0.4, post_ci95=0.05,
                     baselines={"ait-tiny-s": 0.3, "ait-tiny-m": 0.35}, curves=curves, **kw)


def test_subset_points_and_full_evals_have_their_own_labels():
    fig = job_curves_figure(local_result(), full_size=300, subset_size=100)
    labels = legend_labels(fig)
    assert len(labels) == len(set(labels)) == 5
    assert "untrained base model (full hidden set, 300 questions)" in labels
    assert "during training: hidden-eval subset (first 100 questions)" in labels
    assert "after training (full hidden set, 300 questions) ± 95% CI" in labels
    assert_readable(fig)


def test_a_two_step_job_has_integer_ticks():
    r = JobResult(job_id="j2", backend="local", status="succeeded", post_score=0.5,
                  curves={"train_reward": [0.2, 0.4], "eval_step": [0.0, 2.0], "eval_score": [0.3, 0.5]})
    fig = job_curves_figure(r)
    assert legend_labels(fig) == ["training reward (batch mean)", "untrained base model (full hidden set)",
                                  "after training (full hidden set)"]
    assert_readable(fig)


def test_surrogate_curves_say_so(tmp_path):
    r = JobResult(job_id="j3", backend="stub", status="succeeded", surrogate=True, post_score=0.6,
                  curves={"eval_step": [0.0, 1.0, 2.0], "eval_score": [0.3, 0.5, 0.6]})
    fig = job_curves_figure(r)
    assert legend_labels(fig) == ["surrogate score (a formula, nothing measured)"]
    assert "[SURROGATE]" in fig.axes[0].get_title()
    assert_readable(fig)
    assert plot_job_curves(r, tmp_path / "c.png").stat().st_size > 1000
    failed = JobResult(job_id="j4", backend="local", status="job_failed")
    assert plot_job_curves(failed, tmp_path / "x.png") is None
