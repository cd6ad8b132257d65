"""trainers/tinker_grpo.py: missing key, composed pilots, the cookbook Config it builds, and the whole
loop offline (train.main with the offline service): steps, evaluations, checkpoints, crash + resume,
warm start."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("tinker_cookbook", reason="install the outer-loop extra: pip install -e '.[tinker]'")
from trainer_fixtures import cache_dir, compose_cfg, tinker_grpo  # noqa: F401  (fixtures)

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "trainers" / "tinker_grpo.py"
FAST = ("env.probe.enabled=false", "pilot.eval.every=2")


def _env_without_key() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TINKER_API_KEY"}
    env["PYTHONPATH"] = str(REPO)
    return env


def test_missing_key_exits_at_once_with_what_to_do(tmp_path):
    t0 = time.time()
    p = subprocess.run([sys.executable, str(SCRIPT), "+pilot=smoke", f"run_dir={tmp_path / 'runs'}"], cwd=REPO,
                       env=_env_without_key(), capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and time.time() - t0 < 30
    assert "TINKER_API_KEY is not set" in p.stderr and "export TINKER_API_KEY=" in p.stderr
    assert "dry_run=true" in p.stderr and "scripts/main.sh" in p.stderr and "pilot.base_url" in p.stderr
    assert not (tmp_path / "runs").exists()  # nothing half-started


@pytest.mark.parametrize("pilot,model,steps", [("smoke", "Qwen/Qwen3-4B-Instruct-2507", 2),
                                               ("7", "Qwen/Qwen3.6-35B-A3B", 10),
                                               ("7b", "Qwen/Qwen3.6-35B-A3B", 24),
                                               ("7c", "Qwen/Qwen3.6-35B-A3B", 20)])
def test_cfg_job_prints_each_pilot(pilot, model, steps):
    p = subprocess.run([sys.executable, str(SCRIPT), f"+pilot={pilot}", "--cfg", "job"], cwd=REPO,
                       env=_env_without_key(), capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "pilot:" in p.stdout and f"model: {model}" in p.stdout and f"steps: {steps}" in p.stdout
    assert "max_steps_off_policy:" in p.stdout and "env:" in p.stdout and "reward:" in p.stdout


def test_7b_config_warm_starts_from_7(tinker_grpo, compose_cfg, tmp_path):
    prev = tmp_path / "7"
    prev.mkdir(parents=True)
    rows = [{"name": "000005", "batch": 5, "state_path": "tinker://r/state/000005"},
            {"name": "final", "batch": 10, "state_path": "tinker://r/state/final", "sampler_path": "tinker://r/s"}]
    (prev / "checkpoints.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = compose_cfg("+pilot=7b", f"run_dir={tmp_path}", "pilot.backend.name=stub")
    c = tinker_grpo.build_train_config(cfg)
    assert c.load_checkpoint_path == "tinker://r/state/final"
    assert c.model_name == "Qwen/Qwen3.6-35B-A3B" and c.renderer_name == "qwen3_5"
    assert c.lora_rank == 8 and c.learning_rate == pytest.approx(4e-5) and c.loss_fn == "importance_sampling"
    assert c.async_config.max_steps_off_policy == 2 and c.async_config.groups_per_batch == 5
    assert c.max_steps == 24 and c.max_tokens == 8192 and c.eval_every == 6 and c.save_every == 6
    db = c.dataset_builder
    assert db.group_size == 8 and db.groups_per_batch == 5 and db.n_batches == 24
    env = json.loads(db.env_overrides_json)["env"]
    assert env["max_turns"] == 30 and env["ledger"]["path"] == str(tmp_path / "7b" / "costs.jsonl")
    assert env["ledger"]["global_budget_usd"] == 800.0 and env["ledger"]["episode_budget_usd"] == 5.0
    s = c.rollout_error_tolerance
    assert type(s).__name__ == "MinViableGroup" and s.min_successful == 4 and s.max_retries == 2


@pytest.mark.parametrize("pilot", ["7", "7b", "7c"])
def test_the_pilots_run_on_runpod_when_it_is_configured_and_say_so(tinker_grpo, compose_cfg, tmp_path, pilot,
                                                                   capsys):
    cfg = compose_cfg(f"+pilot='{pilot}'", f"run_dir={tmp_path}")
    key = {"RUNPOD_API_KEY": "rp-x", "RUNPOD_ENDPOINT_ID": "ep1"}
    assert tinker_grpo.pilot_backend(cfg, key) == ("runpod",
                                                    "auto: RUNPOD_API_KEY and an endpoint id are set")
    assert tinker_grpo.pilot_backend(cfg, {"RUNPOD_API_KEY": "rp-x"})[0] == "local"
    assert tinker_grpo.pilot_backend(cfg, {})[0] == "local"
    dry = compose_cfg(f"+pilot='{pilot}'", f"run_dir={tmp_path}", "dry_run=true")
    assert tinker_grpo.pilot_backend(dry, key)[0] == "local"      # a dry run never dispatches to Runpod
    forced = compose_cfg(f"+pilot='{pilot}'", f"run_dir={tmp_path}", "pilot.backend.name=stub")
    assert tinker_grpo.pilot_backend(forced, key) == ("stub", "pilot.backend.name")
    with contextlib.suppress(SystemExit):   # 7b and 7c stop later: no checkpoint of the pilot they follow
        tinker_grpo.build_train_config(forced)
    assert f"pilot {cfg.pilot.name}: jobs run on backend stub (pilot.backend.name)" in capsys.readouterr().err


def test_config_errors_say_how_to_fix(tinker_grpo, compose_cfg, tmp_path):
    with pytest.raises(SystemExit, match=r"Run `python trainers/tinker_grpo.py \+pilot=7b` first"):
        tinker_grpo.build_train_config(compose_cfg("+pilot=7c", f"run_dir={tmp_path}", "pilot.backend.name=stub"))
    with pytest.raises(SystemExit, match="pilot.backend.name=<name>"):
        tinker_grpo.build_train_config(compose_cfg("+pilot=smoke", f"run_dir={tmp_path}",
                                                   "pilot.backend.name=nowhere"))


def test_a_missing_tinker_extra_is_one_line_and_exit_3_before_the_key(tmp_path):
    """After the quick start (.venv with the `local` extra only) the dry run the no-key message recommends
    must say which extra to install, not end in a traceback; a real run says the same before the key."""
    block = ("import runpy, sys; sys.modules['tinker_cookbook'] = None; sys.modules['tinker'] = None; "
             f"sys.argv = [{str(SCRIPT)!r}] + sys.argv[1:]; runpy.run_path({str(SCRIPT)!r}, run_name='__main__')")
    for extra in (["dry_run=true"], []):
        p = subprocess.run([sys.executable, "-c", block, "+pilot=smoke", f"run_dir={tmp_path / 'runs'}", *extra],
                           cwd=REPO, env=_env_without_key(), capture_output=True, text=True, timeout=60)
        assert p.returncode == 3, p.stderr[-2000:]
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and "needs the 'tinker' extra" in lines[0], p.stderr
        assert "bash scripts/setup.sh tinker" in lines[0] and "Traceback" not in p.stderr
        assert not (tmp_path / "runs").exists()


def test_a_dry_run_bills_nothing_and_labels_its_charts(tinker_grpo, compose_cfg, tmp_path):
    from ait_env.observe.plots import read_run_label

    cfg = compose_cfg("+pilot=smoke", "dry_run=true", f"run_dir={tmp_path}")
    prices = json.loads(tinker_grpo.build_train_config(cfg).dataset_builder.prices_json)
    assert all(prices[k] == 0.0 for k in ("prefill", "cached_prefill", "sample", "train")), prices
    label = read_run_label(tmp_path / "smoke-dryrun")
    assert label is not None and label.startswith("DRY RUN") and "SURROGATE scores (stub backend" in label
    real = compose_cfg("+pilot=smoke", f"run_dir={tmp_path}")
    assert json.loads(tinker_grpo.build_train_config(real).dataset_builder.prices_json)["sample"] > 0
    assert "DRY RUN" not in (read_run_label(tmp_path / "smoke") or "")


def test_a_dry_run_says_first_what_it_is(tinker_grpo, compose_cfg, tmp_path):
    banner = tinker_grpo.dry_run_banner(compose_cfg("+pilot=smoke", "dry_run=true", f"run_dir={tmp_path}"))
    assert banner.startswith("OFFLINE dry run: a scripted policy plays the agent (no Tinker account, no model")
    assert "2 steps x 2 groups x 4 episodes on backend stub (surrogate scores)" in banner
    assert "\n" not in banner
    with pytest.raises(SystemExit, match="console=compact"):
        tinker_grpo.run(compose_cfg("+pilot=smoke", "dry_run=true", f"run_dir={tmp_path}", "console=loud"))


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_offline_loop_steps_evals_crash_resume_and_warm_start(tinker_grpo, compose_cfg, tmp_path, cache_dir,
                                                              monkeypatch):
    from ait_env.integrations.tinker_offline import OfflineRecord

    monkeypatch.setenv("AIT_CACHE_DIR", str(cache_dir))
    base = ("+pilot=smoke", "dry_run=true", f"run_dir={tmp_path}", *FAST)
    # 1. a crash after the first optimizer step ...
    rec = OfflineRecord(fail_after_steps=1)
    with pytest.raises(RuntimeError, match="simulated crash"):
        tinker_grpo.run(compose_cfg(*base), rec)
    log = tmp_path / "smoke-dryrun"
    assert rec.created == [("lora", "Qwen/Qwen3-4B-Instruct-2507")] and rec.optim_steps == 1
    last = [r for r in _rows(log / "checkpoints.jsonl") if "state_path" in r][-1]
    assert last["batch"] == 1
    # 2. ... and the rerun resumes from the last full checkpoint (weights + optimizer) and finishes
    rec = OfflineRecord()
    tinker_grpo.run(compose_cfg(*base), rec)
    assert rec.created == [("resume", last["state_path"])] and rec.optim_steps == 1
    ckpts = _rows(log / "checkpoints.jsonl")
    assert ckpts[-1]["name"] == "final" and ckpts[-1]["batch"] == 2
    rows = _rows(log / "metrics.jsonl")
    train = {r["step"]: r for r in rows if "env/all/ait/reward" in r}
    evals = {r["step"]: r for r in rows if "test/env/heldout/ait/reward" in r}
    assert set(train) == {0, 1} and {0, 2} <= set(evals)
    for r in train.values():
        for k in ("V", "Q", "S", "validated", "status/scored", "status/invalid", "surface/adopted"):
            assert f"env/all/ait/{k}" in r
        assert "env/all/ait/post" in r and "env/all/ait/uplift" in r
        assert any(k.startswith("env/all/ait/model/") for k in r)
        assert r["sampling_client/step_max"] <= r["training_client/step"]
        assert not any("triage" in k for k in r)  # the held-out family never trains
    assert any("test/env/triage/" in k for k in evals[0])
    assert "====== Trajectory Group ======" in (log / "logs.log").read_text()  # the console's detail, kept
    costs = _rows(log / "costs.jsonl")
    assert {r["kind"] for r in costs} >= {"llm", "llm_train", "gpu_job"}
    # 3. a warm start loads the previous pilot's final weights with a fresh optimizer
    rec = OfflineRecord()
    tinker_grpo.run(compose_cfg(*base, "pilot.name=smoke2", "pilot.steps=1", "pilot.warm_start={pilot: smoke}"), rec)
    assert rec.created == [("weights", ckpts[-1]["state_path"])] and rec.optim_steps == 1


def test_one_backend_serves_the_whole_dry_run(tinker_grpo, compose_cfg, tmp_path, cache_dir, monkeypatch):
    """Every episode of a run (train groups, evaluations, retries) shares the run's one backend, and the
    run closes it at the end; no env closes it."""
    from ait_env.backends.base import Backend
    from ait_env.env import JobWritingEnv
    from ait_env.integrations.tinker_offline import OfflineRecord

    monkeypatch.setenv("AIT_CACHE_DIR", str(cache_dir))
    built: list[Backend] = []
    envs: list[JobWritingEnv] = []
    closes: list[Backend] = []
    init_backend, init_env, close_backend = Backend.__init__, JobWritingEnv.__init__, Backend.close

    def count_backend(self, *a, **kw):  # noqa: ANN001, ANN002, ANN003
        init_backend(self, *a, **kw)
        built.append(self)

    def count_env(self, *a, **kw):  # noqa: ANN001, ANN002, ANN003
        init_env(self, *a, **kw)
        envs.append(self)

    def count_close(self):  # noqa: ANN001
        closes.append(self)
        close_backend(self)

    monkeypatch.setattr(Backend, "__init__", count_backend)
    monkeypatch.setattr(JobWritingEnv, "__init__", count_env)
    monkeypatch.setattr(Backend, "close", count_close)
    tinker_grpo.run(compose_cfg("+pilot=smoke", "dry_run=true", f"run_dir={tmp_path}", *FAST), OfflineRecord())
    assert len(envs) > 10, "the dry run played fewer episodes than expected"
    assert len(built) == 1 and all(e.backend is built[0] for e in envs)
    assert closes == built and built[0].closed


def test_wandb_goes_through_the_cookbooks_own_logger(tinker_grpo, compose_cfg, tmp_path, monkeypatch):
    import importlib.util
    import types

    assert tinker_grpo.build_train_config(compose_cfg("+pilot=smoke", f"run_dir={tmp_path}")).wandb_project is None
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: types.SimpleNamespace() if name == "wandb" else real_find_spec(name, *a))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    c = tinker_grpo.build_train_config(compose_cfg("+pilot=smoke", f"run_dir={tmp_path}", "wandb.project=ait",
                                                   "wandb.mode=offline"))
    assert c.wandb_project == "ait" and c.wandb_name == "smoke" and os.environ["WANDB_MODE"] == "offline"
    monkeypatch.delenv("WANDB_MODE", raising=False)


@pytest.mark.parametrize("pilot", ["7", "7b", "7c"])
def test_the_pilots_accept_backend_skypilot(tinker_grpo, compose_cfg, tmp_path, pilot, capsys):
    forced = compose_cfg(f"+pilot='{pilot}'", f"run_dir={tmp_path}", "pilot.backend.name=skypilot")
    assert tinker_grpo.pilot_backend(forced, {}) == ("skypilot", "pilot.backend.name")
    with contextlib.suppress(SystemExit):   # 7b and 7c stop later: no checkpoint of the pilot they follow
        tinker_grpo.build_train_config(forced)
    err = capsys.readouterr().err
    assert f"pilot {forced.pilot.name}: jobs run on backend skypilot (pilot.backend.name)" in err
    assert "which this checkout does not have" not in err


def test_the_training_stream_samples_every_training_family(tinker_grpo, compose_cfg, tmp_path):
    """``family=train`` for the Tinker trainer: the batches go round the training families (triage, held out,
    only in the eval; a family marked ``sampled: false`` in neither), and the eval batch has a group of each."""
    from ait_env.config import split_families
    from task_families import FAMILY_NAMES

    cfg = compose_cfg("+pilot=smoke", "dry_run=true", f"run_dir={tmp_path}")
    train_ds, eval_ds = tinker_grpo.build_train_config(cfg).dataset_builder.datasets()
    train, held = split_families(FAMILY_NAMES)
    assert held == ["triage"]
    drawn = [b.family for i in range(len(train)) for b in train_ds.get_batch(i)]
    assert set(drawn) == set(train) and "triage" not in drawn and "warehouse" in drawn   # the stateful one too
    assert eval_ds is not None
    assert {b.family for b in eval_ds.get_batch(0)} == set(train) | {"triage"}
