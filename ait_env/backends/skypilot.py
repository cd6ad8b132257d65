"""The ``skypilot`` backend: job bundles run by the GPU worker (``python -m gpu.worker``) as SkyPilot managed
jobs on a pool of rented pods (``python -m fleet.pool up``). This module is the backend's face; it is the
``runpod`` backend's face (:class:`ait_env.backends.runpod.RunpodBackend`: keys, payloads, results, baselines,
run costs, budgets) with SkyPilot as the dispatch core's engine (:class:`fleet.skypilot_engine.SkypilotEngine`:
launches onto the pool, statuses, the result read from the job's log, pod-priced bills).

The same dispatch core (:class:`fleet.dispatch.Dispatcher`), so the same guarantees (docs/fleet.md,
"Guarantees under faults"): each attempt journaled before it is launched (``<runs_dir>/skypilot_journal.sqlite``),
a restarted orchestrator adopts jobs in flight by id, an identical job is served from the journal and never
paid twice, budgets reserve each job's bound, an attempt is cancelled before it is ever sent again, and
SkyPilot-side failures (FAILED_*, a job gone from the queue, the deadline) are retried ``retry_budget`` times
then ``infra_failed``. SkyPilot's own recovery (a job whose worker was preempted or lost is RECOVERING, then
RUNNING again on another worker) is one attempt here: its pod time over both runs is in ``job_duration``.

GPUs per job come from the one rule (:func:`ait_env.jobs.gpus.gpus_for_job`: the job's base model and
``seq_len``), unless ``gpus_per_job`` pins them. Needs SkyPilot's SDK (``pip install -e '.[skypilot]'``) and
its API server (``sky api info``). Options: :class:`fleet.settings.SkypilotOptions`
(``conf/backend/skypilot.yaml``; unknown keys are refused).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ait_env.backends.base import Backend
from ait_env.backends.runpod import RunpodBackend
from ait_env.jobs.bundle import JobBundle
from ait_env.jobs.gpus import gpus_for_job
from ait_env.jobs.settings import BackendSettings, worker_settings
from fleet.dispatch import Dispatcher
from fleet.journal import Journal
from fleet.settings import SkypilotOptions
from fleet.skypilot_engine import JOURNAL_NAME, SkypilotEngine, SkySDK



class SkypilotBackend(RunpodBackend):
    Options = SkypilotOptions  # type: ignore[assignment]
    reconcile_module = "fleet.reconcile_pool"

    def __init__(self, settings: BackendSettings, runs_dir: Path | str = "runs", show_progress: bool = True,
                 sdk: SkySDK | None = None, *, clock: Callable[[], float] = time.time,
                 threads: bool = True) -> None:
        """``sdk``: SkyPilot's SDK (tests pass one over a fake ``sky``); ``clock``/``threads``: as the runpod
        backend's."""
        Backend.__init__(self, settings, runs_dir)
        self.options: SkypilotOptions  # type: ignore[assignment]
        self.engine = SkypilotEngine(self.options, sdk)  # type: ignore[assignment]
        self.engine._sizing = [(m.name, settings.bounds.seq_len) for m in settings.models]
        self.worker_settings = worker_settings(settings)
        self._worker_json = self.worker_settings.model_dump(mode="json")
        self._set_hashes: dict[str, str] = {}
        self.dispatch = Dispatcher(self.engine, Journal(Path(self.runs_dir) / JOURNAL_NAME, now=clock),  # type: ignore[arg-type]
                                   self.options, wall_clock_s=settings.bounds.wall_clock_minutes * 60,
                                   on_result=self._check_output, show_progress=show_progress, clock=clock,
                                   threads=threads)

    @property
    def endpoint_costs(self) -> Any:   # a pool has no Serverless endpoint costs
        raise AttributeError("the skypilot backend has no Serverless endpoint; see engine.pool")

    def close(self) -> None:
        """As the runpod backend's, then say what keeps billing: the pool stays up (it is shared by runs and
        owned by ``python -m fleet.pool``), and how to stop it."""
        if self.closed:
            return
        super().close()
        from fleet.pool import lifecycle_note

        self.dispatch.say(lifecycle_note(self.engine.pool))
        if not self.run_costs().measured:
            self.dispatch.say(f"this run's idle is a per-job estimate and its share of the jobs controller is not "
                              f"charged yet: once the pool has scaled down, python -m fleet.reconcile_pool --runs-dir "
                              f"{self.runs_dir} --correct charges SkyPilot's figures to the run's cost ledger")

    def gpus_for(self, bundle: JobBundle) -> int:
        """GPUs this job gets: ``gpus_per_job``, else the one rule on its base model and seq_len."""
        if self.options.gpus_per_job:   # type: ignore[attr-defined]
            return int(self.options.gpus_per_job)   # type: ignore[attr-defined]
        return gpus_for_job(bundle.manifest.base_model, bundle.job.prime_rl.seq_len).gpus

    def _payload(self, bundle: JobBundle) -> dict[str, Any]:
        return {**super()._payload(bundle), "_gpus": self.gpus_for(bundle)}
