"""The shared-GPU rule (gpu/gpu_share.py) against vLLM 0.24.0's own memory arithmetic (issue 48, item 3).

vLLM decides its KV cache in ``v1/worker/gpu_worker.py`` ``determine_available_memory``: with
``kv_cache_memory_bytes`` set it reserves exactly that; otherwise ``requested - non_kv_cache_memory``, where
``requested = total x gpu_memory_utilization`` (``v1/worker/utils.py`` ``request_memory``, which also refuses
to start when less than that is free) and ``non_kv_cache_memory = weights + torch activation peak +
non-torch increase`` (``utils/mem_utils.py`` ``memory_profiling``); the non-torch increase is the GPU's used
memory outside vLLM's torch allocator since vLLM's start (``MemorySnapshot.measure``: ``(total - free) -
torch_memory``), so memory another process takes in that window counts against vLLM's cache.
:func:`available_kv` is that arithmetic, written out here from those lines (nothing imported from vLLM)."""

from __future__ import annotations

import math

import pytest

from ait_env.jobs.gpus import GIB, KV_SEQUENCES, MODELS, OVERHEAD_GIB, trainer_need_gib
from gpu.gpu_share import colocated_kv_cache_bytes, colocated_share
from gpu.gpu_plan import plan_gpus


def available_kv(total: float, util: float, weights: float, activation_peak: float, non_torch: float,
                 other_growth: float, kv_cache_memory_bytes: float | None = None) -> float:
    """vLLM 0.24.0's KV cache (bytes) on a GPU of ``total`` bytes (module docstring); ``other_growth``: what
    another process on the GPU allocated between vLLM's start and the end of its profile run."""
    if kv_cache_memory_bytes:
        return kv_cache_memory_bytes
    requested = math.ceil(total * util)
    return requested - (weights + activation_peak + non_torch + other_growth)


@pytest.mark.parametrize("model,seq_len,gpu_gib", [("Qwen/Qwen3-0.6B", 2048, 24.0), ("Qwen/Qwen3-0.6B", 4096, 24.0),
                                                   ("Qwen/Qwen3-1.7B", 2048, 48.0)])
def test_the_trainer_loading_next_to_vllm_leaves_it_no_cache_unless_the_cache_is_fixed(model, seq_len, gpu_gib):
    size = MODELS[model]
    share = colocated_share(model, seq_len, gpu_gib)
    kv = colocated_kv_cache_bytes(model, seq_len)
    assert share is not None and kv == KV_SEQUENCES * seq_len * size.kv_bytes_per_token()
    total, weights = gpu_gib * GIB, size.params * 2
    # vLLM's own non-KV memory: its CUDA context and profile activations, the rule's overhead
    activation, non_torch = OVERHEAD_GIB * GIB / 2, OVERHEAD_GIB * GIB / 2
    trainer_load = size.params * 16          # the trainer's weights, grads and AdamW states landing meanwhile
    derived = available_kv(total, share, weights, activation, non_torch, trainer_load)
    assert derived <= 0                      # "No available memory for the cache blocks": what was seen
    alone = available_kv(total, share, weights, activation, non_torch, 0.0)
    assert alone >= kv                       # the share holds the rule's cache when vLLM is alone ...
    fixed = available_kv(total, share, weights, activation, non_torch, trainer_load, kv_cache_memory_bytes=kv)
    assert fixed == kv                       # ... and, fixed, whatever the trainer does meanwhile
    # and vLLM plus the trainer fit the GPU: vLLM's share, the trainer the rest
    assert share * gpu_gib + trainer_need_gib(model, seq_len) <= gpu_gib + 1e-9


def test_shared_mode_passes_the_fixed_cache_to_prime_rls_vllm():
    kv = colocated_kv_cache_bytes("Qwen/Qwen3-0.6B", 2048)
    one = plan_gpus([7], 1, 1, 0.3, kv)
    i = one.flags.index("--inference.vllm-extra")
    assert one.flags[i + 1] == f'{{"kv_cache_memory_bytes": {kv}}}'
    assert "--inference.vllm-extra" not in plan_gpus([0, 1], 1, 1, 0.3, kv).flags   # its own GPU: vLLM's rule
    assert "--inference.vllm-extra" not in plan_gpus([7], 1, 1, 0.3, None).flags     # unknown model
    assert colocated_kv_cache_bytes("Some/Unknown-7B", 2048) is None
