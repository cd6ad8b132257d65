"""prime-rl v0.7.0's log lines, read back. The samples are written in the FORMATS of the lines in its source
(orchestrator.py ``log_train_batch``, trainer/rl/train.py's step message, utils/logger.py, verifiers 0.2.0
env_utils.py), with the colours loguru adds and the rank label torchrun's ``--tee`` puts in front."""

from __future__ import annotations

import json
import math

import pytest

from gpu.primerl_logs import clean, duration_seconds, failure_signal, level, parse_step

ESC = "\x1b"
ORCH = (f"{ESC}[2m12:00:03{ESC}[0m {ESC}[1mSUCCESS{ESC}[0m{ESC}[1m {ESC}[22mStep 7 |    2.1s | "
        "Reward 0.4375 | Trainable 96/128 (75.0%) | Turns 2.3 | Branches 1.0 | Max Off-Policy 1 | "
        f"Error 3.1% | Truncation 0.8%{ESC}[0m")
TRAINER = ("[trainer0]:12:00:04 SUCCESS Step 7 |  1m 3s | Loss 0.0123 | Entropy 0.4567 | Mismatch KL "
           "0.0001 | Grad. Norm 0.2345 | LR 3.00e-06 | Throughput 11904 tokens/s | MFU 12.5% | "
           "Peak Mem. 12.3 GiB")


def test_orchestrator_step_line() -> None:
    s = parse_step(ORCH, "orchestrator")
    assert s is not None and s.step == 7 and s.seconds == pytest.approx(2.1)
    assert s.values == pytest.approx({"train_reward": 0.4375, "trainable_frac": 0.75, "turns": 2.3,
                                      "rollout_error_rate": 0.031, "truncation_rate": 0.008})


def test_trainer_step_line_behind_the_torchrun_label() -> None:
    s = parse_step(TRAINER, "trainer")
    assert s is not None and s.step == 7 and s.seconds == 63.0
    assert s.values == pytest.approx({"loss": 0.0123, "entropy": 0.4567, "mismatch_kl": 0.0001,
                                      "grad_norm": 0.2345, "lr": 3e-6, "train_tokens_per_s": 11904.0,
                                      "mfu": 0.125, "peak_memory_gib": 12.3})
    assert level(clean(TRAINER)) == "SUCCESS"


def test_optional_trainer_fields_and_nan() -> None:
    s = parse_step("12:00:04 SUCCESS Step 2 |  450ms | Loss nan | Entropy inf | LR 1.00e-05 | "
                   "Throughput 9 tokens/s | MFU 0.1% | Peak Mem. 1.0 GiB", "trainer")
    assert s is not None and s.seconds == pytest.approx(0.45)
    assert math.isnan(s.values["loss"]) and s.values["entropy"] == math.inf and "grad_norm" not in s.values
    assert set(s.non_finite()) == {"loss", "entropy"}


@pytest.mark.parametrize("line", [
    "12:00:05 SUCCESS Evaluated arithmetic (Step 10) | Policy v9 |    3.0s | Reward 0.5000 | Turns 2.0",
    ("12:00:05 WARNING Step 3: empty train batch (0 of 128 generated rollouts shipped — all errored or "
    "filtered out)"),
    "12:00:05    INFO Starting from step 1 (total_tokens=0, total_samples=0)",
    "12:00:05   DEBUG Micro Step 1/4 | Loss 0.1000 | Entropy 0.2000",
])
def test_lines_that_are_not_step_lines(line: str) -> None:
    assert parse_step(line, "orchestrator") is None and parse_step(line, "trainer") is None


def test_json_logging_lines() -> None:
    """``log.json_logging``: one object per line whose ``message`` is the same text (logger.py
    ``build_log_entry``)."""
    raw = json.dumps({"timestamp": "2026-12-01T12:00:04.123+00:00", "level": "SUCCESS", "module": "train",
                      "function": "train", "line": 662, "message": TRAINER.split("SUCCESS ", 1)[1]})
    assert level(clean(raw)) == "SUCCESS"
    s = parse_step(raw, "trainer")
    assert s is not None and s.step == 7 and s.values["loss"] == 0.0123


@pytest.mark.parametrize("text,seconds", [("450ms", 0.45), ("2.1s", 2.1), ("1m 3s", 63.0), ("2h 5m", 7500.0),
                                          ("1d 3h", 97200.0), ("soon", None), ("", None)])
def test_format_time_strings(text: str, seconds: float | None) -> None:
    assert duration_seconds(text) == (pytest.approx(seconds) if seconds is not None else None)


@pytest.mark.parametrize("line,source,kind,blame", [
    (("2026-12-01 12:00:01,000 ERROR verifiers.utils.env_utils: Failed to load environment ait_job_x with "
     "args {'seed': 1}: broken"), "env", "env_load", "job"),
    ("RuntimeError: Failed to load environment 'ait_job_x': broken", "env", "env_load", "job"),
    (("ValueError: Could not import 'ait_job_x' environment. Ensure the package for the 'ait_job_x' "
     "environment is installed."), "env", "env_import", "infra"),
    (("RuntimeError: 10 consecutive empty train batches — check filter config (pre_batch_filters / "
     "post_batch_filters) or task difficulty."), "orchestrator", "empty_batches", "job"),
    ("[trainer0]:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB.", "trainer", "oom",
     "job"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.", "inference", "oom", "infra"),
])
def test_failure_signals(line: str, source: str, kind: str, blame: str) -> None:
    sig = failure_signal(line, source)  # type: ignore[arg-type]
    assert sig is not None and (sig.kind, sig.blame) == (kind, blame)


def test_ordinary_lines_signal_nothing() -> None:
    assert failure_signal(clean(ORCH), "orchestrator") is None
    # only an env server's log reports a failed load
    assert failure_signal("Failed to load environment x", "orchestrator") is None
