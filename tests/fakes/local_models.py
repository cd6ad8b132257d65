"""Untrained catalog models, installed the way ``python -m cpu.tiny_models.build`` installs built ones.

The default suite cannot pretrain the catalog models (minutes per model), yet some tests must run the real
entry points (``python -m ait_env.runner`` started by the local backend) in a child process, where no
monkeypatch reaches. :func:`install_untrained_models` writes, under a cache folder that the test points
``AIT_CACHE_DIR`` at, a model directory per catalog name with the catalog's architecture, a real tokenizer
trained on family transcripts, random weights and an ``ait_model.json`` carrying the catalog's current
fingerprint: the files :func:`cpu.tiny_models.catalog.verify` checks, nothing patched. The weights are
random, so these models fail every task: use them for failure paths (a job that must end ``job_failed``),
never for scores.
"""

from __future__ import annotations

from pathlib import Path

import torch

from cpu.tiny_models import catalog
from cpu.tiny_models.chat import render
from cpu.tiny_models.model import TinyLM
from cpu.tiny_models.pretrain import save_model_dir, weights_hash
from cpu.tiny_models.tokenizer import ChatTokenizer, train_tokenizer
from task_families import get_family


def _tokenizer() -> ChatTokenizer:
    fam = get_family("arithmetic")
    texts = [render(fam.eval_messages(i) + fam.transcript(i), fam.tool_schemas()) for i in fam.generate(1, 200)]
    return ChatTokenizer(train_tokenizer(texts, 512))


def install_untrained_models(cache_dir: Path, names: tuple[str, ...] = catalog.MODEL_NAMES) -> Path:
    """Install untrained ``names`` under ``cache_dir`` (set ``AIT_CACHE_DIR`` to it) and return it."""
    tok = _tokenizer()
    for name in names:
        torch.manual_seed(0)
        spec = catalog.CATALOG[name]
        model = TinyLM(spec.tiny_config(tok.vocab_size, tok.im_end_id, tok.pad_id, 1024))
        meta = {"name": name, "fingerprint": catalog.fingerprint(name), "weights_hash": weights_hash(model),
                "note": "untrained test model (tests/fakes/local_models.py)"}
        save_model_dir(Path(cache_dir) / name, model, tok, meta)
    return Path(cache_dir)
