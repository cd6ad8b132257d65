"""The fragility tool's perturbations and shares (``research/fragility.py``), on the micro model."""

from __future__ import annotations

import torch

from research import fragility as frag
from research.line_accuracy import LineResult, transcripts


def _state(model) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_perturb_moves_every_parameter_by_exactly_delta_and_repeats_by_seed(micro_model) -> None:
    before = _state(micro_model)
    frag.perturb(micro_model, 1e-3, seed=7)
    once = _state(micro_model)
    micro_model.load_state_dict(before)
    frag.perturb(micro_model, 1e-3, seed=7)
    for k, v in before.items():
        step = once[k] - v
        assert torch.allclose(step.abs(), torch.full_like(step, 1e-3), atol=1e-6), k
        assert torch.equal(once[k], micro_model.state_dict()[k]), k
        assert (step > 0).any() and (step < 0).any(), k
    micro_model.load_state_dict(before)


def test_summary_counts_kept_lines_against_the_unperturbed_ones() -> None:
    def r(right: bool, margin: float = 2.0) -> LineResult:
        return LineResult("x", right, margin if right else -1.0)

    base = [[r(True), r(True)], [r(True), r(False)]]
    now = [[r(True, 0.5), r(False)], [r(True), r(True)]]
    s = frag.summary(base, now)
    assert s["lines"] == 3 / 4
    assert s["kept"] == 2 / 3          # of the three lines right before, the second flipped
    assert s["whole"] == 1 / 2
    assert s["thin"] == 1 / 3          # one of the three right lines has a margin under 1


def test_measure_restores_the_weights_and_large_noise_costs_lines(micro_model, micro_tokenizer) -> None:
    items = transcripts(micro_tokenizer, "arithmetic", n=6)
    pool = transcripts(micro_tokenizer, "arithmetic", n=8, seed=99)
    before = _state(micro_model)
    rows = frag.measure(micro_model, items, [0.0, 0.5], seeds=2)
    assert rows[0]["kept"] == 1.0 or rows[0]["lines"] == 0.0
    assert rows[1]["lines"] <= rows[0]["lines"]
    adv = frag.measure(micro_model, items, [0.0, 1e-3], seeds=1, pool=pool, steps=2, batch=4)
    assert adv[0] == rows[0]
    for k, v in before.items():
        assert torch.equal(v, micro_model.state_dict()[k]), k


def test_noise_steps_move_each_trained_parameter_by_delta_per_step(micro_model, micro_tokenizer) -> None:
    pool = transcripts(micro_tokenizer, "arithmetic", n=8, seed=99)
    before = _state(micro_model)
    frag.noise_steps(micro_model, pool, steps=1, delta=1e-3, batch=4, seed=0)
    moved = [((micro_model.state_dict()[k] - v).abs() - 1e-3).abs().max().item() for k, v in before.items()
             if not torch.equal(micro_model.state_dict()[k], v)]
    micro_model.load_state_dict(before)
    assert moved and max(moved) < 1e-6
