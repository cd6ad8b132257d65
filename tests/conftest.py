"""Shared fixtures: envs that write under a temporary runs dir.

Under pytest-xdist (the default run: ``-n 2``, pyproject.toml) each worker gets a training uid of its own
(:func:`worker_training_uid`): the GPU worker's jail kills every process of its uid before and after a
request, so two workers (or two suites side by side) on one uid would kill each other's jobs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import gymnasium as gym
import pytest

import ait_env  # noqa: F401  (registers the env)
from task_families import get_family

if TYPE_CHECKING:  # torch and the tiny models only where a fixture needs them (.venv-vf1 has no torch)
    from cpu.tiny_models.model import TinyLM
    from cpu.tiny_models.tokenizer import ChatTokenizer


from tests.helpers import worker_training_uid  # noqa: E402

worker_training_uid()  # before any test module reads training_uid() at import

# The suite is deterministic: it scores with the published hidden-eval seeds (ait_env/hidden/secrets.py), chosen
# explicitly here for this process and every process it starts, whatever the shell says; a test of the private
# seeds sets its own (and _private_data_dir keeps their file out of the user's ~/.config).
os.environ["AIT_HIDDEN_SEEDS"] = "published"


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


@pytest.fixture(autouse=True)
def _private_data_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Every test has its own per-user data folder ($AIT_DATA_DIR: default runs, measured baselines) and
    private hidden-eval seeds file ($AIT_SECRETS_FILE, made only if a test chooses private seeds), so no test
    reads or writes the user's own (~/.local/share/ai-trains-ai, ~/.config/ai-trains-ai)."""
    path = tmp_path / "ait-data"
    monkeypatch.setenv("AIT_DATA_DIR", str(path))
    monkeypatch.setenv("AIT_SECRETS_FILE", str(tmp_path / "ait-config" / "secrets.json"))   # never ~/.config
    monkeypatch.setenv("AIT_HIDDEN_SEEDS", "published")   # restored after a test that chose otherwise
    return path


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
    from cpu.tiny_models.chat import render

    f = get_family("arithmetic")
    return [render(f.eval_messages(i) + f.transcript(i), f.tool_schemas()) for i in f.generate(1, n)]


@pytest.fixture(scope="session")
def micro_tokenizer() -> ChatTokenizer:
    from cpu.tiny_models.tokenizer import ChatTokenizer, train_tokenizer

    return ChatTokenizer(train_tokenizer(_texts(), 512))


@pytest.fixture(scope="session")
def micro_model(micro_tokenizer: ChatTokenizer, tmp_path_factory: pytest.TempPathFactory) -> TinyLM:
    """A 2-layer model briefly fitted to correct arithmetic transcripts (so it emits tool calls).

    Fitted once per test run: under xdist the first worker to need it saves its weights in the run's shared
    temporary folder (the parent of each worker's own), under a file lock, named by the tokenizer's
    vocabulary; the other worker loads them. Never shared between runs."""
    import torch

    from cpu.tiny_models.model import TinyConfig, TinyLM
    import hashlib
    import os

    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base   # pytest-N/, not pytest-of-<user>/
    vocab = hashlib.sha256(micro_tokenizer.tok.to_str().encode()).hexdigest()[:16]
    path = shared / f"micro_model-{vocab}.pt"
    with FileLock(str(path) + ".lock"):
        if path.is_file():
            m = TinyLM(TinyConfig(vocab_size=micro_tokenizer.vocab_size, max_position_embeddings=1024))
            m.load_state_dict(torch.load(path, weights_only=True))
            return m.eval()
        m = _fit_micro_model(micro_tokenizer)
        torch.save(m.state_dict(), path)
        return m


def _fit_micro_model(micro_tokenizer: ChatTokenizer) -> TinyLM:
    import torch

    from cpu.tiny_models.model import TinyConfig, TinyLM
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
