"""The local executor's failure messages: a worker the sandbox stopped at the job's backstop is the machine's
fault (``infra_failed``/``slow_machine``: on this backend the wall clock measures the load, the job's work is
bounded step by step), one the kernel stopped at its CPU limit is the job's, any other end of the worker is
the environment's code."""

from __future__ import annotations

import pytest

from cpu.budget import SLOW_MACHINE
from cpu.executor import LocalExecutorOptions, work_budget, worker_stopped
from ait_env.jobs.settings import BackendBounds, BackendSettings
from ait_env.runner import InfraFailed, JobFailed


def test_a_worker_stopped_at_the_backstop_is_the_machines_fault_not_the_jobs() -> None:
    exc = worker_stopped({"status": "timeout", "stage": "run"}, steps_done=17, max_steps=60, wall_s=4800, cpu_s=9000)
    assert isinstance(exc, InfraFailed) and not isinstance(exc, JobFailed) and exc.code == SLOW_MACHINE
    msg = str(exc)
    assert "the machine was too slow" in msg and "after 4800 s, at 17 of 60 steps" in msg
    assert "load average" in msg and "wall_backstop_s" in msg and "your environment's code" not in msg


def test_a_worker_stopped_at_its_cpu_limit_is_the_jobs_fault() -> None:
    exc = worker_stopped({"status": "crashed", "signal": "SIGXCPU"}, steps_done=3, max_steps=40, wall_s=4800, cpu_s=5420)
    assert isinstance(exc, JobFailed) and "CPU limit of 5420 CPU seconds" in str(exc) and "after 3 of 40" in str(exc)


@pytest.mark.parametrize("resp", [None, {}, {"status": "error", "error": "boom"}, {"status": 3}, ["timeout"],
                                  "timeout", {"status": "disk_limit"}])
def test_any_other_end_of_the_worker_blames_the_environments_code_and_says_what_it_sent(resp: object) -> None:
    msg = str(worker_stopped(resp, steps_done=0, max_steps=40, wall_s=600, cpu_s=900))
    assert "your environment's code" in msg and "too slow" not in msg
    if isinstance(resp, dict) and resp:
        assert str(next(iter(resp.values()))) in msg


def test_the_work_budget_follows_the_job_and_the_backstop_the_bound() -> None:
    from task_families import reference_files
    from ait_env.jobs.schema import parse_job

    job, _ = parse_job(reference_files("warehouse", "ait-tiny-m", backend="local")["job.toml"])
    assert job is not None
    settings = BackendSettings(name="local", bounds=BackendBounds(wall_clock_minutes=20))
    b = work_budget(job, settings, LocalExecutorOptions())
    assert (b.rollouts, b.seq_len, b.backstop_s, b.window_s) == (64, 1024, 4800.0, 600.0)
    assert b.step_tokens == 64 * 1024 and b.step_cpu_s == 1.0 * 64 + 60.0
    assert b.job_cpu_s(40) == 300.0 + 40 * (1.0 * 64 + 60.0)
    assert work_budget(job, settings, LocalExecutorOptions(wall_backstop_s=90)).backstop_s == 90.0
