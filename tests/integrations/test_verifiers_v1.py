"""AIT/JobWriting-v0 as a verifiers v1 environment (verifiers 0.4.0), played through verifiers' own code:
``vf.load_environment`` by the id ``ait-job-writing-v1`` (the installed package), ``env.serving()`` and
``env.run_episode`` with the ``null`` harness in the ``subprocess`` runtime, against a scripted OpenAI-compatible
server on 127.0.0.1 (server-sent events, as the harness asks). Runs in .venv-vf1: ``bash
scripts/test_verifiers_v1.sh`` (verifiers 0.4.0 cannot share .venv with the inner stack's 0.2.0); the jobs the
agent writes are validated with the project's .venv (``probe.sandbox.python``)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import pytest

verifiers = pytest.importorskip("verifiers")
if verifiers.__version__ != "0.4.0":   # .venv has the inner stack's 0.2.0 (its verifiers.v1 is another API)
    pytest.skip(f"verifiers {verifiers.__version__} here; the v1 tests run in .venv-vf1: bash "
                "scripts/test_verifiers_v1.sh", allow_module_level=True)

import verifiers.v1 as vf  # noqa: E402

from tests.fakes.job_writer import job_writer_policy  # noqa: E402
from tests.fakes.openai_server import ScriptedOpenAIServer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
INNER_PYTHON = os.environ.get("AIT_INNER_PYTHON") or str(ROOT / ".venv" / "bin" / "python")


@pytest.fixture(autouse=True)
def _runtime_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    # verifiers' subprocess runtime installs its harness program with uv, found on PATH (the venv's own)
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("AIT_FAKE_KEY", "not-a-key")


def _play(tmp_path: Path, policy: Any, *, max_turns: int = 8, families: str = "arithmetic",
          num_tasks: int = 1, **env: Any) -> tuple[list[Any], ScriptedOpenAIServer]:
    if not Path(INNER_PYTHON).is_file():
        pytest.skip(f"no interpreter with the inner stack at {INNER_PYTHON} (bash scripts/setup.sh test,local)")
    overrides = {"env": {"runs_dir": str(tmp_path / "runs")}}
    cfg = vf.resolve_env_config({"taskset": {"id": "ait-job-writing-v1", "families": families,
                                             "num_tasks": num_tasks},
                                 "agent": {"runtime": {"type": "subprocess"}, "max_turns": max_turns},
                                 "backend": "stub", "overrides": overrides, "inner_python": INNER_PYTHON, **env})
    env = vf.load_environment(cfg)

    async def main(server: ScriptedOpenAIServer) -> list[Any]:
        ctx = vf.ModelContext(model="scripted", client=vf.EvalClientConfig(base_url=server.base_url,
                                                                             api_key_var="AIT_FAKE_KEY"))
        async with env.serving():
            return [await env.run_episode(task, ctx) for task in env.taskset]

    with ScriptedOpenAIServer(policy) as server:
        return asyncio.run(main(server)), server


def test_a_scripted_agent_plays_an_episode_through_verifiers_own_rollout_code(tmp_path):
    episodes, server = _play(tmp_path, job_writer_policy(structured=False))
    (ep,) = episodes
    assert ep.ok, ep.errors
    (trace,) = ep.traces
    # read job.toml, get_baseline_scores, write both files, submit: the stub scores the job (surrogate)
    assert trace.num_turns == 4 and server.n_requests == 4
    assert trace.metrics["ait_scored"] == 1.0 and trace.metrics["ait_validated"] == 1.0
    assert 0.0 < trace.reward <= 1.0 and set(trace.rewards) == {"ait_reward"}
    first = server.requests[0]["messages"]
    assert first[0]["role"] == "system" and "<tool_call>" in first[0]["content"]      # the env's own prompt
    assert "# Task:" in first[1]["content"] and "tools" not in server.requests[0]       # text tools, none declared
    # each observation came back as the next user turn
    assert "<tool_response>" in server.requests[1]["messages"][-1]["content"]


def test_an_agent_stopped_by_its_turn_limit_gets_the_unfinished_reward(tmp_path):
    episodes, _ = _play(tmp_path, lambda messages, tools: {"content": "Let me think about the job first."},
                        max_turns=2)
    (trace,) = episodes[0].traces
    assert episodes[0].ok and trace.reward == pytest.approx(-0.1) and trace.metrics["ait_unfinished"] == 1.0


def test_an_infra_failed_episode_fails_instead_of_scoring_zero(tmp_path):
    # a stub whose "pod" is lost for the jobs marked so (tests/integrations/flaky_backend.py)
    episodes, _ = _play(tmp_path, job_writer_policy(structured=False, infra_families=("arithmetic",)),
                        backend_factory="tests.integrations.flaky_backend:FlakyStubBackend")
    (ep,) = episodes
    assert not ep.ok and any("infra_failed" in str(e) for e in ep.errors), ep.errors


PRIMERL_V1_PY = os.environ.get("AIT_PRIMERL_V1_CONFIGS_PYTHON", "")
_VALIDATE = """
import json, sys
from pydantic_config import cli
from prime_rl.configs.rl import RLConfig
cfg = cli(RLConfig, args=["@", sys.argv[1]])
(src,) = cfg.orchestrator.train.source
print(json.dumps({"env": type(src.env).__name__, "taskset": src.env.taskset.id, "families": src.env.taskset.families,
                  "harness": src.env.agent.harness.id, "runtime": src.env.agent.runtime.type,
                  "backend": src.env.backend, "renderer": cfg.orchestrator.renderer.name}))
"""


@pytest.mark.skipif(not PRIMERL_V1_PY or not Path(PRIMERL_V1_PY).is_file(), reason=(
    "set AIT_PRIMERL_V1_CONFIGS_PYTHON to a Python 3.12 with prime-rl main's prime-rl-configs, this project and "
    "environments/ait_job_writing_v1 installed (docs/verifiers.md)"))
def test_the_rl_toml_is_accepted_by_prime_rls_own_config_schema(tmp_path):
    import json
    import subprocess

    toml = ROOT / "environments" / "ait_job_writing_v1" / "rl.toml"
    proc = subprocess.run([PRIMERL_V1_PY, "-c", _VALIDATE, str(toml)], capture_output=True, text=True, timeout=600,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {"env": "JobWritingEnvV1Config", "taskset": "ait-job-writing-v1", "families": "train",
                   "harness": "null", "runtime": "subprocess", "backend": "stub", "renderer": "default"}
    # the schema is ours too: a key the env does not have is refused
    bad = tmp_path / "rl.toml"
    bad.write_text(toml.read_text().replace('backend = "stub"', 'backend = "stub"\nno_such_key = 1'))
    proc = subprocess.run([PRIMERL_V1_PY, "-c", _VALIDATE, str(bad)], capture_output=True, text=True, timeout=600,
                          cwd=ROOT)
    assert proc.returncode != 0 and "no_such_key" in proc.stderr
