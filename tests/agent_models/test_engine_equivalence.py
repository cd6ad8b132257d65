"""The project's Llama engine computes what transformers' LlamaForCausalLM computes on the agent model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ait_env.agent_models.load import load_agent


def test_logits_equal_transformers(smollm2_dir: Path) -> None:
    transformers = pytest.importorskip("transformers")
    agent = load_agent(smollm2_dir)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.float32).eval()
    ids = agent.tok.encode_chat([{"role": "system", "content": "You write RL jobs."},
                                 {"role": "user", "content": "What is (3*8)+19? Reply 'Answer: <n>'."}],
                                add_generation_prompt=True)
    x = torch.tensor([ids])
    with torch.no_grad():
        ours = agent.model(x, torch.arange(len(ids))[None], None)
        theirs = hf(x).logits
    assert ours.shape == theirs.shape == (1, len(ids), 49152)
    assert float((ours - theirs).abs().max()) < 1e-3 * float(theirs.abs().max())
    assert agent.weights_hash == agent.meta["weights_hash"]
