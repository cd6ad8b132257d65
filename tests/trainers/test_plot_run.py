"""trainers/plot_run.py renders every chart from a recorded metrics.jsonl (see fixtures/README.md)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")
from trainer_fixtures import plot_run  # noqa: F401  (fixture)

FIXTURE = Path(__file__).parent / "fixtures" / "metrics.jsonl"
CHARTS = {"reward", "post", "heldout", "model_share", "adoption", "cost", "status_mix"}


@pytest.mark.parametrize("fmt", ["png", "svg"])
def test_renders_every_chart(plot_run, tmp_path, fmt):
    written = plot_run.render(FIXTURE, tmp_path / "charts", fmt)
    assert {p.stem for p in written} == CHARTS
    for p in written:
        assert p.suffix == f".{fmt}" and p.stat().st_size > 1000


def test_series_merge_train_and_eval_rows(plot_run):
    s = plot_run.load_series(FIXTURE)
    assert [x for x, _ in s["env/all/ait/reward"]] == list(range(8))
    assert [x for x, _ in s["test/env/heldout/ait/reward"]] == [0, 2, 4, 6, 8]
    shares = [v for k, pts in s.items() if k.startswith("env/all/ait/model/") for x, v in pts if x == 0]
    assert sum(shares) == pytest.approx(1.0)


def test_cli_on_a_run_dir(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(FIXTURE, run / "metrics.jsonl")
    script = Path(__file__).resolve().parents[2] / "trainers" / "plot_run.py"
    p = subprocess.run([sys.executable, str(script), str(run)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert len(list((run / "charts").glob("*.png"))) == len(CHARTS)
    bad = subprocess.run([sys.executable, str(script), str(tmp_path / "nope")], capture_output=True, text=True)
    assert bad.returncode == 2 and "metrics.jsonl" in bad.stderr


def test_a_two_step_run_has_integer_ticks_and_legends_below_the_charts(plot_run, tmp_path):
    import matplotlib.pyplot as plt

    rows = [line for line in FIXTURE.read_text().splitlines() if line.strip()]
    two = tmp_path / "metrics.jsonl"
    two.write_text("\n".join(r for r in rows if json.loads(r).get("step") in (0, 1)) + "\n")
    charts = plot_run.figures(plot_run.load_series(two))
    assert {"reward", "status_mix"} <= set(charts)
    for name, fig in charts.items():
        fig.canvas.draw()
        ax = fig.axes[0]
        lo, hi = ax.get_xlim()
        ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
        assert ticks and all(float(t).is_integer() for t in ticks), (name, ticks)
        renderer = fig.canvas.get_renderer()
        legend, frame = fig.legends[0].get_window_extent(renderer), ax.get_window_extent(renderer)
        assert legend.y1 <= frame.y0, name  # below the axes, never over the bars
        plt.close(fig)


def test_a_labelled_run_has_its_label_on_every_chart_and_skips_are_one_line(plot_run, tmp_path):
    """A surrogate or dry run says so on every chart, also when the charts are drawn later from its folder;
    charts without metrics are named once at the end, not one stderr line each."""
    import matplotlib.pyplot as plt

    from ait_env.observe.plots import run_label, write_run_label

    run = tmp_path / "run"
    run.mkdir()
    rows = [json.loads(x) for x in FIXTURE.read_text().splitlines() if x.strip()]
    (run / "metrics.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if not k.startswith("test/")})
                                               + "\n" for r in rows))
    label = run_label(surrogate=True, backend="stub", dry_run=True)
    write_run_label(run, label)
    figs = plot_run.figures(plot_run.load_series(run / "metrics.jsonl"), label=label)
    try:
        assert figs and all(f._suptitle is not None and f._suptitle.get_text() == label for f in figs.values())
    finally:
        for f in figs.values():
            plt.close(f)
    assert "heldout" in plot_run.SKIPPED and "cache" in plot_run.SKIPPED
    script = Path(__file__).resolve().parents[2] / "trainers" / "plot_run.py"
    p = subprocess.run([sys.executable, str(script), str(run)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stderr.strip().splitlines() == ["not drawn (no such metrics in this run): heldout, research, research_gain, cache"], p.stderr
    write_run_label(run, None)
    assert not (run / "run_label.txt").exists()
