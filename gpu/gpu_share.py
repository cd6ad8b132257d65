"""vLLM's share of a GPU it shares with prime-rl's trainer (the one-GPU "shared" mode), by one stated rule.

Contract: :func:`colocated_kv_cache_bytes` is the KV cache vLLM is given there, fixed (not derived from
its memory profile, which the trainer starting next to it would shrink); :func:`colocated_share` returns the ``--inference.gpu-memory-utilization`` for a model, the job's
``seq_len`` and the GPU's memory, or None when the model or the GPU memory is unknown (the executor then
uses ``GpuOptions.colocated_gpu_memory_utilization``'s fallback); :func:`gpu_memory_gib` reads a GPU's
memory from ``nvidia-smi``.

The rule (UNMEASURED: no GPU run has checked it yet; ``docs/gpu.md`` says so):

    vLLM needs  = weights (params x 2 bytes, bf16)
                + KV cache for KV_SEQUENCES sequences of seq_len tokens
                  (2 x layers x kv_heads x head_dim x 2 bytes per token)
                + OVERHEAD_GIB (CUDA context, activations of the profile run, CUDA graphs)
    share       = needs / GPU memory, rounded up to 0.01, within [MIN_SHARE, MAX_SHARE]

vLLM refuses to start when its share cannot hold the weights and one ``max_model_len`` sequence of KV
cache (vllm 0.24.0 ``v1/core/kv_cache_utils.py`` ``check_enough_kv_cache_memory``), which is why the
executor passes ``--inference.model.max-model-len <seq_len>`` (prime-rl v0.7.0
``packages/prime-rl-configs/src/prime_rl/configs/inference.py`` ``ModelConfig.max_model_len``; unset, vLLM
takes the model's 40,960 tokens for Qwen3). The trainer gets the rest of the GPU. The geometry below is
from the models' ``config.json`` (Qwen3-0.6B and -1.7B: 28 layers, 8 KV heads of 128; tied embeddings).
"""

from __future__ import annotations

import math
import subprocess

# the model geometry and vLLM's need are the one GPU rule's (ait_env/jobs/gpus.py), which also decides 1 or 2 GPUs
from ait_env.jobs.gpus import GIB, KV_SEQUENCES, MODELS, OVERHEAD_GIB, ModelSize, vllm_need_gib

__all__ = ["GIB", "KV_SEQUENCES", "MAX_SHARE", "MIN_SHARE", "MODELS", "OVERHEAD_GIB", "ModelSize",
           "colocated_kv_cache_bytes", "colocated_share", "gpu_memory_gib", "vllm_need_gib"]

MIN_SHARE = 0.10
MAX_SHARE = 0.50          # the trainer keeps at least half of the GPU


def colocated_kv_cache_bytes(model: str, seq_len: int) -> int | None:
    """The KV cache vLLM gets on a shared GPU, in bytes: the rule's ``KV_SEQUENCES`` sequences of ``seq_len``
    (None: unknown model). Passed as vLLM's ``kv_cache_memory_bytes`` (``--inference.vllm-extra``; prime-rl
    v0.7.0 ``src/prime_rl/inference/vllm/server.py`` ``server`` sets each key on vLLM's namespace), vLLM 0.24
    reserves exactly this and skips deriving it from its memory profile (``v1/worker/gpu_worker.py``
    ``determine_available_memory``). Derived, it would be ``requested - (weights + activation peak +
    non-torch increase)`` where the non-torch increase is the GPU's used memory outside vLLM's torch since
    vLLM's start (``utils/mem_utils.py`` ``MemorySnapshot.non_torch_memory``, ``memory_profiling``): the
    trainer loading its model next to it lands there, and the cache shrinks to nothing ("No available memory
    for the cache blocks"). Fixed, it does not depend on when the trainer starts."""
    size = MODELS.get(model)
    if size is None:
        return None
    return KV_SEQUENCES * seq_len * size.kv_bytes_per_token()


def colocated_share(model: str, seq_len: int, gpu_gib: float | None) -> float | None:
    """vLLM's ``gpu_memory_utilization`` on a shared GPU by the rule (module docstring), or None."""
    need = vllm_need_gib(model, seq_len)
    if need is None or not gpu_gib:
        return None
    share = math.ceil(need / gpu_gib * 100) / 100
    return min(MAX_SHARE, max(MIN_SHARE, share))


def gpu_memory_gib(index: int) -> float | None:
    """Total memory of GPU ``index`` (``nvidia-smi --query-gpu=index,memory.total``, MiB), or None."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(index) and parts[1].isdigit():
            return int(parts[1]) / 1024
    return None
