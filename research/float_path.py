"""Which settings change a build's float path, and what a portable one costs: a short pretraining of
ait-tiny-m's architecture on a small corpus under several environment settings, each in its own
single-threaded process, printing the weights hash and the seconds it took.

    python -m research.float_path                    # 150 steps (30 of them copy drills)
    python -m research.float_path --steps 30 --drill-steps 10 --repeat 1

Settings (environment variables read by torch and MKL when they start):

- ``native``: what the machine picks (AVX512 kernels on an AVX512 CPU);
- ``aten-avx2``: torch's own CPU kernels capped at AVX2 (``ATEN_CPU_CAPABILITY=avx2``);
- ``mkl-avx2``: MKL's matrix products capped at AVX2 (``MKL_ENABLE_INSTRUCTIONS=AVX2``);
- ``avx2-machine``: both capped, which is what an AVX2-only CPU runs;
- ``portable``: both capped and MKL's results made independent of the CPU generation
  (``MKL_CBWR=AVX2``): the candidate for builds that reproduce on any x86-64 CPU with AVX2.

Equal hashes mean bit-identical weights. The build itself (``cpu.tiny_models.build``) takes
``catalog.BuildSettings.float_path`` (``portable`` by default, the settings above) and records what it
ran on (``float_path`` in ``ait_model.json``); docs/local_backend.md, "Reproducibility across machines".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

SETTINGS: dict[str, dict[str, str]] = {
    "native": {},
    "aten-avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
    "mkl-avx2": {"MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "avx2-machine": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "portable": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"},
    "compatible": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE"},
}

_CHILD = """
import dataclasses, json, sys, time
import torch
torch.set_num_threads(1)
from cpu.tiny_models import catalog
from cpu.tiny_models.chat import IM_START
from cpu.tiny_models.corpus import (CORPUS_SEED, FAMILY_WEIGHTS, build_corpus, encode_corpus,
                                  train_corpus_tokenizer)
from cpu.tiny_models.pretrain import float_path, pretrain, weights_hash
from cpu.tiny_models.tokenizer import ChatTokenizer
steps, drill = int(sys.argv[1]), int(sys.argv[2])
corpus = build_corpus(60, seed=CORPUS_SEED, weights=FAMILY_WEIGHTS)
tok = ChatTokenizer(train_corpus_tokenizer(corpus.texts(), 1024))
spec = catalog.CATALOG["ait-tiny-m"]
cfg = spec.tiny_config(tok.vocab_size, tok.im_end_id, tok.pad_id, catalog.BUILD.max_position_embeddings)
pcfg = dataclasses.replace(spec.pretrain, steps=steps, drill_steps=drill)
t0 = time.perf_counter()
model, _ = pretrain(cfg, encode_corpus(tok, corpus.transcripts), pcfg, tok.pad_id,
                    start_id=tok.tok.token_to_id(IM_START), end_id=tok.im_end_id, progress=False)
print(json.dumps({"hash": weights_hash(model), "seconds": round(time.perf_counter() - t0, 1),
                  "cpu_capability": float_path()["cpu_capability"]}))
"""


def run(setting: str, steps: int, drill_steps: int) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR")}
    env.update(SETTINGS[setting])
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", _CHILD, str(steps), str(drill_steps)], env=env, check=True,
                         capture_output=True, text=True).stdout.strip().splitlines()[-1]
    return {"setting": setting, **json.loads(out)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--drill-steps", type=int, default=30)
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--repeat", type=int, default=2, help="rounds over all settings (timings interleaved)")
    a = ap.parse_args()
    for _ in range(a.repeat):
        for s in a.settings.split(","):
            print(json.dumps(run(s, a.steps, a.drill_steps)), flush=True)


if __name__ == "__main__":
    main()
