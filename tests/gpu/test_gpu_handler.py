"""The Runpod Serverless handler: the bundle as a base64 tar.gz, the result under "result", progress through
a stand-in for the SDK's progress_update, a stop from Runpod that kills the job; and the real SDK's local
test mode calling the handler."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import subprocess
import sys
import tarfile
import time

import pytest

from ait_env.hidden.baselines import BaselineEntry
from ait_env.jobs import wire
from gpu import isolation, runpod_handler, scrub
from ait_env import processes
from tests.gpu.helpers import FAKE_KEY, ROOT, local_settings, make_job, needs_tiny_model


def test_bundle_round_trip_carries_only_the_manifests_files(tmp_path):
    b = make_job(tmp_path)
    (b.root / "result.json").write_text("{}")
    (b.root / "outputs").mkdir()
    (b.root / "outputs" / "big.bin").write_bytes(b"x" * 1000)
    data = wire.pack_bundle(b.root)
    out = wire.unpack_bundle(data, tmp_path / "unpacked")
    assert out.name == b.job_id
    files = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert files == {"manifest.json", *b.manifest.files}
    from ait_env.jobs.bundle import JobBundle

    JobBundle.load(out).verify()


def _tar(members: dict[str, bytes], link: str | None = None) -> str:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if link:
            info = tarfile.TarInfo(link)
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tar.addfile(info)
    return base64.b64encode(buf.getvalue()).decode()


@pytest.mark.parametrize("payload, message", [
    (_tar({"manifest.json": b'{"job_id": "j"}', "../evil.py": b""}), "not a plain relative file"),
    (_tar({"manifest.json": b'{"job_id": "j"}', "/abs.py": b""}), "not a plain relative file"),
    (_tar({"manifest.json": b'{"job_id": "j"}'}, link="src/link"), "not a plain relative file"),
    (_tar({"manifest.json": b'{"job_id": "../j"}'}), "not a plain name"),
    (_tar({"job.toml": b""}), "no manifest.json"),
    (base64.b64encode(b"not a tar").decode(), "not a gzip tar archive"),
    ("A" * (wire.MAX_BUNDLE_B64 + 4), "over"),
])
def test_hostile_payloads_are_refused(tmp_path, payload, message):
    with pytest.raises(ValueError, match=message):
        wire.unpack_bundle(payload, tmp_path)
    assert not (tmp_path / "evil.py").exists()


def test_text_leaving_the_worker_is_scrubbed(tmp_path, monkeypatch):
    from ait_env.hidden.secrets import hidden_questions

    question = hidden_questions("arithmetic")[0]
    monkeypatch.setenv("RUNPOD_AI_API_KEY", FAKE_KEY)
    scrubber = scrub.Scrubber(isolation.secret_values() | {"31415926535"})
    scrubber.add(scrub.hidden_questions("arithmetic", None))
    text = scrubber(f"failed on {question!r} with key {FAKE_KEY}, seed 31415926535, in {ROOT}/ait_env/runner.py")
    assert question not in text and FAKE_KEY not in text and "31415926535" not in text
    assert str(ROOT) not in text and "<ait>/ait_env/runner.py" in text and text.count("<redacted>") == 3


def test_input_that_does_not_validate_is_a_caller_error():
    with pytest.raises(ValueError):
        runpod_handler.handle_input({"kind": "job"})
    with pytest.raises(ValueError, match="needs 'bundle'"):
        runpod_handler.handle_input({"settings": local_settings().model_dump()})


@needs_tiny_model
def test_handler_runs_a_job_with_progress_and_the_callers_baselines(tmp_path, monkeypatch):
    from cpu.tiny_models.catalog import weights_hash

    pytest.importorskip("verifiers")
    b = make_job(tmp_path)
    pin = BaselineEntry(backend="local", family="arithmetic", model="ait-tiny-s", score=0.123,
                        model_hash=weights_hash("ait-tiny-s"), seeded_at=1.0)
    progress: list[str] = []
    monkeypatch.setattr(runpod_handler, "_sdk_progress", lambda job: progress.append)  # stands in for progress_update
    out = asyncio.run(runpod_handler.handler({"id": "job-1", "input": {
        "executor": "local", "settings": local_settings(measure_pre=False).model_dump(mode="json"),
        "bundle": wire.pack_bundle(b.root), "baselines": [pin.model_dump(mode="json")], "tag": "t-1"}}))
    assert set(out) == {"kind", "result", "tag", "baselines"} and out["kind"] == "job"   # never a top-level "error"
    assert out["tag"] == "t-1"    # the request's tag, echoed: the orchestrator tells its attempt's result by it
    res = out["result"]
    assert res["status"] == "succeeded", res["error"]
    assert res["baselines"]["ait-tiny-s"] == 0.123     # the caller's store was read, not re-measured
    assert res["worker"]["selfcheck"] == "ok" and out["baselines"] == []
    assert any("post-eval" in line for line in progress) and all(line.startswith("[") for line in progress)


@needs_tiny_model
def test_a_stop_from_runpod_kills_the_job(tmp_path, monkeypatch):
    """A cancelled or timed-out request raises CancelledError in the async handler: the runner and every
    process below it are gone soon after, and the handler re-raises."""
    pytest.importorskip("verifiers")
    b = make_job(tmp_path, env_edit=lambda t: t.replace(
        "    dataset = build_dataset(num_examples, seed)\n", "    import time\n    time.sleep(300)\n"))
    payload = {"executor": "local", "settings": local_settings().model_dump(mode="json"),
               "bundle": wire.pack_bundle(b.root)}
    before = processes.live_descendants(os.getpid())

    async def main() -> None:
        task = asyncio.create_task(runpod_handler.handler({"id": "job-2", "input": payload}))
        for _ in range(600):   # until the runner child is up
            await asyncio.sleep(0.1)
            if any(b"--child" in _cmdline(p) for p in processes.live_descendants(os.getpid()) - before):
                break
        await asyncio.sleep(2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    deadline = time.time() + 30
    while time.time() < deadline and processes.live_descendants(os.getpid()) - before:
        time.sleep(0.2)
    assert not processes.live_descendants(os.getpid()) - before


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def test_the_runpod_sdk_runs_the_handler_in_its_local_test_mode(tmp_path):
    """The real SDK (runpod 1.12.0) calls the handler with --test_input; on this machine the gpu executor
    is refused by the self-check, and the refusal comes back as the result, not as an SDK error."""
    pytest.importorskip("runpod")
    b = make_job(tmp_path)
    from ait_env.jobs.settings import BackendSettings
    from ait_env.backends.gpu_local import worker_settings
    from ait_env.config import load_group

    settings = worker_settings(BackendSettings.model_validate(load_group("backend", "gpu-local")))
    job = {"input": {"executor": "gpu", "settings": settings.model_dump(mode="json"),
                     "bundle": wire.pack_bundle(b.root)}}
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNPOD_")}
    out = subprocess.run([sys.executable, "-m", "gpu.worker", "--serve", "--test_input", json.dumps(job)],
                         cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                         timeout=120)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]   # the SDK exits 1 when the output carries an "error"
    assert "ait worker self-check" in text and "Job result" in text and "infra_failed" in text
    import ait_env.runner

    if "gpu" not in ait_env.runner.EXECUTORS:
        assert "no trainer executor for 'gpu'" in text
