"""The hidden eval's vLLM: the launch command pinned flag by flag (vLLM 0.24.0's CLI, see gpu/vllm_server.py),
and the server lifetime against the fake ``vllm`` (tests/gpu/fakes/fake_vllm.py)."""

from __future__ import annotations

import json
import os
import urllib.request
import uuid
from pathlib import Path

import pytest

from ait_env.hidden.evaluation import evaluate
from ait_env.runner import InfraFailed
from gpu.vllm_server import VLLM_ENV, VllmServer, build_serve_command, tool_call_parser_for
from tests.gpu.gpu_helpers import FAKE_VLLM, MODEL, leftovers

pytest_plugins = ("tests.gpu.gpu_fixtures",)


def test_the_launch_command() -> None:
    cmd = build_serve_command("/w/weights/step_60", served_model_name="Qwen/Qwen3-1.7B", port=8123,
                              max_model_len=8192, gpu_memory_utilization=0.85, tool_call_parser="hermes")
    assert cmd == ["vllm", "serve", "/w/weights/step_60", "--served-model-name", "Qwen/Qwen3-1.7B",
                   "--host", "127.0.0.1", "--port", "8123", "--max-model-len", "8192",
                   "--gpu-memory-utilization", "0.85", "--disable-uvicorn-access-log",
                   "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]


def test_optional_flags() -> None:
    cmd = build_serve_command("m", served_model_name="m", port=1, max_model_len=2, gpu_memory_utilization=0.5,
                              tool_call_parser=None, chat_template_kwargs={"enable_thinking": False},
                              enforce_eager=True, vllm_cmd=["uv", "run", "vllm"])
    assert cmd[:4] == ["uv", "run", "vllm", "serve"]
    assert "--enable-auto-tool-choice" not in cmd and "--tool-call-parser" not in cmd
    assert cmd[-3:] == ["--default-chat-template-kwargs", '{"enable_thinking": false}', "--enforce-eager"]


@pytest.mark.parametrize("model,parser", [
    ("Qwen/Qwen3-0.6B", "hermes"), ("Qwen/Qwen3-1.7B", "hermes"), ("Qwen/Qwen3-4B-Instruct-2507", "hermes"),
    ("Qwen/Qwen3-Coder-30B-A3B-Instruct", "qwen3_coder"), ("Qwen/Qwen3.5-9B", "qwen3_coder"),
    ("ait-tiny-s", None), ("/models/qwen3", None)])
def test_tool_parser_as_prime_rl_resolves_it(model: str, parser: str | None) -> None:
    """prime-rl v0.7.0 packages/prime-rl-configs/src/prime_rl/utils/parsers.py (its Qwen3 entries)."""
    assert tool_call_parser_for(model) == parser


def _server(tmp_path: Path, model: str, run_id: str, **kw: object) -> VllmServer:
    env = {**os.environ, "FAKE_RUN_ID": run_id, "FAKE_VLLM_RECORD": str(tmp_path / "launches.jsonl")}
    env.update(kw.pop("env", {}))  # type: ignore[arg-type]
    return VllmServer(model, served_model_name=MODEL, env=env,  # type: ignore[arg-type]
                      log_path=tmp_path / "vllm.log", max_model_len=1024, tool_call_parser="hermes",
                      vllm_cmd=FAKE_VLLM, kill_grace_s=2.0, **kw)


def test_serves_a_weights_folder_until_stopped(tmp_path: Path, micro_dirs: dict[str, str]) -> None:
    run_id = "vllm-" + uuid.uuid4().hex[:8]   # unique: a killed earlier run may leave a same-named tree
    with _server(tmp_path, micro_dirs[MODEL], run_id) as served:
        assert served.model == MODEL and served.base_url.startswith("http://127.0.0.1:")
        models = json.loads(urllib.request.urlopen(served.base_url + "/models").read())
        assert [m["id"] for m in models["data"]] == [MODEL]
        res = evaluate("arithmetic", base_url=served.base_url, model=served.model, limit=4, max_tokens=32)
        assert res.n == 4 and res.n_errors == 0
        assert len(leftovers(run_id)) == 2   # the server and its engine process
    assert leftovers(run_id) == set()
    launch = json.loads((tmp_path / "launches.jsonl").read_text())
    assert {k: launch["env"][k] for k in VLLM_ENV} == VLLM_ENV  # sampled as prime-rl's own vLLM


def test_a_server_that_dies_at_start_is_infra_with_its_log(tmp_path: Path) -> None:
    run_id = "vllm-dies-" + uuid.uuid4().hex[:8]   # unique: a killed earlier run may leave a same-named tree
    with pytest.raises(InfraFailed, match=r"exited with code 1 before it was ready(.|\n)*cannot download"):
        _server(tmp_path, "Qwen/Qwen3-0.6B", run_id).start()
    assert leftovers(run_id) == set()


def test_a_server_never_ready_times_out_and_is_killed(tmp_path: Path, micro_dirs: dict[str, str]) -> None:
    run_id = "vllm-hangs-" + uuid.uuid4().hex[:8]   # unique: a killed earlier run may leave a same-named tree
    server = _server(tmp_path, micro_dirs[MODEL], run_id, env={"FAKE_VLLM_HANG": "1"}, startup_timeout_s=3.0)
    with pytest.raises(InfraFailed, match="not ready within 3 s"):
        server.start()
    assert leftovers(run_id) == set()


def test_a_missing_vllm_says_how_to_fix(tmp_path: Path) -> None:
    server = VllmServer("m", served_model_name="m", env={}, log_path=tmp_path / "v.log", max_model_len=8,
                        vllm_cmd=["/nonexistent/vllm"])
    with pytest.raises(InfraFailed, match="backend.options.vllm_cmd"):
        server.start()


def test_the_eval_vllm_starts_under_a_100_character_tmpdir(tmp_path: Path, micro_dirs: dict[str, str]) -> None:
    """Issue 48: vLLM 0.24 binds its ZMQ sockets at $VLLM_RPC_BASE_PATH/<uuid4> (default $TMPDIR); under a
    100-character worker TMPDIR that path (137 characters) is refused by the kernel (sun_path: 107 bytes) and
    every eval failed. The server gets its own short runtime folder, removed when it stops."""
    import socket

    long_tmp = tmp_path / ("t" * max(1, 100 - len(str(tmp_path)) - 1))
    long_tmp.mkdir()
    assert len(str(long_tmp)) == 100
    with socket.socket(socket.AF_UNIX) as sock, pytest.raises(OSError):   # what vLLM met there
        sock.bind(f"{long_tmp}/{uuid.uuid4()}")
    run_id = "vllm-tmp-" + uuid.uuid4().hex[:8]   # unique: a killed earlier run may leave a same-named tree
    server = _server(tmp_path, micro_dirs[MODEL], run_id, env={"TMPDIR": str(long_tmp),
                                                                "VLLM_RPC_BASE_PATH": str(long_tmp)})
    with server as served:
        assert served.model == MODEL
        runtime = server.runtime_dir
        assert runtime is not None and runtime.is_dir() and len(str(runtime)) + 37 <= 107
    assert not runtime.exists() and leftovers(run_id) == set()
    launch = json.loads((tmp_path / "launches.jsonl").read_text())
    assert launch["env"]["VLLM_RPC_BASE_PATH"] == str(runtime)
