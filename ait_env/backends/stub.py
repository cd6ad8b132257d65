"""The ``stub`` backend: a deterministic, instant SURROGATE for tests and plumbing.

Nothing is trained. Every result carries ``surrogate=True`` and a log line saying so. The post
score is this documented function of the job's ``[prime_rl]`` features (Qwen-scale hyperparameters):

    pre      = baseline(family, model)                      (see :func:`stub_baseline`)
    ceiling  = 0.70 for the "small" model, 0.85 for the "larger" one
    q_lr     = exp(-((log10(lr) - log10(3e-6)) / 0.75) ** 2)     (0 when lr == 0)
    q_steps  = 1 - exp(-max_steps / 25)
    q_group  = min(1, (group_size - 1) / 7)
    q_temp   = max(0, 1 - |temperature - 1|)
    q_batch  = sqrt(min(1, batch_size / 64))
    gain     = q_lr * q_steps * q_group * q_temp * q_batch
    post     = pre + (ceiling - pre) * gain
    if lr > 1e-4:  post = 0.3 * pre                    (divergence: the model collapses)

Simulated training time: ``0.02 s * max_steps * batch_size``, reported as ``train_seconds`` and as the
job's ``wall_seconds`` (the simulated job does nothing but train; no time actually passes), so that a
report never shows a wall time shorter than its training time. Baselines are ``0.15`` (small) / ``0.25`` (larger) plus a per-family offset in
[-0.05, 0.05] from a hash of the family name.
"""

from __future__ import annotations

import hashlib
import math

from ait_env.backends.base import Backend, JobHandle
from ait_env.jobs.result import JobResult
from ait_env.hidden.baselines import BaselineEntry
from ait_env.jobs.bundle import JobBundle
from ait_env.jobs.schema import Job

LR_OPT = 3e-6
LR_COLLAPSE = 1e-4


def _family_offset(family: str) -> float:
    h = int(hashlib.sha256(family.encode()).hexdigest()[:8], 16)
    return (h % 1001) / 1000 * 0.1 - 0.05


def stub_baseline(family: str, role: str) -> float:
    base = 0.25 if role == "larger" else 0.15
    return round(base + _family_offset(family), 4)


def stub_gain(job: Job) -> float:
    p = job.prime_rl
    lr = p.optim.lr
    q_lr = 0.0 if lr <= 0 else math.exp(-(((math.log10(lr) - math.log10(LR_OPT)) / 0.75) ** 2))
    q_steps = 1 - math.exp(-p.max_steps / 25)
    q_group = min(1.0, (p.group_size - 1) / 7)
    q_temp = max(0.0, 1 - abs(p.sampling.temperature - 1.0))
    q_batch = math.sqrt(min(1.0, p.batch_size / 64))
    return q_lr * q_steps * q_group * q_temp * q_batch


class StubBackend(Backend):
    def _role(self, model: str) -> str:
        for m in self.catalog():
            if m.name == model:
                return m.role
        return "small"

    def baseline(self, family: str, model: str) -> float:
        return stub_baseline(family, self._role(model))

    def measure_baseline(self, family: str, model: str) -> BaselineEntry:
        return BaselineEntry(backend=self.name, family=family, model=model, score=self.baseline(family, model),
                             ci95=0.0, n=0, hidden_set_hash="stub-formula",
                             command=f"python scripts/seed_baselines.py backend={self.name}")

    def submit(self, bundle: JobBundle) -> JobHandle:
        return JobHandle(job_id=bundle.job_id, backend=self.name, meta={"root": str(bundle.root)})

    def wait(self, handle: JobHandle, timeout: float | None = None) -> JobResult:  # noqa: ARG002
        bundle = JobBundle.load(handle.meta["root"])
        job = bundle.job
        model = job.job.base_model
        family = bundle.manifest.family
        baselines = {m.name: self.baseline(family, m.name) for m in self.catalog()}
        pre = baselines.get(model, self.baseline(family, model))
        ceiling = 0.85 if self._role(model) == "larger" else 0.70
        gain = stub_gain(job)
        post = 0.3 * pre if job.prime_rl.optim.lr > LR_COLLAPSE else pre + (ceiling - pre) * gain
        train_s = 0.02 * job.prime_rl.max_steps * job.prime_rl.batch_size
        steps = job.prime_rl.max_steps
        curve = [pre + (post - pre) * (1 - math.exp(-5 * (i + 1) / steps)) / (1 - math.exp(-5))
                 for i in range(steps)]
        return JobResult(job_id=handle.job_id, backend=self.name, status="succeeded", surrogate=True,
                         post_score=round(post, 4), baselines=baselines, wall_seconds=train_s,
                         train_seconds=train_s, cost_usd=self.settings.cost_usd_per_job,
                         curves={"eval_step": [float(i) for i in range(steps + 1)],
                                 "eval_score": [round(pre, 4)] + [round(c, 4) for c in curve]},
                         log_tail=f"stub backend: SURROGATE score (gain={gain:.3f}); nothing was trained")
