"""The LLM agent runner against scripted OpenAI-compatible servers on 127.0.0.1: a competent agent scores
above a careless one on every training family, costs add up against the ledger, transient endpoint
errors are retried without failing episodes, an endpoint without tool support is driven in text mode,
and an endpoint that keeps failing ends episodes as endpoint_failed (dropped, never scored)."""

from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("openai")
pytest.importorskip("verifiers")

from ait_env.agents.llm import AgentSettings, family_list, run  # noqa: E402
from ait_env.agents.llm.cli import main  # noqa: E402
from ait_env.observe.metrics import Prices  # noqa: E402
from ait_env.observe.ledger import CostLedger  # noqa: E402
from tests.fakes.job_writer import job_writer_policy  # noqa: E402
from tests.fakes.openai_server import DropConnection, PolicyHTTPError, ScriptedOpenAIServer  # noqa: E402

LARGER, SMALL = "Qwen/Qwen3-1.7B", "Qwen/Qwen3-0.6B"
PRICES = Prices(prefill=1.0, cached_prefill=1.0, sample=2.0, as_of="test", source="test")


def scripted(careless: bool) -> Any:
    """Reads job.toml, checks the baselines, writes the reference job and submits (careless: the small
    model and an invalid batch size first, then the fix); native tool calls exactly when offered."""
    return job_writer_policy(structured=None, careless=careless)


def _agent(server: ScriptedOpenAIServer, **kw: Any) -> AgentSettings:
    return AgentSettings(base_url=server.base_url, model="scripted", prices=PRICES, max_retries=kw.pop("retries", 6),
                         **kw)


def _run(policy: Any, tmp_path: Path, families: list[str], episodes: int = 1, **kw: Any) -> tuple[dict, Path, Any]:
    with ScriptedOpenAIServer(policy) as server:
        out = tmp_path / "out"
        rows = run(_agent(server, **kw), families, episodes, backend="stub", out=out, concurrency=2,
                   log=lambda _: None)
        return rows, out, server


@pytest.mark.slow  # every training family; the default suite keeps two: test_costs_add_up_against_the_ledger...
def test_a_competent_agent_scores_above_a_careless_one_on_every_training_family(tmp_path):
    train = family_list("train")
    good, _, _ = _run(scripted(careless=False), tmp_path / "good", train)
    bad, _, _ = _run(scripted(careless=True), tmp_path / "bad", train)
    for fam in train:
        assert good[fam]["status"] == {"scored": 1} and bad[fam]["status"] == {"scored": 1}, (good[fam], bad[fam])
        assert good[fam]["mean_reward"] > bad[fam]["mean_reward"], fam
        assert good[fam]["model_share"][LARGER] == 1.0 and bad[fam]["model_share"][SMALL] == 1.0
    assert good["all"]["validation_rate"] == bad["all"]["validation_rate"] == 1.0
    assert good["all"]["mean_turns"] == 4 and bad["all"]["mean_turns"] == 6


