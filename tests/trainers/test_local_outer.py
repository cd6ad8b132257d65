"""trainers/local_outer.py on the stub backend (seconds): the Tinker trainer's metric keys and charts, a
summary of first vs last quarter, a rerun from the warm job cache with identical metrics, and a control
(policy_lr=0) whose policy never moves."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from trainer_fixtures import compose_config, load_script

from ait_env.agents.slot_policy import SLOTS, SlotPolicy, job_files, slots_for
from ait_env.jobs.schema import parse_job

pytest.importorskip("verifiers")


@pytest.fixture(scope="module")
def local_outer():
    return load_script("local_outer")


def _cfg(*overrides: str):
    return compose_config("local_outer", *overrides)


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_every_slot_choice_writes_a_parsable_job():
    slots = slots_for(["ait-tiny-s", "ait-tiny-m"])
    for s in slots:
        for i in range(len(s.choices)):
            choice = {t.name: 0 for t in slots} | {s.name: i}
            files = job_files("arithmetic", slots, choice, "local")
            job, issues = parse_job(files["job.toml"])
            assert job is not None, (s.name, i, issues)
    assert {s.name for s in SLOTS} == {"lr", "max_steps", "temperature", "batch_group", "loss", "algo", "rubric",
                                        "difficulty"}


def test_the_policy_moves_toward_what_scored_better():
    slots = slots_for(["small", "large"])
    policy = SlotPolicy(slots, lr=0.5, seed=0)
    before = policy.probs("base_model")[1]
    for _ in range(10):
        choices = [policy.sample() for _ in range(8)]
        rewards = [1.0 if c["base_model"] == 1 else 0.0 for c in choices]
        mean = sum(rewards) / len(rewards)
        policy.update(choices, [r - mean for r in rewards])
    assert policy.probs("base_model")[1] > max(0.9, before)


def test_smoke_run_metrics_summary_charts_and_a_cached_rerun(local_outer, tmp_path):
    base = ("+pilot=local_smoke", f"run_dir={tmp_path}", "pilot.steps=2")
    out = local_outer.run(_cfg(*base))
    rows = _rows(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1]
    for key in ("env/all/ait/reward", "env/all/ait/validated", "env/all/ait/status/scored", "env/all/ait/cache_hit",
                "env/all/ait/model/Qwen3-1.7B", "env/all/ait/surface/adopted", "policy/entropy", "policy/lr/3e-06"):
        assert key in rows[0], key
    summary = json.loads((out / "summary.json").read_text())
    assert summary["first"]["episodes"] == 8 and summary["last"]["episodes"] == 8
    assert (out / "charts" / "reward.png").is_file() and (out / "charts" / "model_share.png").is_file()
    # the stub's scores are a formula: the run folder says so, and so every chart drawn from it
    assert (out / "run_label.txt").read_text().startswith("SURROGATE scores (stub backend's formula")
    episodes = _rows(out / "episodes.jsonl")
    assert len(episodes) == 16 and all(e["reward"] is not None for e in episodes)
    # the same command again: every job is served from the run's cache, and the metrics are the same
    again = local_outer.run(_cfg(*base, "charts=false"))   # charts=false: no charts drawn
    rows2 = _rows(again / "metrics.jsonl")
    assert all(r["env/all/ait/cache_hit"] == 1.0 for r in rows2)
    strip = lambda r: {k: v for k, v in r.items() if not k.startswith("time/") and k != "env/all/ait/cache_hit"}  # noqa: E731
    assert [strip(r) for r in rows2] == [strip(r) for r in rows]


def test_the_control_policy_never_moves(local_outer, tmp_path):
    # the policy's logic, not validation (the smoke test above runs the probe): no sandboxed probe stage
    out = local_outer.run(_cfg("+pilot=local_smoke", f"run_dir={tmp_path}", "pilot.steps=2", "pilot.policy_lr=0", "charts=false",
                               "env.probe.enabled=false"))
    rows = _rows(out / "metrics.jsonl")
    assert all(abs(r["policy/base_model/Qwen/Qwen3-1.7B"] - 0.5) < 1e-12 for r in rows)
    assert not (out / "charts").exists()                  # charts=false


def test_a_tinker_pilot_is_refused(local_outer, tmp_path):
    with pytest.raises(SystemExit, match="not a local outer-loop pilot"):
        local_outer.run(_cfg("+pilot=smoke", f"run_dir={tmp_path}"))


class _FakeRun:
    def __init__(self, **kwargs):
        self.init = kwargs
        self.logged: list[tuple[int, dict]] = []
        self.finished = False

    def log(self, row, step):
        self.logged.append((step, dict(row)))

    def finish(self):
        self.finished = True


def test_rows_go_to_weights_and_biases_when_a_project_is_set(local_outer, tmp_path, monkeypatch):
    """A stand-in ``wandb`` module (the real one needs no account in offline mode, but is not installed here)."""
    import types

    runs: list[_FakeRun] = []
    fake = types.SimpleNamespace(init=lambda **kw: runs.append(_FakeRun(**kw)) or runs[-1])
    monkeypatch.setitem(sys.modules, "wandb", fake)
    out = local_outer.run(_cfg("+pilot=local_smoke", f"run_dir={tmp_path}", "pilot.steps=2", "wandb.project=ait", "charts=false",
                               "wandb.mode=offline", "env.probe.enabled=false"))  # the logger, not validation
    (run,) = runs
    assert run.init["project"] == "ait" and run.init["mode"] == "offline" and run.finished
    assert [s for s, _ in run.logged] == [0, 1]
    assert [r for _, r in run.logged] == _rows(out / "metrics.jsonl")  # the same rows: metrics.jsonl is the record


def test_a_project_without_wandb_installed_says_how_to_fix(local_outer, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(SystemExit, match="pip install wandb"):
        local_outer.run(_cfg("+pilot=local_smoke", f"run_dir={tmp_path}", "wandb.project=ait"))


def test_research_episodes_add_a_sweep_slot_that_runs_two_jobs_at_once(local_outer, tmp_path):
    """env.max_jobs_per_episode=2: the policy's sweep slot picks one job or a two-job lr sweep (submit_jobs),
    then finish; the metrics count the jobs, the batches and the best job's gain over the first."""
    from ait_env.agents.slot_policy import episode_jobs

    slots = slots_for(["Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B"], research=True)
    assert slots[-1].name == "sweep" and "sweep" not in {s.name for s in slots_for(["a"])}
    choice = {s.name: 0 for s in slots} | {"sweep": 1, "lr": 3}
    pair = episode_jobs("arithmetic", slots, choice, "stub")
    assert len(pair) == 2 and "lr = 3e-05" in pair[0]["job.toml"] and "lr = 3e-06" in pair[1]["job.toml"]
    # the sweep's bookkeeping, not validation (the smoke test above runs the probe): no sandboxed probe stage
    out = local_outer.run(_cfg("+pilot=local_smoke", f"run_dir={tmp_path}", "pilot.steps=2",
                               "env.max_jobs_per_episode=2", "env.probe.enabled=false"))
    rows = _rows(out / "metrics.jsonl")
    assert all("policy/sweep/lr_pair" in r and "env/all/ait/batch_share" in r for r in rows)
    episodes = _rows(out / "episodes.jsonl")
    pairs = [e for e in episodes if e["choice"]["sweep"] == "lr_pair" and e["reward"] is not None]
    singles = [e for e in episodes if e["choice"]["sweep"] == "single" and e["reward"] is not None]
    assert pairs and singles
    assert all(e["metrics"]["ait/end/finish"] == 1.0 for e in singles if e["dispatched"])
    ran = [e for e in pairs if e["dispatched"] == 2]
    assert ran and all(e["metrics"]["ait/jobs"] == 2 and e["metrics"]["ait/batch_share"] == 1.0 for e in ran)
    assert all("ait/best_vs_first" in e["metrics"] for e in ran)
    assert (out / "charts" / "research.png").is_file()
