"""How many GPUs, and how much GPU memory, one job needs: the one rule every engine sizes a job by.

Contract: :func:`gpus_for_job` takes the job's base model and ``seq_len`` and returns a :class:`GpuNeed`
(``gpus``: 1 or 2, ``min_gpu_gib``: the memory each GPU must have, ``why``). The Runpod endpoint, the
SkyPilot job's ``resources.accelerators``, the simulator and the worker's shared-mode share
(:mod:`gpu.gpu_share`) all read the model geometry and the vLLM formula from here.

The rule (UNMEASURED: no GPU run has checked it yet; it is an estimate with stated terms):

    vLLM needs    = params x 2 bytes (bf16 weights) + KV_SEQUENCES x seq_len x KV bytes per token + OVERHEAD_GIB
    trainer needs = params x 16 bytes (bf16 weights and grads, fp32 master weights and two AdamW moments)
                    + seq_len x layers x hidden x 2 bytes x ACTIVATION_FACTOR (checkpointed activations)
                    + OVERHEAD_GIB
    1 GPU  when vLLM + trainer fit in USABLE of the GPU's memory (the worker's "shared" mode),
    2 GPUs otherwise (one for vLLM, one for the trainer), each GPU holding the larger of the two.

On a 24 GiB GPU (RTX A5000, the fleet's first choice) this gives 1 GPU for Qwen3-0.6B up to seq_len
6,912 and 2 GPUs above; Qwen3-1.7B needs 2 GPUs of at least 35 GiB at seq_len 8,192 (full AdamW states:
params x 16 bytes), so not an A5000. A model the table does not know gets 2 GPUs of :data:`DEFAULT_GPU_GIB`
(never under-sized silently: add its geometry to :data:`MODELS`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GIB = 2**30
#: concurrent full-length rollouts the policy server holds at once (gpu.gpu_share's rule)
KV_SEQUENCES = 8
#: CUDA context, the profile run's activations, CUDA graphs: per process
OVERHEAD_GIB = 2.0
#: checkpointed activations of one micro-batch sequence, in units of seq_len x layers x hidden x 2 bytes
ACTIVATION_FACTOR = 4.0
#: the share of a GPU's memory a job may plan for (fragmentation, allocator slack)
USABLE = 0.9
#: the GPU memory the fleet's first GPU type has (NVIDIA RTX A5000, fleet/prices.py)
DEFAULT_GPU_GIB = 24.0


@dataclass(frozen=True)
class ModelSize:
    """A model's geometry (its ``config.json``)."""

    params: float
    layers: int
    kv_heads: int
    head_dim: int
    hidden: int

    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * 2   # K and V, bf16


#: Qwen3-0.6B and -1.7B: 28 layers, 8 KV heads of 128, hidden 1024 / 2048 (their config.json; tied embeddings)
MODELS: dict[str, ModelSize] = {
    "Qwen/Qwen3-0.6B": ModelSize(params=0.6e9, layers=28, kv_heads=8, head_dim=128, hidden=1024),
    "Qwen/Qwen3-1.7B": ModelSize(params=1.7e9, layers=28, kv_heads=8, head_dim=128, hidden=2048),
}


def vllm_need_gib(model: str, seq_len: int) -> float | None:
    """GiB vLLM needs for ``model`` at ``seq_len`` by the rule (None: unknown model)."""
    size = MODELS.get(model)
    if size is None:
        return None
    return (size.params * 2 + KV_SEQUENCES * seq_len * size.kv_bytes_per_token()) / GIB + OVERHEAD_GIB


def trainer_need_gib(model: str, seq_len: int) -> float | None:
    """GiB the trainer needs for ``model`` at ``seq_len`` by the rule (None: unknown model)."""
    size = MODELS.get(model)
    if size is None:
        return None
    activations = seq_len * size.layers * size.hidden * 2 * ACTIVATION_FACTOR
    return (size.params * 16 + activations) / GIB + OVERHEAD_GIB


@dataclass(frozen=True)
class GpuNeed:
    """What one job needs: ``gpus`` GPUs of at least ``min_gpu_gib`` GiB each, and why."""

    gpus: int
    min_gpu_gib: float
    why: str


def gpus_for_job(model: str, seq_len: int, gpu_gib: float = DEFAULT_GPU_GIB) -> GpuNeed:
    """The GPUs one job of ``model`` at ``seq_len`` needs on GPUs of ``gpu_gib`` (see the module docstring)."""
    vllm, trainer = vllm_need_gib(model, seq_len), trainer_need_gib(model, seq_len)
    if vllm is None or trainer is None:
        return GpuNeed(2, gpu_gib, f"{model} is not in ait_env/jobs/gpus.py MODELS: 2 GPUs of {gpu_gib:g} GiB "
                                   "(add its geometry to size it)")
    both = vllm + trainer
    if both <= USABLE * gpu_gib:
        return GpuNeed(1, math.ceil(both / USABLE), f"vLLM {vllm:.1f} + trainer {trainer:.1f} GiB fit one "
                                                    f"{gpu_gib:g} GiB GPU (shared mode)")
    return GpuNeed(2, math.ceil(max(vllm, trainer) / USABLE),
                   f"vLLM {vllm:.1f} + trainer {trainer:.1f} GiB exceed {USABLE:g} x {gpu_gib:g} GiB: one GPU each")
