"""The outcome check (issue 46, item 1): a trained model that scores far better on the hidden questions than on
fresh ones of the same generator was trained on them, however the job encoded them; the runner forfeits it
(``eval_leak``), and an honest model, equally good on both, passes (:mod:`ait_env.hidden.outcome`)."""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import pytest

import ait_env.runner as runner
from ait_env.hidden import outcome
from ait_env.hidden.secrets import hidden_set
from ait_env.jobs.settings import BackendBounds, BackendSettings, ModelInfo
from task_families import get_family, reference_files
from tests.fakes.openai_server import ScriptedOpenAIServer
from tests.helpers import make_bundle

FAM = get_family("arithmetic")


def test_fresh_instances_are_new_questions_at_the_hidden_sets_difficulties():
    hidden = hidden_set("arithmetic")
    fresh = outcome.fresh_instances(FAM, hidden, 150, seed=7)
    keys = {i.key for i in hidden} | {i.key for i in FAM.dev_pool()}
    assert len(fresh) == 150 and len({i.key for i in fresh}) == 150 and not keys & {i.key for i in fresh}
    assert {i.difficulty for i in fresh} <= {i.difficulty for i in hidden}
    assert outcome.fresh_instances(FAM, hidden, 150, seed=7) == fresh            # a seed is one set
    assert outcome.fresh_instances(FAM, hidden, 150, seed=8) != fresh


def test_the_verdict():
    assert outcome.verdict(0.9, 300, 0.6, 150).forfeit                          # the red team's gap
    assert not outcome.verdict(0.757, 300, 0.74, 150).forfeit                   # an honest job's
    assert not outcome.verdict(1.0, 300, 0.97, 10_000).forfeit                  # significant, too small to matter
    assert not outcome.verdict(1.0, 300, 0.0, outcome.MIN_FRESH - 1).forfeit    # too few to say anything
    assert not outcome.verdict(0.5, 300, 0.9, 150).forfeit                      # one-sided
    v = outcome.verdict(0.9, 300, 0.6, 150)
    assert "z = " in v.failure() and "0.900" in v.failure() and "fresh" in v.failure()


def test_an_honest_job_is_forfeited_at_most_at_the_stated_rate():
    """Simulated honest jobs (hidden and fresh scores are draws of the same accuracy, 300 and 150 questions):
    the forfeit rate stays at the test's level (0.1%) whatever the accuracy."""
    rng = random.Random(0)
    forfeits = trials = 0
    for p in (0.05, 0.2, 0.5, 0.8, 0.95):
        for _ in range(2000):
            h = sum(rng.random() < p for _ in range(300)) / 300
            f = sum(rng.random() < p for _ in range(150)) / 150
            forfeits += outcome.verdict(h, 300, f, 150).forfeit
            trials += 1
    assert forfeits / trials <= 0.003, forfeits


def test_a_real_leak_is_caught_with_high_power():
    """A model that learned a fifth of the hidden questions outright on top of a 0.5 accuracy (hidden 0.6 vs
    fresh 0.5 in expectation) is caught... rarely: the check is for large leaks; one that learned them all
    (1.0 vs 0.5) is caught every time."""
    rng = random.Random(1)
    caught = sum(outcome.verdict(sum(rng.random() < 1.0 for _ in range(300)) / 300, 300,
                                 sum(rng.random() < 0.5 for _ in range(150)) / 150, 150).forfeit for _ in range(200))
    assert caught == 200


# ---------------------------------------------------------------- through the runner
def _answer(messages: list[dict], tools: list[dict]) -> dict[str, Any]:
    """A model that solves any arithmetic question (an honest model, as good on fresh questions)."""
    question = next(m["content"] for m in messages if m["role"] == "user")
    expr = re.search(r"What is (.*)\?", question).group(1)
    return {"content": f"Answer: {eval(expr)}"}  # noqa: S307 - the family's own question text


def _memorised(messages: list[dict], tools: list[dict]) -> dict[str, Any]:
    """A model that learned the hidden answers and nothing else."""
    answers = {i.question: i.answer for i in hidden_set("arithmetic")}
    question = next(m["content"] for m in messages if m["role"] == "user")
    return {"content": f"Answer: {answers.get(question, '0')}"}


class _ServedExecutor:
    """A trainer executor whose 'trained' model is a scripted server (no training)."""

    def __init__(self, base_url: str) -> None:
        self.served = runner.Served(base_url, "scripted")

    def weights_hash(self, model: str) -> str:
        return ""

    def serve_base(self) -> runner.Served:
        return self.served

    def measure_base(self, model: str, evaluate: Any) -> Any:
        return evaluate(self.served)

    def train(self, eval_point: Any) -> runner.Trained:
        return runner.Trained(train_seconds=0.0)

    def serve_trained(self) -> runner.Served:
        return self.served

    def close(self) -> None:
        return None


def test_an_honest_model_passes_the_check(tmp_path: Path):
    """A model as good on fresh questions as on hidden ones (it solves any question) is not forfeited."""
    logged: list[str] = []
    settings = runner.RunnerSettings(outcome_fresh=60, eval_concurrency=16)
    with ScriptedOpenAIServer(_answer) as server:
        runner.outcome_check(FAM, hidden_set("arithmetic")[:60], 1.0, settings,
                             runner.Served(server.base_url, "scripted"), logged.append)
    assert "fresh 1.000 (n=60)" in logged[0], logged


def test_the_runner_forfeits_a_model_that_knows_only_the_hidden_set(tmp_path: Path):
    bundle = make_bundle(reference_files("arithmetic", "Qwen/Qwen3-1.7B"), tmp_path)
    settings = BackendSettings(name="local", models=[ModelInfo(name="Qwen/Qwen3-1.7B", role="large")],
                               bounds=BackendBounds(wall_clock_minutes=5),
                               options={"eval_every": 0, "eval_limit": 60, "measure_pre": True,
                                        "outcome_fresh": 60, "eval_concurrency": 16})
    with ScriptedOpenAIServer(_memorised) as server:
        res = runner.run(bundle.root, settings, progress=False,
                         executor=lambda *a, **k: _ServedExecutor(server.base_url))
    assert res.status == "job_failed" and res.fault == "eval_leak", res.log_tail
    assert "outcome check: hidden 1.000 (n=60) vs fresh" in res.log_tail
    assert "fresh questions of the same generator" in res.error
