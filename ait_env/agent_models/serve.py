"""Serve an agent model as an OpenAI-compatible chat endpoint on this machine.

    python -m ait_env.agent_models.serve [smollm2-135m | <checkpoint folder>] [--port 8077] [--threads 2]
    python -m ait_env.agents.llm --base-url http://127.0.0.1:8077/v1 --model smollm2-135m --tool-mode text ...

Contract: the project's endpoint (:class:`cpu.tiny_models.endpoint.LocalEndpoint`: continuous batching of
concurrent requests, keys/values of a conversation's earlier turns reused) over the model in the project's
Llama engine, rendering with the model's own chat template (:class:`ait_env.agent_models.load.TemplateTokenizer`).
The reply's text is returned unchanged as ``content`` (no tool-call parsing: a template without tools means
text tool mode; requests that send ``tools`` get HTTP 400, which ``--tool-mode auto`` reads as "use text").
``GET /v1/models`` lists the model with its ``ait_weights_hash``. It listens on 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import signal
import threading
from typing import Any

from ait_env.agent_models.load import AgentModel, load_agent
from cpu.tiny_models.endpoint import LocalEndpoint


class AgentEndpoint(LocalEndpoint):
    """The local endpoint for an agent model (module docstring)."""

    def __init__(self, agent: AgentModel, *, model_name: str | None = None, port: int = 0, seed: int = 0,
                 **kwargs: Any) -> None:
        self.agent = agent
        kwargs.setdefault("engine_slots", 4)
        kwargs.setdefault("held_tokens", 48_000)   # ~2.2 GB of keys/values for SmolLM2-135M
        super().__init__(agent.model, agent.tok, model_name or agent.name, host="127.0.0.1", port=port, seed=seed,
                         parse_tool_calls=False, **kwargs)

    async def _models(self, request: Any) -> Any:  # noqa: ARG002
        from aiohttp import web

        return web.json_response({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "owned_by": "ai-trains-ai", "max_model_len": self.max_model_len,
             "ait_weights_hash": self.agent.weights_hash, "ait_source": self.agent.meta.get("package", "")}]})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ait_env.agent_models.serve", description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default="smollm2-135m", help="a catalog name or a checkpoint folder")
    ap.add_argument("--port", type=int, default=8077)
    ap.add_argument("--name", help="the model id clients send (default: the model's name)")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch threads (0: torch's default; 1 on a machine busy with other work)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    import torch

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    agent = load_agent(args.model)
    ep = AgentEndpoint(agent, model_name=args.name, port=args.port, seed=args.seed).start()
    print(f"serving {ep.model_name} (weights {agent.weights_hash}, {agent.path}) at {ep.base_url}; Ctrl-C stops it",
          flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    ep.stop()
    return 0


if __name__ == "__main__":
    from ait_env.agent_models.serve import main as _main

    raise SystemExit(_main())
