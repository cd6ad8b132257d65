"""The worker's self-check: versions, image revision, GPUs, model files by hash; what refuses jobs."""

from __future__ import annotations

import json
import os
import stat

import pytest

from ait_env.jobs.primerl import PRIME_RL_COMMIT
from gpu import selfcheck
from gpu.selfcheck import PRIME_RL_LOCKED, SelfCheck


def test_a_machine_without_gpus_refuses_gpu_jobs_with_the_reasons():
    chk = selfcheck.run("gpu")
    if chk.gpus:
        pytest.skip("this machine has GPUs")
    msg = chk.refusal()
    assert not chk.ok and "0 GPU(s) on this worker" in msg and "--backend local" in msg
    from ait_env.runner import EXECUTORS

    if "gpu" not in EXECUTORS:   # until the prime-rl executor lands
        assert "no trainer executor for 'gpu'" in msg and "gpu/primerl_executor.py" in msg
    assert chk.versions["python"] and chk.versions["ai-trains-ai"]
    s = chk.summary()
    assert s["selfcheck"] == "refused"
    assert s["image_revision"] == os.environ.get("AIT_IMAGE_REVISION", "unknown")


def test_local_executor_is_checked_without_a_gpu():
    chk = selfcheck.run("local")
    assert chk.ok, chk.problems
    assert chk.versions["verifiers"] == "0.2.0" and chk.summary()["selfcheck"] == "ok"


def test_a_required_image_revision_must_match(monkeypatch):
    monkeypatch.setenv("AIT_IMAGE_REVISION", "abc123")
    assert selfcheck.run("local", require_revision="abc123").ok
    chk = selfcheck.run("local", require_revision="def456")
    assert "image revision 'abc123', the caller requires 'def456'" in chk.refusal()


def test_nvidia_smi_lines_are_parsed():
    g = selfcheck.parse_smi_line("NVIDIA H100 80GB HBM3, 81559")
    assert (g.name, g.memory_mib) == ("NVIDIA H100 80GB HBM3", 81559)
    assert selfcheck.parse_smi_line("weird").name == "weird"


def _fake_model(root, model="Qwen/Qwen3-0.6B", weights=b"weights"):
    d = root / model
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(weights)
    return d


def test_model_files_are_checked_against_the_manifest(tmp_path, monkeypatch):
    monkeypatch.setenv("AIT_MODELS_DIR", str(tmp_path / "models"))
    d = _fake_model(tmp_path / "models")
    manifest = selfcheck.write_manifest(["Qwen/Qwen3-0.6B"], tmp_path / "m.json")
    assert set(manifest["models"]["Qwen/Qwen3-0.6B"]) == {"config.json", "model.safetensors"}
    assert selfcheck.check_models(manifest) == {"Qwen/Qwen3-0.6B": "ok"}
    (d / "model.safetensors").write_bytes(b"other weights")
    assert "model.safetensors" in selfcheck.check_models(manifest)["Qwen/Qwen3-0.6B"]
    manifest["models"]["Qwen/Qwen3-1.7B"] = {"x": "0"}
    assert selfcheck.check_models(manifest)["Qwen/Qwen3-1.7B"].startswith("missing")


def test_models_resolve_in_a_hugging_face_cache(tmp_path):
    snap = tmp_path / "hub" / "models--Qwen--Qwen3-0.6B" / "snapshots" / "rev1"
    snap.mkdir(parents=True)
    (snap.parent.parent / "refs").mkdir()
    (snap.parent.parent / "refs" / "main").write_text("rev1")
    assert selfcheck.model_dir("Qwen/Qwen3-0.6B", {"HF_HUB_CACHE": str(tmp_path / "hub")}) == snap
    assert selfcheck.model_dir("Qwen/Qwen3-1.7B", {"HF_HUB_CACHE": str(tmp_path / "hub")}) is None


def _fake_prime_rl(root, versions, commit=PRIME_RL_COMMIT):
    """A prime-rl checkout whose venv's python answers the version query with ``versions``."""
    py = root / ".venv" / "bin" / "python"
    py.parent.mkdir(parents=True)
    py.write_text(f"#!/bin/sh\necho '{json.dumps(versions)}'\n")
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    (root / ".ait-commit").write_text(commit + "\n")


@pytest.mark.parametrize("change, problem", [
    ({}, None),
    ({"verifiers": "0.3.1"}, "verifiers 0.3.1 in the training venv, prime-rl's lock pins 0.2.0"),
    ({"vllm": ""}, "vllm missing in the training venv"),
    ({"commit": "0" * 40}, "prime-rl at 0000000000000000000000000000000000000000"),
])
def test_the_training_venv_is_checked_against_the_pins(tmp_path, monkeypatch, change, problem):
    versions = {"python": "3.12.3", "prime-rl": "0.7.0", **PRIME_RL_LOCKED}
    commit = change.pop("commit", PRIME_RL_COMMIT)
    versions.update(change)
    _fake_prime_rl(tmp_path / "prime-rl", versions, commit)
    monkeypatch.setenv("AIT_PRIME_RL_DIR", str(tmp_path / "prime-rl"))
    chk = SelfCheck(executor="gpu")
    selfcheck._check_gpu_stack(chk, min_gpus=0)
    assert chk.versions["train:verifiers"] == versions["verifiers"]
    if problem is None:
        assert chk.problems == []
    else:
        assert len(chk.problems) == 1 and problem in chk.problems[0], chk.problems


SMI = """0, GPU-aaaa1111-0000, NVIDIA RTX A5000, 24564
1, GPU-bbbb2222-0000, NVIDIA RTX A5000, 24564
2, GPU-cccc3333-0000, NVIDIA L40S, 46068
"""


@pytest.mark.parametrize("visible, names", [
    (None, ["NVIDIA RTX A5000", "NVIDIA RTX A5000", "NVIDIA L40S"]),   # unset: every GPU
    ("1", ["NVIDIA RTX A5000"]),                                       # a pool job given one GPU
    ("2,0", ["NVIDIA L40S", "NVIDIA RTX A5000"]),                      # in CUDA's order
    ("GPU-cccc", ["NVIDIA L40S"]),                                     # a UUID prefix
    ("", []),                                                          # none (a CPU-only Ray task)
    ("0,7,1", ["NVIDIA RTX A5000"]),                                   # CUDA stops at an invalid entry
])
def test_the_worker_reports_the_gpus_its_job_may_use_not_every_gpu_of_the_machine(visible, names):
    assert [g.name for g in selfcheck.visible_smi_rows(SMI, visible)] == names
    assert all(g.memory_mib for g in selfcheck.visible_smi_rows(SMI, visible))
