"""Real TRL ``GRPOTrainer`` steps on CPU against AIT/JobWriting-v0 (stub backend), with a policy built from
the project's own tiny model (TinyLM saved in HF Llama format, loaded by transformers). The policy is fitted
for a few seconds to answer with a ``submit_job`` or a ``list_files`` call, so TRL really parses and runs
tool calls and the env's rewards differ within a group (invalid 0 vs unparsable -0.1); it writes no job."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl", reason="install the TRL extra: pip install -e '.[trl]' (bash scripts/test_trl.sh)")

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from ait_env.backends import make_backend
from ait_env.config import compose
from ait_env.integrations.trl import EnvironmentFactory, JobWritingToolEnv, prepare_tokenizer
from cpu.tiny_models.chat import IM_END, render
from cpu.tiny_models.model import TinyConfig, TinyLM
from cpu.tiny_models.tokenizer import ChatTokenizer, train_tokenizer
from ait_env.episode.tools import tool_schemas

ROOT = Path(__file__).resolve().parents[2]
CALLS = ("submit_job", "list_files")


def _turn(call: str) -> str:
    return '<tool_call>{"name": "' + call + '", "arguments": {}}</tool_call>' + IM_END


def _factory(runs: Path) -> EnvironmentFactory:
    backend = make_backend(compose(backend="stub").backend, runs)
    return EnvironmentFactory(backend, family="arithmetic", overrides={"env": {"runs_dir": str(runs),
                                                                              "max_turns": 6}})


@pytest.fixture(scope="module")
def micro_policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A TinyLM fitted on the env's real prompts to answer with either call (about 50/50), saved as an HF
    folder (config.json, model.safetensors, tokenizer with the local chat template)."""
    runs = tmp_path_factory.mktemp("fit")
    with _factory(runs) as factory:
        env = factory()
        prompts = []
        for row in factory.dataset(2, seed=0):
            messages = row["prompt"][:-1] + [{"role": "user", "content": env.reset(**row)}]
            prompts.append(render(messages, tool_schemas(), add_generation_prompt=True))
        factory.backend.close()
    texts = [p + _turn(c) for p in prompts for c in CALLS]
    tok = ChatTokenizer(train_tokenizer(texts, 1024))
    torch.manual_seed(0)
    model = TinyLM(TinyConfig(vocab_size=tok.vocab_size, max_position_embeddings=4096,
                              eos_token_id=tok.im_end_id, pad_token_id=tok.pad_id))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    # both answers to one prompt per step, until the fit is within two coin flips (log 2 each, spread over the
    # answer's tokens: the floor is one) plus 0.01; a loose fit (80 steps passed at loss 0.5 on one CPU) samples
    # garbled calls on another, and a fixed bound (0.08) failed on a third at 0.082 = two coin flips exactly
    for step in range(600):
        prompt = prompts[step % len(prompts)]
        seqs = [tok.encode(prompt + _turn(c)) for c in CALLS]
        width = max(map(len, seqs))
        ids = torch.tensor([s + [tok.pad_id] * (width - len(s)) for s in seqs])
        mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
        answer = mask[:, 1:].clone()
        answer[:, :len(tok.encode(prompt)) - 1] = 0  # learn the answers only
        loss = -(model.sequence_logprobs(ids, mask) * answer).sum() / answer.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        # the floor: a perfect fit still flips one coin (log 2) per answer, spread over this step's answer tokens
        floor = 2 * math.log(2) / answer.sum().item()
        if step >= 80 and loss.item() < 2 * floor + 0.01:
            break
    assert loss.item() < 2 * floor + 0.01, (f"the micro policy did not fit (loss {loss.item():.3f}, floor {floor:.3f}, "
                                        f"after {step + 1} steps)")
    folder = tmp_path_factory.mktemp("policy")
    model.save(folder)
    tok.save(folder, model_max_length=4096)
    return folder


