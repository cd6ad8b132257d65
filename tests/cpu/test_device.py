"""The local backend's ``device`` setting: parsing everywhere, and (where torch sees a GPU) that the
model, the engine, generation and a GRPO step on the GPU compute what they compute on the CPU."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cpu import grpo# noqa: E402
from cpu.tiny_models.engine import Engine, EngineRequest  # noqa: E402
from cpu.tiny_models.model import TinyConfig, TinyLM, generate, resolve_device  # noqa: E402
from ait_env.backends.local import LocalOptions  # noqa: E402

GPU = torch.cuda.is_available()
OTHER = "cuda"   # the device compared with the CPU (a check of these tests themselves may set "cpu")
needs_gpu = pytest.mark.skipif(not GPU, reason="torch sees no GPU (run on a GPU machine)")


def test_resolve_device() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if GPU else "cpu")
    with pytest.raises(ValueError, match="unknown device"):
        resolve_device("gpu0")
    with pytest.raises(ValueError, match="not supported"):
        resolve_device("meta")
    if not GPU:
        with pytest.raises(ValueError, match="sees no GPU"):
            resolve_device("cuda")


def test_local_backend_default_is_cpu() -> None:
    assert LocalOptions().device == "cpu"
    assert LocalOptions.model_validate({"device": "auto"}).device == "auto"


def _pair() -> tuple[TinyLM, TinyLM]:
    torch.manual_seed(0)
    cpu = TinyLM(TinyConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128))
    for p in cpu.parameters():  # larger weights than the init: decisive logits, so greedy paths agree
        p.data.normal_(0, 0.3)
    gpu = TinyLM(cpu.cfg)
    gpu.load_state_dict(cpu.state_dict())
    return cpu, gpu.to(OTHER)


@needs_gpu
def test_forward_and_generate_match_cpu() -> None:
    cpu, gpu = _pair()
    assert gpu.device.type == OTHER
    ids = torch.randint(3, 97, (3, 11))
    mask = torch.ones(3, 11, dtype=torch.long)
    a = cpu.sequence_logprobs(ids, mask)
    b = gpu.sequence_logprobs(ids.to(OTHER), mask.to(OTHER)).cpu()
    assert (a - b).abs().max() < 1e-3
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12], [13]]
    ga = generate(cpu, prompts, max_new_tokens=12, temperature=0, stop_ids={2})
    gb = generate(gpu, prompts, max_new_tokens=12, temperature=0, stop_ids={2})
    assert [g.tokens for g in ga] == [g.tokens for g in gb]
    # a CPU generator samples on the CPU: the same draws on both devices
    sa = generate(cpu, prompts, max_new_tokens=12, temperature=1.0, generator=torch.Generator().manual_seed(3))
    sb = generate(gpu, prompts, max_new_tokens=12, temperature=1.0, generator=torch.Generator().manual_seed(3))
    assert [g.tokens for g in sa] == [g.tokens for g in sb]


@needs_gpu
def test_engine_matches_cpu() -> None:
    outs: dict[str, list[list[int]]] = {"a": [], "b": []}
    for name, model in zip(("a", "b"), _pair()):
        eng = Engine(model, stop_id=2, slots=2, columns=8)  # small: the caches must grow on the device
        for i, prompt in enumerate([[5, 6, 7], [8, 9, 10, 11, 12], [13, 14]]):
            eng.admit([EngineRequest(prompt, 20, 0.8, torch.Generator().manual_seed(i),
                                     lambda g, n=name: outs[n].append(g.tokens), lambda e: (_ for _ in ()).throw(e))])
            eng.step()
        while not eng.idle:
            eng.step()
        assert eng.k[0].device.type == model.device.type
    assert len(outs["a"]) == 3 and sorted(outs["a"]) == sorted(outs["b"])


@needs_gpu
def test_grpo_step_on_gpu_matches_cpu() -> None:
    from ait_env.jobs.schema import PrimeRL

    p = PrimeRL.model_validate({"max_steps": 1, "optim": {"lr": 1e-3}})
    seqs = [([5, 6, 7, 8, 9], [0, 0, 1, 1, 1], [0.0, 0.0, -2.0, -2.5, -1.0]),
            ([5, 6, 10, 11], [0, 0, 1, 1], [0.0, 0.0, -1.5, -2.0])]
    batch = grpo.make_batch(seqs, [1.0, -1.0], pad_id=0, max_len=64)
    after = []
    for model in _pair():
        opt = grpo.make_optimizer(model, p, lr_scale=1.0)
        m = grpo.train_step(model, opt, batch, p, lr=1e-3)
        assert m["grad_norm"] > 0
        after.append({k: v.detach().cpu() for k, v in model.state_dict().items()})
    assert all((after[0][k] - after[1][k]).abs().max() < 1e-4 for k in after[0])
