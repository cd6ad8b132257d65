"""Fixtures for the tinker-cookbook adapter tests (imported by name: a conftest.py here would shadow
tests/conftest.py): a local tokenizer registered under the pilot models."""

from __future__ import annotations

from pathlib import Path

import pytest

MODELS = ("Qwen/Qwen3-4B-Instruct-2507", "Qwen/Qwen3.6-35B-A3B")


@pytest.fixture(scope="session")
def local_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ait_env.integrations.tinker_offline import build_local_tokenizer, register_local_tokenizer

    path = build_local_tokenizer(tmp_path_factory.mktemp("tok") / "local-bpe")
    for m in MODELS:
        register_local_tokenizer(m, path)
    return path
