"""Behaviour cloning: exactly the assistant's generated tokens are trained, and training fits them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ait_env.agent_models.load import AgentModel, TemplateError, TemplateTokenizer
from ait_env.agent_models.sft import SFTSettings, behaviour_clone, encode_conversation, lr_at, sequence_nll
from cpu.tiny_models.model import TinyConfig, TinyLM

CONV = [{"role": "system", "content": "You write jobs."}, {"role": "user", "content": "Task: teach X."},
        {"role": "assistant", "content": "Reading.\n<tool_call>\n{\"name\": \"list_files\", \"arguments\": {}}\n</tool_call>"},
        {"role": "user", "content": "<tool_response>\njob.toml\n</tool_response>"},
        {"role": "assistant", "content": "<tool_call>\n{\"name\": \"submit_job\", \"arguments\": {}}\n</tool_call>"}]


@pytest.fixture(scope="module")
def tok(smollm2_dir: Path) -> TemplateTokenizer:
    return TemplateTokenizer.load(smollm2_dir)


def test_the_mask_is_each_trained_turn_and_its_end_of_turn_token(tok: TemplateTokenizer) -> None:
    enc = encode_conversation(tok, CONV, [False, False, True, False, True])
    assert enc.ids == tok.encode(tok.render(CONV))
    trained = tok.decode([i for i, m in zip(enc.ids, enc.mask) if m])
    assert trained == CONV[2]["content"] + "<|im_end|>" + CONV[4]["content"] + "<|im_end|>"
    only_last = encode_conversation(tok, CONV, [False, False, False, False, True])
    assert tok.decode([i for i, m in zip(only_last.ids, only_last.mask) if m]) == CONV[4]["content"] + "<|im_end|>"
    # what is trained is what the endpoint's prompt asks the model to continue
    prompt = tok.encode_chat(CONV[:4], add_generation_prompt=True)
    assert enc.ids[:len(prompt)] == prompt and enc.mask[len(prompt)] == 1 and enc.mask[len(prompt) - 1] == 0


def test_only_assistant_turns_can_be_trained(tok: TemplateTokenizer) -> None:
    with pytest.raises(ValueError, match="only assistant turns"):
        encode_conversation(tok, CONV, [False, True, False, False, False])
    with pytest.raises(ValueError, match="one 'trained' flag"):
        encode_conversation(tok, CONV, [True])


def test_a_template_whose_prefixes_do_not_tokenize_as_prefixes_is_refused(tok: TemplateTokenizer) -> None:
    odd = TemplateTokenizer(tok.tok, "{% for m in messages %}{{ m['content'] }}{% endfor %}"
                                     "{% if add_generation_prompt %}x{% endif %}")
    with pytest.raises(TemplateError):
        encode_conversation(odd, CONV, [False, False, True, False, False])


def test_behaviour_cloning_fits_the_trained_tokens_and_only_the_top_layers_move(tok: TemplateTokenizer,
                                                                                 tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = TinyLM(TinyConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                              num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512))
    with torch.no_grad():   # a trained model's scale: the (frozen, tied) output layer can then separate tokens
        model.model.embed_tokens.weight.normal_(0.0, 1.0)
    agent = AgentModel(model, tok, {"name": "micro"}, tmp_path)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    data = [encode_conversation(tok, CONV, [False, False, True, False, True])]
    logs, _ = behaviour_clone(agent, data, SFTSettings(lr=1e-2, epochs=30, batch=1, warmup_steps=2, train_layers=1))
    assert len(logs) == 30 and logs[-1].loss < 0.5 * logs[0].loss, [round(x.loss, 2) for x in logs]
    after = model.state_dict()
    assert torch.equal(before["model.layers.0.self_attn.q_proj.weight"], after["model.layers.0.self_attn.q_proj.weight"])
    assert torch.equal(before["model.embed_tokens.weight"], after["model.embed_tokens.weight"])
    assert not torch.equal(before["model.layers.1.mlp.up_proj.weight"], after["model.layers.1.mlp.up_proj.weight"])
    assert all(p.requires_grad for p in model.parameters())   # nothing stays frozen after training


def test_the_turn_loss_weighs_each_trained_turn_equally(tok: TemplateTokenizer, tmp_path: Path) -> None:
    torch.manual_seed(1)
    model = TinyLM(TinyConfig(vocab_size=49152, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                              num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512))
    enc = encode_conversation(tok, CONV, [False, False, True, False, True])
    assert enc.turns == 2 and set(enc.turn) == {0, 1, 2}
    assert [m for m in enc.mask] == [int(t > 0) for t in enc.turn]
    with torch.no_grad():
        x = torch.tensor([enc.ids])
        logp = model.sequence_logprobs(x, torch.ones_like(x))[0]
    per_turn = [-(sum(float(logp[i - 1]) for i, t in enumerate(enc.turn) if t == k)
                  / sum(1 for t in enc.turn if t == k)) for k in (1, 2)]
    tokens = -sum(float(logp[i - 1]) for i, m in enumerate(enc.mask) if m)
    with torch.no_grad():
        nll_tok, n_tok, _ = sequence_nll(model, enc, 4096)
        nll_turn, n_turn, _ = sequence_nll(model, enc, 4096, per_turn=True)
    assert n_tok == enc.trained and float(nll_tok) == pytest.approx(tokens, rel=1e-4)
    assert n_turn == 2 and float(nll_turn) == pytest.approx(sum(per_turn), rel=1e-4)
    with pytest.raises(ValueError, match="loss_per"):
        SFTSettings(loss_per="sequence")
    agent = AgentModel(model, tok, {"name": "micro"}, tmp_path)
    logs, _ = behaviour_clone(agent, [enc], SFTSettings(lr=1e-3, epochs=1, batch=1, loss_per="turn"))
    assert logs[0].loss == pytest.approx(sum(per_turn) / 2, rel=1e-3) and logs[0].tokens == enc.trained


def test_the_schedule_warms_up_then_decays_to_its_floor() -> None:
    s = SFTSettings(lr=1e-4, warmup_steps=4, min_lr_ratio=0.1)
    lrs = [lr_at(k, 20, s) for k in range(20)]
    assert lrs[0] < lrs[3] < lrs[4] == pytest.approx(1e-4) and lrs[-1] == pytest.approx(1e-5, rel=0.1)
    assert all(a >= b for a, b in zip(lrs[4:], lrs[5:]))


def test_the_agent_endpoint_reads_back_its_own_sampled_tokens(tok: TemplateTokenizer) -> None:
    """A reply sampled in a spelling the tokenizer would not choose comes back, in the next turn's prompt, as
    the ids the model sampled (token in, token out), so a rollout's turns extend each other."""
    from cpu.tiny_models.endpoint import SpokenTokens

    spoken = SpokenTokens(max_entries=2)
    prompt = tok.render(CONV[:2], add_generation_prompt=True)
    odd = tok.encode("Rea") + tok.encode("ding.") + [tok.im_end_id]   # not how "Reading." tokenizes
    assert tok.encode("Reading.") != odd[:-1] and tok.decode(odd) == "Reading.<|im_end|>"
    spoken.put(prompt + tok.decode(odd), tok.encode(prompt) + odd)
    nxt = tok.render(CONV[:2] + [{"role": "assistant", "content": "Reading."}, CONV[3]], add_generation_prompt=True)
    ids = spoken.encode(nxt, tok.encode)
    assert ids[:len(tok.encode(prompt)) + len(odd)] == tok.encode(prompt) + odd
    assert tok.decode(ids) == nxt and ids != tok.encode(nxt)
    assert spoken.encode("unrelated", tok.encode) == tok.encode("unrelated")
    spoken.put("a", [1])
    spoken.put("b", [2])
    assert spoken.encode(prompt + "Reading.<|im_end|>\nx", tok.encode) == tok.encode(prompt + "Reading.<|im_end|>\nx")
