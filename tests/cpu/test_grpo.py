"""GRPO math of the local trainer: advantages, the loss, schedules, and the skipping train step."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from ait_env.jobs.schema import PrimeRL
from cpu import grpo
from cpu.tiny_models.model import TinyConfig, TinyLM


def _p(**over: object) -> PrimeRL:
    base = {"max_steps": 20, "seq_len": 64, "batch_size": 8, "group_size": 4,
            "sampling": {"temperature": 1.0, "max_tokens": 16},
            "optim": {"type": "adamw", "lr": 1e-5, "weight_decay": 0.0},
            "scheduler": {"type": "cosine", "warmup_steps": 4, "min_lr": 1e-6},
            "loss": {"type": "default"}, "algo": {"type": "grpo"}}
    base.update(over)
    return PrimeRL.model_validate(base)


def test_advantages_are_group_centred() -> None:
    adv = grpo.advantages([1, 0, 0, 1, 1, 1, 1, 1], 4)
    assert adv[:4] == [0.5, -0.5, -0.5, 0.5]
    assert adv[4:] == [0.0] * 4
    assert grpo.advantages([0.5, 1.0], 2, "max_rl") == [pytest.approx(-1 / 3), pytest.approx(1 / 3)]
    assert grpo.advantages([0.0, 0.0], 2, "max_rl") == [0.0, 0.0]


def test_cosine_schedule_warms_up_then_decays_to_min_lr() -> None:
    p = _p()
    lrs = [grpo.lr_at(s, p, lr_scale=10.0) for s in range(p.max_steps)]
    assert lrs[3] == pytest.approx(1e-4)          # end of warmup = peak (lr x scale)
    assert all(a >= b for a, b in zip(lrs[3:], lrs[4:]))
    assert lrs[-1] > 1e-5 and lrs[-1] < lrs[3]
    assert grpo.lr_at(0, _p(scheduler={"type": "constant"}), 10.0) == pytest.approx(1e-4)


def _model() -> TinyLM:
    torch.manual_seed(0)
    return TinyLM(TinyConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                             eos_token_id=1, pad_token_id=0))


def _seqs(model: TinyLM, n: int) -> list[tuple[list[int], list[int], list[float]]]:
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        L = 6 + 3 * i
        ids = torch.randint(2, 50, (L,), generator=g).tolist()
        mask = [0] * 3 + [1] * (L - 3)
        with torch.no_grad():
            logp = model.sequence_logprobs(torch.tensor([ids]), torch.ones(1, L, dtype=torch.long), 1.0)[0]
        lps = [0.0] + [float(x) for x in logp]
        out.append((ids, mask, [lp if m else 0.0 for lp, m in zip(lps, mask)]))
    return out


def _full_grad(model: TinyLM, batch: grpo.Batch, p: PrimeRL) -> list[torch.Tensor]:
    model.zero_grad()
    logp = model.sequence_logprobs(batch.input_ids, batch.attention_mask, 1.0)
    loss, _ = grpo.policy_loss(logp, batch, p.loss)
    loss.backward()
    return [x.grad.clone() for x in model.parameters()]


def test_train_step_matches_the_full_padded_loss_and_skips_zero_advantage_rows() -> None:
    model = _model()
    p = _p(optim={"type": "sgd", "lr": 1e-3, "weight_decay": 0.0, "max_norm": None})
    seqs = _seqs(model, 6)
    advs = [0.5, 0.0, -0.5, 0.0, 0.25, -0.25]
    batch = grpo.make_batch(seqs, advs, pad_id=0, max_len=64)
    ref = _full_grad(copy.deepcopy(model), batch, p)
    opt = grpo.make_optimizer(model, p, lr_scale=1.0)
    before = [x.detach().clone() for x in model.parameters()]
    m = grpo.train_step(model, opt, batch, p, lr=1.0, micro_batch=2)
    assert m["live_seqs"] == 4 and m["tokens"] == float(batch.loss_mask[:, 1:].sum())
    # the weights have not moved since sampling: the trained rows' ratio is 1 (skipped rows don't dilute it)
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-4) and m["masked_frac"] == 0.0
    for b, a, g in zip(before, model.parameters(), ref):
        # plain SGD at lr 1: the update is exactly minus the gradient of the full loss
        torch.testing.assert_close(b - a.detach(), g, atol=1e-5, rtol=1e-4)


def test_positive_advantage_raises_the_sampled_tokens_probability() -> None:
    model = _model()
    p = _p(optim={"type": "adamw", "lr": 1e-3, "weight_decay": 0.0})
    seqs = _seqs(model, 2)
    batch = grpo.make_batch(seqs, [1.0, -1.0], pad_id=0, max_len=64)
    opt = grpo.make_optimizer(model, p, lr_scale=1.0)
    with torch.no_grad():
        lp0 = model.sequence_logprobs(batch.input_ids, batch.attention_mask, 1.0)
    for _ in range(5):
        grpo.train_step(model, opt, batch, p, lr=1e-3)
    model.eval()
    with torch.no_grad():
        lp1 = model.sequence_logprobs(batch.input_ids, batch.attention_mask, 1.0)
    mask = batch.loss_mask[:, 1:]
    gain = ((lp1 - lp0) * mask).sum(dim=1) / mask.sum(dim=1)
    assert gain[0] > 0 > gain[1]
    assert not math.isnan(float(gain.sum()))


def test_all_zero_advantages_leave_the_weights_alone() -> None:
    model = _model()
    p = _p(optim={"type": "sgd", "lr": 1e-2, "weight_decay": 0.0})
    batch = grpo.make_batch(_seqs(model, 3), [0.0, 0.0, 0.0], pad_id=0, max_len=64)
    before = [x.detach().clone() for x in model.parameters()]
    m = grpo.train_step(model, grpo.make_optimizer(model, p, 1.0), batch, p, lr=1e-2)
    assert m["live_seqs"] == 0
    assert all(torch.equal(b, a.detach()) for b, a in zip(before, model.parameters()))


def test_rl_step_trains_each_rollouts_sequences_with_its_advantage_at_the_schedules_lr() -> None:
    model, ref = _model(), _model()
    p = _p(optim={"type": "sgd", "lr": 1e-3, "weight_decay": 0.0, "max_norm": None})
    seqs = _seqs(model, 4)
    rollouts, advs = [seqs[:2], [], seqs[2:]], [0.5, 0.3, -0.5]   # a rollout of two turns, one of none
    lr, m = grpo.rl_step(model, grpo.make_optimizer(model, p, 2.0), rollouts, advs, p, step=3, lr_scale=2.0,
                         pad_id=0)
    assert lr == grpo.lr_at(3, p, 2.0) and not model.training
    # the same update by hand: every sequence of a rollout gets the rollout's advantage
    batch = grpo.make_batch(seqs, [0.5, 0.5, -0.5, -0.5], pad_id=0, max_len=p.seq_len)
    want = grpo.train_step(ref, grpo.make_optimizer(ref, p, 2.0), batch, p, lr)
    assert m == want
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), ref.parameters()))
    # all advantages 0: no step, no metrics, the weights as they were
    before = [x.detach().clone() for x in model.parameters()]
    assert grpo.rl_step(model, grpo.make_optimizer(model, p, 2.0), rollouts, [0.0] * 3, p, 4, 2.0, 0)[1] == {}
    assert all(torch.equal(b, a.detach()) for b, a in zip(before, model.parameters()))