def test_costs_add_up_against_the_ledger_and_every_file_is_written(tmp_path):
    rows, out, server = _run(scripted(careless=False), tmp_path, ["arithmetic", "units"], episodes=2)
    ledger = CostLedger(out / "runs" / "costs.jsonl")
    llm = [r for r in ledger.records() if r.kind == "llm"]
    assert len(llm) == server.n_requests == 16
    assert rows["all"]["llm_usd"] + rows["all"]["job_usd"] == pytest.approx(ledger.spent())
    assert rows["all"]["tokens_in"] == sum(r.tokens_in for r in llm) > 0
    assert all(r.meta["prices_as_of"] == "test" for r in llm)
    episodes = [json.loads(x) for x in (out / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 4 and {e["family"] for e in episodes} == {"arithmetic", "units"}
    assert "| arithmetic | 2 (2) |" in (out / "results.md").read_text()
    assert json.loads((out / "results.json").read_text())["rows"]["all"]["kept"] == 4
    assert (out / "results.png").stat().st_size > 0


def test_rate_limits_and_dropped_connections_are_retried_without_failing_episodes(tmp_path):
    """Every request is first refused with a 429, then its connection dropped, then answered."""
    inner = scripted(careless=False)
    attempts: Counter[str] = Counter()
    lock = threading.Lock()

    def flaky(messages: list[dict[str, Any]], tools: list[Any]) -> dict[str, Any]:
        key = json.dumps(messages, sort_keys=True)
        with lock:
            attempts[key] += 1
            n = attempts[key]
        if n == 1:
            raise PolicyHTTPError(429, "rate limited")
        if n == 2:
            raise DropConnection()
        return inner(messages, tools)

    rows, _, server = _run(flaky, tmp_path, ["arithmetic", "persona"], episodes=2)
    assert rows["all"]["status"] == {"scored": 4} and rows["all"]["kept"] == 4
    assert server.status_counts[429] == server.status_counts[0] == server.status_counts[200] == 16


def test_an_endpoint_without_tool_support_is_driven_in_text_mode(tmp_path):
    inner = scripted(careless=False)

    def no_tools(messages: list[dict[str, Any]], tools: list[Any]) -> dict[str, Any]:
        if tools:
            raise PolicyHTTPError(400, '"auto" tool choice requires --enable-auto-tool-choice')
        return inner(messages, tools)

    rows, out, _ = _run(no_tools, tmp_path, ["inventory"])
    assert rows["inventory"]["status"] == {"scored": 1}
    assert json.loads((out / "episodes.jsonl").read_text())["tool_mode"] == "text"


def test_an_endpoint_that_keeps_failing_ends_episodes_unscored(tmp_path):
    def down(messages: list[dict[str, Any]], tools: list[Any]) -> dict[str, Any]:
        raise PolicyHTTPError(503, "overloaded")

    rows, _, _ = _run(down, tmp_path, ["arithmetic"], episodes=2, retries=1)
    assert rows["all"]["status"] == {"endpoint_failed": 2}
    assert rows["all"]["kept"] == 0 and rows["all"]["mean_reward"] is None


def test_the_command_line_fails_when_no_episode_was_scored(tmp_path, capsys):
    def down(messages: list[dict[str, Any]], tools: list[Any]) -> dict[str, Any]:
        raise PolicyHTTPError(503, "overloaded")

    with ScriptedOpenAIServer(down) as server:
        code = main(["--base-url", server.base_url, "--model", "scripted", "--families", "arithmetic",
                     "--episodes", "1", "--max-retries", "0", "--out", str(tmp_path / "cli")])
    err = capsys.readouterr().err
    assert code == 1, err[-1000:]
    assert "no episode was scored (endpoint_failed 1)" in err


def _rows(**per_family: tuple[int, float, float | None]) -> dict[str, Any]:
    return {name: {"kept": kept, "mean_reward": mean, "ci95": ci} for name, (kept, mean, ci) in per_family.items()}


def test_the_chart_draws_no_interval_for_one_episode_and_its_whole_title():
    import matplotlib.pyplot as plt

    from ait_env.agents.llm import chart_figure, results_title

    title = results_title("a-rather-long/model-name-Instruct-2507-FP8", "stub", True)
    fig = chart_figure(_rows(arithmetic=(1, 0.61, None), units=(3, 0.5, 0.12), all=(4, 0.53, 0.1)), title)
    try:
        fig.canvas.draw()
        ax = fig.axes[0]
        box, renderer = fig.bbox, fig.canvas.get_renderer()
        shown = ax.title.get_window_extent(renderer)
        assert box.x0 - 0.5 <= shown.x0 and shown.x1 <= box.x1 + 0.5, "the title is cut off"
        assert ax.title.get_text().replace("\n", " ") == title and "SURROGATE" in title
        whiskers = [seg for c in ax.collections for seg in c.get_segments()]
        assert len(whiskers) == 2, "two bars have a CI, the one-episode bar has none"
        assert all(abs(seg[1][1] - seg[0][1]) > 1e-9 for seg in whiskers), "a zero-width CI bar"
        notes = {t.get_text() for t in ax.texts}
        assert {"n=1, no CI", "n=3", "n=4"} <= notes
    finally:
        plt.close(fig)


def test_the_command_line(tmp_path, capsys):
    with ScriptedOpenAIServer(scripted(careless=False)) as server:
        assert main(["--base-url", server.base_url, "--model", "scripted", "--families", "calendar",
                     "--episodes", "1", "--out", str(tmp_path / "cli"), "--price-in", "1", "--price-out", "2",
                     "--prices-as-of", "2026-12-01"]) == 0
    out = capsys.readouterr().out
    assert "| calendar | 1 (1) |" in out
    # stdout shows results.md: one title, with the surrogate label of the stub backend
    assert "[1/1 " in out and "scored (SURROGATE: stub backend's formula, nothing trained) reward" in out
    table = out[out.index("# "):]
    assert table.splitlines()[0] == "# scripted as a trainer agent (stub backend, SURROGATE scores)"
    assert table == (tmp_path / "cli" / "results.md").read_text()
    with pytest.raises(SystemExit, match="prices-as-of"):
        main(["--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--price-in", "1"])


def test_the_example_plays_an_episode(tmp_path):
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    with ScriptedOpenAIServer(scripted(careless=False)) as server:
        out = subprocess.run([sys.executable, str(repo / "examples" / "llm_agent.py"), "--base-url", server.base_url,
                              "--model", "scripted", "--family", "persona", "--runs-dir", str(tmp_path / "runs")],
                             capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "episode 0: status=scored" in out.stdout, out.stdout


def test_a_run_cut_short_resumes_from_its_finished_episodes_and_refuses_other_settings(tmp_path, capsys):
    from ait_env.agents.llm import ResumeMismatch

    out = tmp_path / "out"
    with ScriptedOpenAIServer(scripted(careless=False)) as server:
        run(_agent(server), ["arithmetic", "units"], 1, backend="stub", out=out, concurrency=2, log=lambda _: None)
        first = (out / "episodes.jsonl").read_text().splitlines()
        assert len(first) == 2 and server.n_requests == 8
        # a kill tore the last line: that episode is played again, the other one is kept as it was
        (out / "episodes.jsonl").write_text(first[0] + "\n" + first[1][: len(first[1]) // 2])
        logs: list[str] = []
        rows = run(_agent(server), ["arithmetic", "units"], 2, backend="stub", out=out, concurrency=2,
                   log=logs.append, resume=True)
        assert server.n_requests == 8 + 3 * 4                         # 3 episodes played, not 4
        assert any(line.startswith("[resume] 1 of 4 episodes") for line in logs)
        lines = (out / "episodes.jsonl").read_text().splitlines()
        assert lines[0] == first[0] and len(lines) == 4
        assert rows["all"]["kept"] == 4 and sorted(rows) == ["all", "arithmetic", "units"]
        assert json.loads((out / "results.json").read_text())["rows"]["all"]["kept"] == 4
        # other settings in --out are refused, saying which; without --resume the run starts again
        with pytest.raises(ResumeMismatch, match="temperature"):
            run(_agent(server, temperature=0.2), ["arithmetic"], 1, backend="stub", out=out, log=lambda _: None,
                resume=True)
        assert main(["--base-url", server.base_url, "--model", "scripted", "--families", "arithmetic",
                     "--episodes", "1", "--out", str(out), "--temperature", "0.2", "--resume"]) == 2
        assert "other settings" in capsys.readouterr().err
        before = server.n_requests
        run(_agent(server, temperature=0.2), ["arithmetic"], 1, backend="stub", out=out, log=lambda _: None)
        assert server.n_requests == before + 4 and len((out / "episodes.jsonl").read_text().splitlines()) == 1
