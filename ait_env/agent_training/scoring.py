"""An agent model scored as any LLM is: the LLM runner (:mod:`ait_env.agents.llm`) plays episodes against the
model's own endpoint, in text tool mode, and writes its results table and every episode's transcript.

Contract of :func:`score_agent`: the agent's current weights are served on 127.0.0.1
(:class:`ait_env.agent_models.serve.AgentEndpoint`) for the duration of the call; ``episodes`` episodes of each
family (instance seeds ``seed, seed + 1, ...``) run ``concurrency`` at a time on ``backend``; the results go to
``out`` (``results.md``/``.json``/``.png``, ``episodes.jsonl``, ``transcripts/``) and carry the model's weights
hash. Returns the runner's table (one row per family and ``all``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ait_env.agent_models.load import AgentModel
from ait_env.agent_models.serve import AgentEndpoint
from ait_env.agents import llm
from ait_env.backends import Backend


def score_agent(agent: AgentModel, families: list[str], episodes: int, *, backend: str | Backend, out: Path,
                seed: int = 0, temperature: float = 0.7, max_tokens: int = 3072, concurrency: int = 4,
                overrides: dict[str, Any] | None = None, log: Callable[[str], None] = print,
                resume: bool = False) -> dict[str, Any]:
    """Score ``agent`` with the LLM runner (module docstring); ``resume`` as :func:`ait_env.agents.llm.run`."""
    with AgentEndpoint(agent) as ep:
        settings = llm.AgentSettings(base_url=ep.base_url, model=ep.model_name, tool_mode="text",
                                     temperature=temperature, max_tokens=max_tokens, timeout_s=7200.0,
                                     max_retries=0)
        return llm.run(settings, families, episodes, backend=backend, out=Path(out), concurrency=concurrency,
                       seed=seed, overrides=overrides, log=log, resume=resume)
