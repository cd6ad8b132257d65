"""The workload: an outer loop's steps of jobs, each job's execution seconds drawn per seed (lognormal with a
median and a p90, a fraction failing early)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass




Z90 = 1.2815515655446004  # standard normal quantile at 0.90


@dataclass(frozen=True)
class Workload:
    steps: int = 54
    jobs_per_step: int = 40
    median_s: float = 1304.0
    p90_s: float = 2000.0
    fail_frac: float = 0.10
    fail_min_s: float = 60.0
    fail_max_s: float = 300.0
    gpus_per_job: int = 2
    gap_s: float = 120.0


@dataclass(frozen=True)
class Job:
    job_id: str
    step: int
    exec_s: float
    failed: bool


def draw_jobs(w: Workload, seed: int) -> list[list[Job]]:
    """The jobs of each step, drawn from ``random.Random(seed)`` (the same for every fleet)."""
    rng = random.Random(seed)
    mu = math.log(w.median_s)
    sigma = math.log(w.p90_s / w.median_s) / Z90 if w.p90_s > w.median_s else 0.0
    steps = []
    for s in range(w.steps):
        batch = []
        for j in range(w.jobs_per_step):
            failed = rng.random() < w.fail_frac
            exec_s = rng.uniform(w.fail_min_s, w.fail_max_s) if failed else rng.lognormvariate(mu, sigma)
            batch.append(Job(f"s{s:03d}-j{j:02d}", s, exec_s, failed))
        steps.append(batch)
    return steps
