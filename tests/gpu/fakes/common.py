"""What both fakes share: loguru-like lines, the test's model folders, the local endpoint with ``/health``.

Read by ``fake_rl.py`` and ``fake_vllm.py`` (run as scripts by the executor under test). Test plumbing
arrives in the environment, the way ``backend.options.env`` passes variables to prime-rl and vLLM:

- ``FAKE_PRIMERL_MODELS``: JSON ``{model id: HF folder}`` of the micro models (what prime-rl would
  download from the hub);
- ``FAKE_PRIMERL_SCENARIO``: what ``fake_rl.py`` simulates (see its docstring);
- ``FAKE_VLLM_RECORD``: a file ``fake_vllm.py`` appends each launch to (argv and the VLLM_* variables).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


def logline(level: str, message: str) -> str:
    """A line in loguru's format as prime-rl configures it (``HH:mm:ss <LEVEL:>7> message``), coloured."""
    stamp = time.strftime("%H:%M:%S")
    return f"\x1b[2m{stamp}\x1b[0m \x1b[1m{level:>7}\x1b[0m\x1b[1m \x1b[22m{message}\x1b[0m"


def models() -> dict[str, str]:
    return json.loads(os.environ.get("FAKE_PRIMERL_MODELS", "{}"))


def scenario() -> str:
    return os.environ.get("FAKE_PRIMERL_SCENARIO", "success")


def serve_local(model_dir: str | Path, name: str, host: str, port: int,
                max_model_len: int | None = None) -> Any:
    """The project's :class:`~cpu.tiny_models.endpoint.LocalEndpoint` for an HF folder (it answers vLLM's
    ``GET /health`` too)."""
    from cpu.tiny_models import endpoint
    from cpu.tiny_models.model import TinyLM
    from cpu.tiny_models.tokenizer import ChatTokenizer

    model = TinyLM.load(model_dir)
    limit = min(max_model_len or 10**9, model.cfg.max_position_embeddings)
    return endpoint.LocalEndpoint(model, ChatTokenizer.load(model_dir), name, host=host, port=port,
                                  max_model_len=limit).start()


def wait_forever() -> None:
    while True:
        time.sleep(3600)