def test_grpo_steps_learn_from_the_envs_rewards(micro_policy: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    returned: list[float | None] = []  # what get_reward gave TRL, rollout by rollout
    statuses: list[str] = []
    real = JobWritingToolEnv.get_reward

    def recorded(self: JobWritingToolEnv) -> float | None:
        reward = real(self)
        statuses.append(self.info["reward"]["status"])
        # the first rollout of each batch stands for an infra_failed episode: no reward
        returned.append(None if len(returned) % 8 == 0 else reward)
        return returned[-1]

    monkeypatch.setattr(JobWritingToolEnv, "get_reward", recorded)
    model = AutoModelForCausalLM.from_pretrained(micro_policy)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with _factory(tmp_path) as factory:
        config = GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, max_steps=2,
                            per_device_train_batch_size=8, num_generations=4, max_completion_length=96,
                            learning_rate=1e-3, logging_steps=1, report_to="none", save_strategy="no", seed=0)
        tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(micro_policy))
        trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=config,
                              train_dataset=factory.dataset(2, seed=0), environment_factory=factory)
        trainer.train()
        factory.backend.close()

    logs = [h for h in trainer.state.log_history if "rewards/JobWritingToolEnv/mean" in h]
    assert len(logs) == 2 and len(returned) == 16
    assert set(statuses) <= {"invalid", "unparsable"} and "invalid" in statuses  # submit_job ran
    for i, log in enumerate(logs):  # TRL's reward is the env's; the None is left out, not counted as 0
        kept = [r for r in returned[8 * i:8 * i + 8] if r is not None]
        assert len(kept) == 7
        assert log["rewards/JobWritingToolEnv/mean"] == pytest.approx(sum(kept) / len(kept), abs=1e-6)
        assert log["reward"] == pytest.approx(sum(kept) / len(kept), abs=1e-6)
        assert log["tools/call_frequency"] > 0
    assert any(log["reward_std"] > 0 for log in logs)
    changed = [k for k, v in model.state_dict().items() if not torch.equal(before[k], v)]
    assert changed, "GRPO steps left every weight unchanged"
    assert all(math.isfinite(v.abs().sum().item()) for v in model.state_dict().values())


def test_example_runs_in_a_micro_configuration(micro_policy: Path, tmp_path: Path) -> None:
    env = {**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1", "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, str(ROOT / "examples" / "trl_grpo.py"), "--model", str(micro_policy),
           "--family", "arithmetic", "--max-steps", "1", "--batch-size", "4", "--num-generations", "4",
           "--max-completion-length", "64", "--max-turns", "6", "--rows", "2", "--learning-rate", "1e-3",
           "--runs-dir", str(tmp_path / "runs")]
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "step    1  env reward" in out.stdout
    assert (tmp_path / "runs" / "policy" / "model.safetensors").exists()


@pytest.mark.slow
def test_a_grpo_step_on_smollm2_whose_template_the_adapter_fixed(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A real instruction-tuned model (SmolLM2-135M-Instruct, from the model cache) in GRPOTrainer with the env:
    its own template has no tools, which TRL refuses; after :func:`prepare_tokenizer` TRL renders the env's tools,
    samples, runs the episode and takes a step. About 2 minutes on 2 CPU cores."""
    from ait_env.agent_models.catalog import model_dir

    folder = model_dir("smollm2-135m")
    if not (folder / "model.safetensors").is_file():
        pytest.skip(f"the agent model is not in the model cache ({folder}): python -m ait_env.agent_models.obtain")
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    raw = AutoTokenizer.from_pretrained(folder)
    with _factory(tmp_path) as factory:
        config = GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, max_steps=1,
                            per_device_train_batch_size=2, num_generations=2, max_completion_length=48,
                            learning_rate=1e-6, logging_steps=1, report_to="none", save_strategy="no", seed=0)
        with pytest.raises(ValueError, match="does not support tool calling"):
            GRPOTrainer(model=model, processing_class=raw, args=config, train_dataset=factory.dataset(1, seed=0),
                        environment_factory=factory)
        trainer = GRPOTrainer(model=model, processing_class=prepare_tokenizer(raw), args=config,
                              train_dataset=factory.dataset(1, seed=0), environment_factory=factory)
        trainer.train()
        factory.backend.close()
    logs = [h for h in trainer.state.log_history if "rewards/JobWritingToolEnv/mean" in h]
    assert len(logs) == 1 and math.isfinite(logs[0]["rewards/JobWritingToolEnv/mean"])
