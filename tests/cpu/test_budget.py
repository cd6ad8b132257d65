"""Limits in work, not seconds (issue 46, item 7): :class:`cpu.budget.StepWatch`'s verdicts on a
controlled clock (no test here waits for real time), then through the real local executor: a rubric that
sleeps is the job's fault whatever the machine, a machine too slow for an honest job is ours."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from cpu.budget import SLOW_MACHINE, BudgetExceeded, StepWatch, WorkBudget
from ait_env.jobs.failures import InfraFailed, JobFailed

BUDGET = WorkBudget(rollouts=8, seq_len=100, max_requests_per_rollout=4, cpu_s_per_rollout=1.0, cpu_s_per_step=2.0,
                    load_cpu_s=30.0, window_s=60.0, backstop_s=1000.0)


class Machine:
    """A controlled clock and counters: each poll of the step channel advances the clock by ``tick`` seconds, the
    endpoint by ``busy`` generation seconds, ``tokens`` and ``requests``, and the sandbox by ``cpu`` CPU seconds;
    the results arrive after ``polls`` polls (never: None)."""

    def __init__(self, *, busy: float = 0.0, cpu: float = 0.0, tokens: int = 0, requests: int = 0,
                 polls: int | None = 3, tick: float = 5.0) -> None:
        self.t, self.b, self.c, self.k, self.r = 0.0, 0.0, 0.0, 0, 0
        self.busy, self.cpu, self.tokens, self.requests, self.polls, self.tick = busy, cpu, tokens, requests, polls, tick
        self.n = 0

    def wait_results(self, step: int, timeout: float) -> Any:
        self.n += 1
        self.t += self.tick
        self.b += self.busy
        self.c += self.cpu
        self.k += self.tokens
        self.r += self.requests
        if self.polls is not None and self.n >= self.polls:
            return {"step": step}
        raise TimeoutError

    def watch(self, budget: WorkBudget = BUDGET, started: float = 0.0) -> StepWatch:
        return StepWatch(budget, self.wait_results, lambda: (self.b, self.k, self.r), lambda: self.c,
                         started=started, clock=lambda: self.t)


def test_an_honest_step_on_a_slow_machine_waits_as_long_as_it_takes() -> None:
    # 40 minutes of a slow endpoint (busy 60% of the time), the agent's code well within its CPU budget
    m = Machine(busy=3.0, cpu=0.005, tokens=1, requests=0, polls=480)
    assert m.watch(WorkBudget(**{**BUDGET.__dict__, "backstop_s": 3000.0})).wait(0) == {"step": 0}
    assert m.t == 2400.0 and m.n == 480
    # the agent's code computing within budget on a loaded machine (the endpoint idle meanwhile): waits too
    m = Machine(busy=0.0, cpu=0.5, polls=150)
    assert m.watch(WorkBudget(**{**BUDGET.__dict__, "cpu_s_per_step": 80.0})).wait(0) == {"step": 0}


def test_a_step_held_by_the_agents_own_code_is_its_fault() -> None:
    """A sleep, a deadlock: neither the endpoint nor the sandbox works for a whole window."""
    m = Machine(busy=0.1, cpu=0.01, polls=None)
    with pytest.raises(BudgetExceeded, match=r"held training step 4 for 60 s without working: the model endpoint "
                                             r"was busy 1 s of it and your code used 0\.1 CPU seconds") as e:
        m.watch().wait(3)
    assert isinstance(e.value, JobFailed) and m.t == 60.0
    with pytest.raises(BudgetExceeded, match="held loading your environment for 60 s"):
        Machine(polls=None).watch().wait(-1)


@pytest.mark.parametrize("usage,message", [
    ({"cpu": 4.0}, r"used 12 CPU seconds at training step 1, over its budget of 10 s \(1 s per rollout x 8 \+ 2 s"),
    ({"tokens": 400}, r"sampled 1200 tokens at training step 1, more than 8 rollouts can in their context "
                      r"\(batch_size 8 x seq_len 100 = 800\)"),
    ({"requests": 12}, r"made 36 model calls at training step 1, over 4 per rollout \(32 for 8 rollouts\)"),
])
def test_work_past_the_budget_is_the_jobs_fault_whatever_the_clock(usage: dict[str, Any], message: str) -> None:
    m = Machine(busy=5.0, polls=None, **usage)
    with pytest.raises(BudgetExceeded, match=message):
        m.watch().wait(0)
    assert m.t < BUDGET.window_s   # caught at the first poll past the budget, not at a timeout


def test_loading_past_its_cpu_budget_is_the_jobs_fault() -> None:
    with pytest.raises(BudgetExceeded, match="used 3\\d CPU seconds in load_environment, over the budget of 30 s"):
        Machine(cpu=4.0, polls=None).watch().wait(-1)


def test_the_backstop_is_ours_and_says_the_machine_was_slow() -> None:
    m = Machine(busy=4.0, cpu=0.01, polls=None)
    with pytest.raises(InfraFailed, match=r"the machine was too slow: training step 2 was still running 10\d\d s after "
                                          r"the job started \(the backstop is 1000 s; load average") as e:
        m.watch(started=-100.0).wait(1)
    assert e.value.code == SLOW_MACHINE and not isinstance(e.value, JobFailed)
    with pytest.raises(InfraFailed, match="training step 3 was still running 1001 s"):   # at the step's start too
        Machine().watch(started=-1001.0).wait(2)
    # the step the backstop stops shows the agent's code idle: still the job's fault
    with pytest.raises(BudgetExceeded, match="held training step 2 for"):
        Machine(polls=None).watch(WorkBudget(**{**BUDGET.__dict__, "window_s": 600.0}), started=-900.0).wait(1)
    # the agent's code burning CPU within its per-step budget slowed the job past the backstop: its fault
    burn = WorkBudget(**{**BUDGET.__dict__, "cpu_s_per_step": 1e6})
    with pytest.raises(BudgetExceeded, match=r"used 402 CPU seconds of the 1005 s the job trained \(40%, over "
                                             r"25%\), which slowed the job past its backstop of 1000 s"):
        Machine(busy=1.0, cpu=2.0, polls=None).watch(burn).wait(0)


# ------------------------------------------------------------------ through the real executor (micro models)

@pytest.fixture(scope="module")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.fakes.local_models import install_untrained_models

    return install_untrained_models(tmp_path_factory.mktemp("models"))


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache: Path, edit_env: Any, **options: Any) -> Any:
    from ait_env.backends.local import LocalBackend
    from ait_env.config import compose
    from task_families import reference_files
    from tests.helpers import make_bundle

    pytest.importorskip("verifiers")
    monkeypatch.setenv("AIT_CACHE_DIR", str(cache))
    files = reference_files("arithmetic", "ait-tiny-s", backend="local")
    for key, value in (("max_steps", 2), ("batch_size", 4), ("group_size", 2), ("max_tokens", 8),
                       ("warmup_steps", 0), ("num_examples", 16)):
        files["job.toml"] = re.sub(rf"(?m)^{key} = \S+", f"{key} = {value}", files["job.toml"])
    files["environment.py"] = edit_env(files["environment.py"])
    tmp_path.mkdir(parents=True, exist_ok=True)
    bundle = make_bundle(files, tmp_path)
    settings = compose(backend="local", overrides={"backend": {"options": {
        "eval_every": 0, "eval_limit": 2, "eval_max_tokens": 8, "slow_machine_retries": 0, **options}}}).backend
    backend = LocalBackend(settings, tmp_path / "runs", show_progress=False)
    try:
        return backend.run(bundle)
    finally:
        backend.close()


@pytest.mark.slow   # two real jobs (some 40 s each on 2 busy cores); the verdicts' twins above run by default
def test_a_rubric_that_sleeps_is_the_jobs_fault_and_an_honest_job_past_the_backstop_is_ours(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_cache: Path) -> None:
    """The same short job twice: its rubric sleeping in training (4 s windows of an idle endpoint and an idle
    sandbox) ends ``job_failed``; unchanged with a backstop shorter than its training (a machine far too slow)
    it ends ``infra_failed``/``slow_machine``, not scored against the agent. The per-step work is in the curves."""
    def sleeps(text: str) -> str:
        return text.replace("def load_environment(", "def _real_load_environment(") + (
            "\n\ndef _sleepy(completion, **kwargs):\n    import time\n    time.sleep(3600)\n    return 0.0\n\n"
            "def load_environment(**kwargs):\n    import traceback, verifiers as vf\n"
            "    env = _real_load_environment(**kwargs)\n"
            "    if 'rollout_worker' in ''.join(traceback.format_stack()):\n"
            "        env.rubric = vf.Rubric(funcs=[_sleepy], weights=[1.0])\n"
            "    return env\n")

    held = _run(tmp_path / "a", monkeypatch, model_cache, sleeps, step_timeout_s=4)
    assert held.status == "job_failed", (held.status, held.error, held.log_tail[-600:])
    assert "held training step 1 for" in held.error and "without working" in held.error
    # a backstop of 1 s, shorter than starting the sandbox here: the honest job is stopped as ours
    slow = _run(tmp_path / "b", monkeypatch, model_cache, lambda text: text, wall_backstop_s=1.0)
    assert slow.status == "infra_failed" and slow.fault == SLOW_MACHINE, (slow.status, slow.error)
    assert "the machine was too slow" in slow.error
