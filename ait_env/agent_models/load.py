"""A cached agent model or a trained checkpoint of one, loaded for sampling and training on this machine.

Contract:
- :func:`load_agent` takes a catalog name (its cache folder, made by :func:`ait_env.agent_models.obtain.obtain`
  when missing unless ``obtain_missing=False``) or any folder written by :func:`save_checkpoint`, and returns an
  :class:`AgentModel`: the weights in the project's Llama engine (:class:`cpu.tiny_models.model.TinyLM`,
  numerically the HF ``LlamaForCausalLM`` of the same files), a :class:`TemplateTokenizer` and the folder's
  metadata with its ``weights_hash``. Every run that plays or trains the agent records that hash.
- :class:`TemplateTokenizer` renders conversations with the **model's own chat template** (Jinja, from
  ``tokenizer_config.json``). A template that declares no tools (SmolLM2's) cannot show tool schemas or
  structured tool calls: such requests raise :class:`TemplateError` (an endpoint answers them with HTTP 400,
  so ``python -m ait_env.agents.llm --tool-mode auto`` falls back to text mode, where the env's system prompt
  describes the tools and the model writes ``<tool_call>`` blocks itself).
- :func:`save_checkpoint` writes a trained model as a folder of the same kind (HF-loadable), with the base
  model's metadata, what trained it and the new weights hash.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ait_env.agent_models.catalog import CATALOG, model_dir
from ait_env.agent_models.obtain import META_FILE, obtain, read_meta
from cpu.tiny_models.model import TinyLM
from cpu.tiny_models.tokenizer import ChatTokenizer

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


class TemplateError(ValueError):
    """The conversation cannot be rendered with this model's chat template (the message says why)."""


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, list):  # OpenAI content parts
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return str(content)


class TemplateTokenizer(ChatTokenizer):
    """A :class:`ChatTokenizer` that renders with the model's own Jinja chat template."""

    def __init__(self, tok: Any, chat_template: str) -> None:
        super().__init__(tok)
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        self.chat_template = chat_template
        # the environment transformers' apply_chat_template uses (trim and lstrip blocks, sandboxed)
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        self._template = env.from_string(chat_template)
        self.supports_tools = "tools" in chat_template

    @classmethod
    def load(cls, path: str | Path) -> "TemplateTokenizer":
        from tokenizers import Tokenizer

        path = Path(path)
        cfg = json.loads((path / "tokenizer_config.json").read_text())
        template = cfg.get("chat_template")
        if not template:
            raise TemplateError(f"{path}/tokenizer_config.json has no chat_template")
        return cls(Tokenizer.from_file(str(path / "tokenizer.json")), template)

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
               add_generation_prompt: bool = False) -> str:
        if tools and not self.supports_tools:
            raise TemplateError("this model's chat template declares no tools: send no `tools` (text tool mode: "
                                "the system prompt describes the tools and the model writes <tool_call> blocks)")
        plain = []
        for m in messages:
            if not self.supports_tools and (m.get("tool_calls") or m.get("role") == "tool"):
                raise TemplateError("this model's chat template has no tool calls or tool messages: use text tool "
                                    "mode (tool calls as text in the assistant's content, results as user messages)")
            plain.append({"role": str(m.get("role")), "content": _text(m.get("content"))})
        return self._template.render(messages=plain, tools=tools, add_generation_prompt=add_generation_prompt)


@dataclass
class AgentModel:
    model: TinyLM
    tok: TemplateTokenizer
    meta: dict[str, Any]
    path: Path

    @property
    def name(self) -> str:
        return str(self.meta.get("name", self.path.name))

    @property
    def weights_hash(self) -> str:
        return str(self.meta.get("weights_hash", ""))


def resolve(name_or_path: str | Path, *, obtain_missing: bool = True) -> Path:
    """The folder of a catalog name (obtained when missing) or of a checkpoint path."""
    if str(name_or_path) in CATALOG:
        return obtain(str(name_or_path)) if obtain_missing else model_dir(str(name_or_path))
    path = Path(name_or_path).expanduser()
    if not (path / "model.safetensors").is_file():
        raise FileNotFoundError(f"{path} is neither an agent model of the catalog ({', '.join(CATALOG)}) nor a "
                                "model folder (config.json, model.safetensors, tokenizer files)")
    return path


def load_agent(name_or_path: str | Path = "smollm2-135m", *, obtain_missing: bool = True) -> AgentModel:
    """The model, its tokenizer and metadata (module docstring)."""
    path = resolve(name_or_path, obtain_missing=obtain_missing)
    meta = read_meta(path) or {"name": path.name}
    if "weights_hash" not in meta:
        from cpu.tiny_models.pretrain import weights_hash

        model = TinyLM.load(path)
        meta["weights_hash"] = weights_hash(model)
    else:
        model = TinyLM.load(path)
    return AgentModel(model, TemplateTokenizer.load(path), meta, path)


def save_checkpoint(agent: AgentModel, path: str | Path, trained: dict[str, Any]) -> Path:
    """Write ``agent``'s current weights as a model folder (module docstring); returns the folder.
    Written as ``<path>.tmp`` and renamed into place."""
    from cpu.tiny_models.pretrain import weights_hash

    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    agent.model.save(tmp)
    for f in TOKENIZER_FILES:
        if (agent.path / f).is_file():
            shutil.copy2(agent.path / f, tmp / f)
    base = {k: v for k, v in agent.meta.items() if k not in ("trained", "weights_hash", "base_weights_hash")}
    meta = {**base, "base_weights_hash": agent.meta.get("base_weights_hash", agent.meta.get("weights_hash")),
            "weights_hash": weights_hash(agent.model), "trained": trained,
            "saved": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    (tmp / META_FILE).write_text(json.dumps(meta, indent=1, default=str) + "\n")
    if path.exists():
        shutil.rmtree(path)
    tmp.rename(path)
    agent.meta, agent.path = meta, path
    return path
