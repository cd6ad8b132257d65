"""Shared fixtures: envs that write under a temporary runs dir.

Under pytest-xdist (the default run: ``-n 2``, pyproject.toml) each worker gets a training uid of its own
(:func:`worker_training_uid`): the GPU worker's jail kills every process of its uid before and after a
request, so two workers (or two suites side by side) on one uid would kill each other's jobs."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

import gymnasium as gym
import pytest

import ait_env  # noqa: F401  (registers the env)
import torch
from ait_env.local.chat import render
from ait_env.local.model import TinyConfig, TinyLM
from ait_env.local.tokenizer import ChatTokenizer, train_tokenizer
from task_families import get_family


def worker_training_uid(environ: Any = os.environ, pid: int | None = None) -> int:
    """Set and return this process's ``AIT_TRAINING_UID`` (the GPU jail's uid, which it kills wholesale).

    The session picks a base once (the xdist controller, or a plain run): ``$AIT_TRAINING_UID`` when you set
    one, else 61000 + 300 × (pid mod 13), so that two suites started side by side (two checkouts on one
    machine) rarely share one; the workers inherit it as ``AIT_TRAINING_UID_BASE``. Each xdist worker
    (``PYTEST_XDIST_WORKER=gwN``) then takes base + 100 × (N + 1), room for the per-GPU-group uids a backend
    derives from it. No uid changes what a test computes; only which processes a jail may kill."""
    worker = environ.get("PYTEST_XDIST_WORKER", "")
    if "AIT_TRAINING_UID_BASE" not in environ:
        own = environ.get("AIT_TRAINING_UID")
        base = int(own) if own else 61000 + 300 * ((os.getpid() if pid is None else pid) % 13)
        environ["AIT_TRAINING_UID_BASE"] = str(base)
    base = int(environ["AIT_TRAINING_UID_BASE"])
    uid = base + 100 * (int(worker[2:]) + 1) if worker.startswith("gw") and worker[2:].isdigit() else base
    environ["AIT_TRAINING_UID"] = str(uid)
    return uid


worker_training_uid()  # before any test module reads training_uid() at import


def call(name: str, **arguments: Any) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def play(env: Any, agent: Any, seed: int, turns: int = 10) -> tuple[str, float, bool, bool, dict[str, Any]]:
    """Reset ``env`` and let a scripted ``agent`` (``reset(info)``, ``act(obs, info)``) play until the episode
    ends or ``turns`` turns; the last step's ``(obs, reward, terminated, truncated, info)``."""
    obs, info = env.reset(seed=seed)
    agent.reset(info)
    out: tuple[str, float, bool, bool, dict[str, Any]] = (obs, 0.0, False, False, info)
    for _ in range(turns):
        out = env.step(agent.act(out[0], out[4]))
        if out[2] or out[3]:
            break
    return out


def make_bundle(files: dict[str, str], folder: Path, family: str = "arithmetic") -> Any:
    """Write ``files`` as a workspace under ``folder`` and bundle the job without the probe, the way the
    env bundles a validated job."""
    from ait_env.jobs.bundle import build_bundle
    from ait_env.jobs.schema import parse_job

    ws = folder / "ws"
    ws.mkdir()
    for name, text in files.items():
        (ws / name).parent.mkdir(parents=True, exist_ok=True)
        (ws / name).write_text(text)
    job, issues = parse_job(files["job.toml"])
    assert job is not None, issues
    return build_bundle(ws, job, get_family(family), folder / "jobs")


