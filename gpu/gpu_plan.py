"""Where prime-rl's children and the hidden-eval vLLM run: the GPUs this worker may use
(:func:`visible_gpus`) and their placement the way prime-rl v0.7.0's launcher assigns them
(:func:`plan_gpus`: inference on the first ``num_infer_gpus``, the trainer on the next; one GPU shared by
both with vLLM held to a share of its memory; the filesystem weight broadcast always). The facts, read at
v0.7.0, are in :mod:`gpu.primerl_executor`'s docstring ("GPUs")."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field

from ait_env.jobs.primerl import PRIME_RL_TAG
from ait_env.runner import InfraFailed


@dataclass(frozen=True)
class GpuPlan:
    """Which GPUs prime-rl's children and the eval vLLM use, and the flags that make it so."""

    visible: str                    # CUDA_VISIBLE_DEVICES of the launcher
    eval_gpu: int                   # the hidden-eval vLLM's GPU (the inference GPU)
    colocated: bool                 # inference and trainer share one GPU
    flags: list[str] = field(default_factory=list)
    share: float | None = None      # vLLM's gpu_memory_utilization in shared mode

    def describe(self) -> str:
        if self.colocated:
            return (f"inference and trainer share GPU {self.eval_gpu} (vLLM holds {self.share:g} of its memory; "
                    "filesystem weight broadcast)")
        ids = self.visible.split(",")
        return f"inference on GPU {ids[0]}, trainer on GPU(s) {','.join(ids[1:])}"


def visible_gpus(gpus: list[int] | None) -> list[int]:
    """The physical GPU ids this worker may use: ``gpus``, else ``CUDA_VISIBLE_DEVICES``, else
    nvidia-smi's."""
    if gpus is not None:
        return list(gpus)
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    if raw is not None:
        tokens = [t.strip() for t in raw.split(",") if t.strip()]
        if not all(t.isdigit() for t in tokens):
            # prime-rl's launcher parses the entries as integers (rl.py get_physical_gpu_ids)
            raise InfraFailed(f"CUDA_VISIBLE_DEVICES={raw!r} is not a list of GPU indices, which prime-rl "
                              f"{PRIME_RL_TAG}'s launcher needs; set backend.options.gpus to the indices")
        return [int(t) for t in tokens]
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [int(t) for t in out.split() if t.strip().isdigit()]


#: every run: the filesystem weight broadcast (module docstring, "GPUs")
BROADCAST_FLAGS = ["--weight-broadcast.type", "filesystem"]


def plan_gpus(gpus: list[int], num_infer: int, num_train: int, colocated_share: float,
              kv_cache_bytes: int | None = None) -> GpuPlan:
    """Place prime-rl's inference and trainer the way its launcher assigns GPUs (module docstring); in shared
    mode vLLM gets ``colocated_share`` of the GPU and, when known, a fixed KV cache of ``kv_cache_bytes``
    (:func:`gpu.gpu_share.colocated_kv_cache_bytes`)."""
    need = num_infer + num_train
    if not gpus:
        raise InfraFailed("no GPU is visible (CUDA_VISIBLE_DEVICES / nvidia-smi): the gpu backend runs "
                          "prime-rl on one or two NVIDIA GPUs (or set backend.options.gpus)")
    if len(gpus) >= need:
        return GpuPlan(visible=",".join(map(str, gpus[:need])), eval_gpu=gpus[0], colocated=False,
                       flags=list(BROADCAST_FLAGS))
    if len(gpus) == 1 and (num_infer, num_train) == (1, 1):
        g = gpus[0]
        kv = (["--inference.vllm-extra", json.dumps({"kv_cache_memory_bytes": int(kv_cache_bytes)})]
              if kv_cache_bytes else [])
        return GpuPlan(visible=f"{g},{g}", eval_gpu=g, colocated=True, share=colocated_share,
                       flags=[*BROADCAST_FLAGS, "--inference.gpu-memory-utilization", f"{colocated_share:g}", *kv])
    raise InfraFailed(f"the job's rl.toml asks for {need} GPUs ({num_infer} inference + {num_train} trainer) "
                      f"but this worker has {len(gpus)} ({gpus}); give the worker more GPUs")
