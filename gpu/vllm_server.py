"""vLLM as the hidden eval's OpenAI-compatible server: one launch command, one server lifetime.

The version is the one prime-rl v0.7.0 locks: ``uv.lock`` at commit d334ea52 pins ``vllm 0.24.0+cu129``.
Every flag below was read in the vLLM 0.24.0 wheel's source (paths inside the ``vllm`` package):

- ``vllm serve <model_tag>``: the ``vllm`` console script is ``vllm.entrypoints.cli.main:main``
  (the wheel's ``entry_points.txt``); ``serve`` takes the model as the positional ``model_tag``
  (``entrypoints/cli/serve.py`` ``ServeSubcommand``, ``entrypoints/openai/cli_args.py``
  ``make_arg_parser``);
- ``--host``, ``--port``, ``--disable-uvicorn-access-log``: ``FrontendArgs`` in
  ``entrypoints/openai/cli_args.py`` (booleans are ``argparse.BooleanOptionalAction``:
  ``engine/arg_utils.py`` ``_compute_kwargs``);
- ``--enable-auto-tool-choice``, ``--tool-call-parser``, ``--default-chat-template-kwargs`` (JSON):
  ``BaseFrontendArgs`` in the same file; ``validate_parsed_serve_args`` refuses auto tool choice without
  a parser; ``hermes`` is registered in ``tool_parsers/__init__.py``;
- ``--served-model-name``, ``--max-model-len``, ``--gpu-memory-utilization``, ``--enforce-eager``:
  ``EngineArgs.add_cli_args`` in ``engine/arg_utils.py``. At start vLLM refuses a utilization above the
  GPU's free share (``v1/worker/utils.py`` ``request_memory``): one vLLM per GPU at a time.
- its runtime folder: vLLM puts its ZMQ IPC sockets at ``$VLLM_RPC_BASE_PATH/<uuid4>`` (``envs.py``:
  default ``tempfile.gettempdir()``, i.e. ``$TMPDIR``; ``utils/network_utils.py`` ``get_open_zmq_ipc_path``),
  and a Unix socket path is at most 107 bytes: a worker ``TMPDIR`` over 70 characters would fail every
  start. The server gets its own short folder (``/tmp/ait-v-*``, mode 0700) as ``TMPDIR`` and
  ``VLLM_RPC_BASE_PATH``, whatever the worker's, removed when it stops;
- readiness: ``GET /health`` answers 200 once the engine is up (``entrypoints/serve/instrumentator/
  health.py``) and ``GET /v1/models`` lists the served name (``entrypoints/openai/models/api_router.py``).

The tool-call parser follows prime-rl v0.7.0's own choice for its policy server
(``packages/prime-rl-configs/src/prime_rl/utils/parsers.py``: ``^Qwen/Qwen3-`` -> ``hermes``, after the
Qwen3.5 / Qwen3-Coder entries; no reasoning parser for Qwen3 instruct models, so ``<think>`` stays in
the content, which the harness strips), and the server gets the two variables prime-rl sets for its
own vLLM (``src/prime_rl/inference/server.py`` ``setup_vllm_env``: ``VLLM_USE_V2_MODEL_RUNNER=0``,
``VLLM_ENFORCE_STRICT_TOOL_CALLING=0``), so the hidden eval samples the way training did.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from ait_env.runner import InfraFailed, Served
from ait_env.processes import ProcessTree

#: prime-rl v0.7.0 ``TOOL_CALL_PARSER_PATTERNS`` (utils/parsers.py), the Qwen3 entries in their order
_TOOL_PARSERS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"^Qwen/Qwen3\.5-"), "qwen3_coder"),
    (re.compile(r"^Qwen/Qwen3-Coder"), "qwen3_coder"),
    (re.compile(r"^Qwen/Qwen3-"), "hermes"),
]

#: the eval server's own runtime folder, /tmp/ait-v-XXXXXXXX (module docstring): its sockets' paths are 56 characters
RUNTIME_PREFIX = "ait-v-"

#: what prime-rl's ``setup_vllm_env`` sets for its policy server (src/prime_rl/inference/server.py)
VLLM_ENV = {"VLLM_USE_V2_MODEL_RUNNER": "0", "VLLM_ENFORCE_STRICT_TOOL_CALLING": "0"}


def tool_call_parser_for(model: str) -> str | None:
    """vLLM's tool-call parser for a model id, as prime-rl v0.7.0 resolves it (None: no parser; the
    harness then reads ``<tool_call>`` blocks from the content itself)."""
    for pattern, name in _TOOL_PARSERS:
        if pattern.search(model):
            return name
    return None


def build_serve_command(model: str | Path, *, served_model_name: str, port: int, host: str = "127.0.0.1",
                        max_model_len: int, gpu_memory_utilization: float, tool_call_parser: str | None,
                        chat_template_kwargs: dict[str, Any] | None = None, enforce_eager: bool = False,
                        vllm_cmd: tuple[str, ...] | list[str] = ("vllm",)) -> list[str]:
    """THE vLLM 0.24.0 launch command of the hidden eval (every flag: see the module docstring).
    ``model``: a hub id or a local HF weights folder (``weights/step_N``)."""
    cmd = [*vllm_cmd, "serve", str(model), "--served-model-name", served_model_name, "--host", host,
           "--port", str(port), "--max-model-len", str(max_model_len),
           "--gpu-memory-utilization", f"{gpu_memory_utilization:g}", "--disable-uvicorn-access-log"]
    if tool_call_parser:
        cmd += ["--enable-auto-tool-choice", "--tool-call-parser", tool_call_parser]
    if chat_template_kwargs:
        cmd += ["--default-chat-template-kwargs", json.dumps(chat_template_kwargs, sort_keys=True)]
    if enforce_eager:
        cmd.append("--enforce-eager")
    return cmd


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""
    except (OSError, ValueError):
        return 0, b""


class VllmServer:
    """``vllm serve`` for the duration of a ``with`` block (or :meth:`start` / :meth:`stop`).

    :meth:`start` returns once ``/health`` is 200 and ``/v1/models`` lists ``served_model_name``;
    a process that exits first, or a server not ready within ``startup_timeout_s``, raises
    :class:`~ait_env.runner.InfraFailed` with the end of its log (a server that does not start says
    nothing about the job). :meth:`stop` ends the server and every process it started."""

    def __init__(self, model: str | Path, *, served_model_name: str, env: dict[str, str], log_path: Path,
                 max_model_len: int, gpu_memory_utilization: float = 0.85,
                 tool_call_parser: str | None = None, chat_template_kwargs: dict[str, Any] | None = None,
                 enforce_eager: bool = False,
                 vllm_cmd: tuple[str, ...] | list[str] = ("vllm",), startup_timeout_s: float = 900.0,
                 kill_grace_s: float = 20.0, port: int | None = None) -> None:
        self.served_model_name = served_model_name
        self.host = "127.0.0.1"
        self.port = port or free_port(self.host)
        self.command = build_serve_command(
            model, served_model_name=served_model_name, port=self.port, host=self.host,
            max_model_len=max_model_len, gpu_memory_utilization=gpu_memory_utilization,
            tool_call_parser=tool_call_parser, chat_template_kwargs=chat_template_kwargs,
            enforce_eager=enforce_eager, vllm_cmd=vllm_cmd)
        self.env = {**env, **VLLM_ENV}
        self.runtime_dir: Path | None = None   # made by start(): the short TMPDIR and VLLM_RPC_BASE_PATH
        self.log_path = Path(log_path)
        self.startup_timeout_s = startup_timeout_s
        self.tree = ProcessTree(grace_s=kill_grace_s)
        self._started = False

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def served(self) -> Served:
        return Served(self.base_url, self.served_model_name)

    def log_tail(self, chars: int = 1500) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def start(self) -> Served:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.runtime_dir = Path(tempfile.mkdtemp(prefix=RUNTIME_PREFIX, dir="/tmp"))
        env = {**self.env, "TMPDIR": str(self.runtime_dir), "VLLM_RPC_BASE_PATH": str(self.runtime_dir)}
        with open(self.log_path, "ab") as log:
            try:
                self.tree.start(self.command, env=env, stdout=log)
            except FileNotFoundError:
                self.stop()
                raise InfraFailed(f"vLLM's command {self.command[0]!r} was not found: install vLLM 0.24.0 "
                                  "(prime-rl v0.7.0's pin) or set backend.options.vllm_cmd") from None
        self._started = True
        deadline = time.monotonic() + self.startup_timeout_s
        try:
            while True:
                rc = self.tree.poll()
                if rc is not None:
                    raise InfraFailed(f"vLLM exited with code {rc} before it was ready ({self.log_path}):\n"
                                      f"{self.log_tail()}")
                if self.ready():
                    return self.served
                if time.monotonic() > deadline:
                    raise InfraFailed(f"vLLM was not ready within {self.startup_timeout_s:.0f} s "
                                      f"(backend.options.vllm_startup_timeout_s; {self.log_path}):\n"
                                      f"{self.log_tail()}")
                time.sleep(0.5)
        except BaseException:
            self.stop()
            raise

    def ready(self) -> bool:
        """``/health`` is 200 and ``/v1/models`` lists the served name."""
        root = f"http://{self.host}:{self.port}"
        if _get(root + "/health")[0] != 200:
            return False
        status, body = _get(root + "/v1/models")
        if status != 200:
            return False
        try:
            return any(m.get("id") == self.served_model_name for m in json.loads(body).get("data", []))
        except (ValueError, AttributeError):
            return False

    def stop(self) -> None:
        if self._started:
            self.tree.kill()
        if self.runtime_dir is not None:
            shutil.rmtree(self.runtime_dir, ignore_errors=True)
            self.runtime_dir = None

    def __enter__(self) -> Served:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
