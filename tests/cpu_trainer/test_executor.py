"""The local executor's failure messages: a worker the sandbox stopped at the job's wall clock is the job's
limit (named as ``bounds.wall_clock_minutes``, with the steps it got through), any other end of the worker
is the environment's code."""

from __future__ import annotations

import pytest

from ait_env.cpu_trainer.executor import worker_stopped
from ait_env.runner import JobFailed


def test_a_worker_stopped_at_the_wall_clock_names_the_jobs_bound_not_its_code() -> None:
    exc = worker_stopped({"status": "timeout", "stage": "run"}, steps_done=17, max_steps=60, wall_s=1200)
    assert isinstance(exc, JobFailed)
    msg = str(exc)
    assert "wall-clock limit of 20 min" in msg and "bounds.wall_clock_minutes" in msg
    assert "after 17 of 60 training steps" in msg
    assert "your environment's code" not in msg


@pytest.mark.parametrize("resp", [None, {}, {"status": "error", "error": "boom"}, {"status": 3}, ["timeout"],
                                  "timeout", {"status": "disk_limit"}])
def test_any_other_end_of_the_worker_blames_the_environments_code_and_says_what_it_sent(resp: object) -> None:
    msg = str(worker_stopped(resp, steps_done=0, max_steps=40, wall_s=600))
    assert "your environment's code" in msg and "wall-clock" not in msg
    if isinstance(resp, dict) and resp:
        assert str(next(iter(resp.values()))) in msg
