"""The validation probe: ``submit_job`` calls :meth:`ValidationProbe.run` on the agent's workspace.

Stages: ``static`` (no agent code runs, see :mod:`ait_env.probe.static`) then, when enabled and the
static stage passed, ``dynamic`` (the agent's ``load_environment`` is run in a sandbox). The report
lists every failure with where and how to fix it; it never contains a score.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Protocol

from ait_env.jobs.schema import Job
from ait_env.probe.report import ProbeFailure, ProbeReport
from ait_env.probe.static import run_static
from ait_env.sandbox.workspace import WorkspaceQuota
from task_families.base import TaskFamily, TaskSpec

__all__ = ["ProbeFailure", "ProbeReport", "ValidationProbe", "DynamicStage"]


class DynamicStage(Protocol):
    """Runs the agent's code in isolation and returns (failures, sandbox description)."""

    def __call__(self, root: Path, job: Job, task: TaskSpec,
                 family: TaskFamily) -> tuple[list[ProbeFailure], str]: ...

    def warm(self) -> None:
        """Get ready in the background (e.g. start the sandbox) while the agent works."""


class ValidationProbe:
    def __init__(self, quota: WorkspaceQuota | None = None, dynamic: DynamicStage | None = None) -> None:
        self.quota = quota or WorkspaceQuota()
        self.dynamic = dynamic

    def warm(self) -> None:
        if self.dynamic is not None:
            self.dynamic.warm()

    def run(self, root: Path, task: TaskSpec, family: TaskFamily,
            on_stage: Callable[[str], None] | None = None) -> tuple[ProbeReport, Job | None]:
        t0 = time.perf_counter()
        job, parsable, failures = run_static(Path(root), task.bounds, task.family, self.quota)
        report = ProbeReport(failures=failures, parsable=parsable, stages_run=["static"])
        if not failures and self.dynamic is not None and job is not None:
            if on_stage:
                on_stage("dynamic")
            dyn_failures, sandbox = self.dynamic(Path(root), job, task, family)
            report.failures.extend(dyn_failures)
            report.stages_run.append("dynamic")
            report.sandbox = sandbox
        report.seconds = time.perf_counter() - t0
        return report, (job if report.ok else None)
