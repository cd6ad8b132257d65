"""A fake ``vllm`` executable: the vLLM 0.24.0 ``serve`` CLI subset the executor uses, served by the
local endpoint.

    python fake_vllm.py serve <HF folder> --served-model-name N --host H --port P --max-model-len L
        --gpu-memory-utilization F --disable-uvicorn-access-log
        [--enable-auto-tool-choice --tool-call-parser X] [--default-chat-template-kwargs JSON]
        [--enforce-eager]

Any other flag is an argparse error (exit 2), like vLLM's parser; ``--enable-auto-tool-choice`` without a
parser is refused as vLLM's ``validate_parsed_serve_args`` does. The model must be a local folder with
``TinyLM`` / ``ChatTokenizer`` files (a hub id fails: nothing is downloaded here). It serves that folder
through :class:`~cpu.tiny_models.endpoint.LocalEndpoint` (which answers ``GET /health`` as vLLM does), so the hidden eval
really scores those weights, and starts one helper process (like vLLM's engine core) that lives as long
as it. Like vLLM, it binds a ZMQ IPC socket at ``$VLLM_RPC_BASE_PATH/<uuid4>`` (default
``tempfile.gettempdir()``: vllm 0.24.0 ``envs.py``, ``utils/network_utils.py`` ``get_open_zmq_ipc_path``) and
exits 1 when the kernel refuses the path (over 107 bytes, ``sun_path``), as vLLM's ``ZMQError`` ends it.
``FAKE_VLLM_HANG=1``: never becomes ready. Each launch is appended to ``FAKE_VLLM_RECORD``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from tests.gpu.fakes.common import serve_local, wait_forever


def main() -> int:
    ap = argparse.ArgumentParser(prog="vllm")
    sub = ap.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve")
    serve.add_argument("model_tag")
    serve.add_argument("--served-model-name", required=True)
    serve.add_argument("--host", required=True)
    serve.add_argument("--port", type=int, required=True)
    serve.add_argument("--max-model-len", type=int, required=True)
    serve.add_argument("--gpu-memory-utilization", type=float, required=True)
    serve.add_argument("--disable-uvicorn-access-log", action="store_true")
    serve.add_argument("--enable-auto-tool-choice", action="store_true")
    serve.add_argument("--tool-call-parser")
    serve.add_argument("--default-chat-template-kwargs", type=json.loads)
    serve.add_argument("--enforce-eager", action="store_true")
    args = ap.parse_args()
    if args.enable_auto_tool_choice and not args.tool_call_parser:
        print("TypeError: Error: --enable-auto-tool-choice requires --tool-call-parser", flush=True)
        return 1
    record = os.environ.get("FAKE_VLLM_RECORD")
    if record:
        with open(record, "a") as f:
            env = {k: v for k, v in os.environ.items() if k.startswith(("VLLM_", "CUDA_VISIBLE"))}
            f.write(json.dumps({"argv": sys.argv[1:], "env": env}) + "\n")
    print(f"INFO fake vLLM 0.24.0 serving {args.model_tag} as {args.served_model_name}", flush=True)
    ipc = f"{os.environ.get('VLLM_RPC_BASE_PATH', tempfile.gettempdir())}/{uuid.uuid4()}"
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(ipc)
        os.unlink(ipc)
    except OSError as exc:
        print(f"zmq.error.ZMQError: {exc} (ipc://{ipc}, {len(ipc)} characters)", flush=True)
        return 1
    engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(10**6)"])  # the engine core
    signal.signal(signal.SIGTERM, lambda *_: (engine.terminate(), os._exit(0)))
    if os.environ.get("FAKE_VLLM_HANG") == "1":
        wait_forever()
    if not Path(args.model_tag).is_dir():
        print(f"OSError: cannot download {args.model_tag!r}: there is no network here", flush=True)
        engine.terminate()
        return 1
    serve_local(args.model_tag, args.served_model_name, args.host, args.port, args.max_model_len)
    print(f"INFO Started server process on http://{args.host}:{args.port}", flush=True)
    wait_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