def load_reference_environment(family: str, model: str, folder: Path, args: dict[str, Any]) -> Any:
    """The family's reference job, packaged and imported the way a bundle is (in this process), then
    ``load_environment(**args)``: the verifiers environment an agent's job would train with."""
    import uuid

    from ait_env.agents.reference import reference_files
    from ait_env.integrations import verifiers_v0 as V
    from ait_env.jobs.bundle import write_env_package
    from ait_env.jobs.schema import parse_job

    files = reference_files(family, model)
    ws = folder / "ws"
    ws.mkdir(parents=True)
    for name, text in files.items():
        (ws / name).write_text(text)
    job, issues = parse_job(files["job.toml"])
    assert job is not None, issues
    env_id = f"ait_job_test_{uuid.uuid4().hex[:8]}"
    write_env_package(ws, job, get_family(family), folder / "pkgs", env_id)
    return V.load_environment(V.import_env_package(folder / "pkgs", env_id), args)


_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


@pytest.fixture(autouse=True)
def _loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test reaches a host but this one over httpx (the Runpod client's transport): a key a test sets
    never leaves 127.0.0.1, and a code path that would call Runpod's real hosts fails loudly here instead of
    timing out or reaching them (issue 32, item 9)."""
    try:
        import httpx
    except ImportError:   # a venv without httpx sends nothing through it
        return

    def guard(request: Any) -> None:
        if request.url.host not in _LOOPBACK:
            raise AssertionError(f"a test tried to reach {request.url.scheme}://{request.url.host}: tests talk "
                                 "to fakes on 127.0.0.1 only (point base_url / rest_base_url at the fake)")

    sync_send, async_send = httpx.HTTPTransport.handle_request, httpx.AsyncHTTPTransport.handle_async_request

    def handle(self: Any, request: Any) -> Any:
        guard(request)
        return sync_send(self, request)

    async def handle_async(self: Any, request: Any) -> Any:
        guard(request)
        return await async_send(self, request)

    monkeypatch.setattr(httpx.HTTPTransport, "handle_request", handle)
    monkeypatch.setattr(httpx.AsyncHTTPTransport, "handle_async_request", handle_async)


@pytest.fixture
def runs_dir(tmp_path: Path) -> Path:
    return tmp_path / "runs"


@pytest.fixture
def make_env(runs_dir: Path) -> Callable[..., gym.Env]:
    made: list[gym.Env] = []

    def _make(**kwargs: Any) -> gym.Env:
        overrides = kwargs.pop("overrides", {}) or {}
        overrides.setdefault("env", {})["runs_dir"] = str(runs_dir)
        kwargs.setdefault("backend", "stub")
        env = gym.make("AIT/JobWriting-v0", overrides=overrides, **kwargs)
        made.append(env)
        return env

    yield _make
    for env in made:
        env.close()


# ---- local backend: a micro model and tokenizer built in seconds (no cache, no download)
def _texts(n: int = 300) -> list[str]:
    f = get_family("arithmetic")
    return [render(f.eval_messages(i) + f.transcript(i), f.tool_schemas()) for i in f.generate(1, n)]


@pytest.fixture(scope="session")
def micro_tokenizer() -> ChatTokenizer:
    return ChatTokenizer(train_tokenizer(_texts(), 512))


@pytest.fixture(scope="session")
def micro_model(micro_tokenizer: ChatTokenizer) -> TinyLM:
    """A 2-layer model briefly fitted to correct arithmetic transcripts (so it emits tool calls)."""
    torch.manual_seed(0)
    tok = micro_tokenizer
    m = TinyLM(TinyConfig(vocab_size=tok.vocab_size, max_position_embeddings=1024))
    ids = [tok.encode(t) for t in _texts()]
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    for it in range(50):
        batch = ids[(it * 16) % 288:(it * 16) % 288 + 16]
        T = max(len(x) for x in batch)
        x = torch.full((len(batch), T), tok.pad_id)
        a = torch.zeros(len(batch), T, dtype=torch.long)
        for i, s in enumerate(batch):
            x[i, :len(s)] = torch.tensor(s)
            a[i, :len(s)] = 1
        lp = m.sequence_logprobs(x, a)
        loss = -(lp * a[:, 1:]).sum() / a[:, 1:].sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    m.eval()
    return m
