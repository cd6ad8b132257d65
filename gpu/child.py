"""The runner child (``python -m gpu.worker --child <request.json>``, :func:`child_main`): one request, then
exit. A job runs through :func:`ait_env.runner.run` with each executor wrapped in :class:`GuardedExecutor`
(the training tree cannot outlive ``train``: every process it left is killed and none may be left before the
post eval starts); a baseline is the executor's ``measure_base`` on the family's hidden set, through the same
harness (:func:`measure_baseline`, on :func:`carrier_bundle`)."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


from ait_env.jobs.settings import RunnerSettings
from ait_env.hidden.baselines import BaselineEntry
from gpu import isolation
from ait_env import processes
from gpu.isolation import JailConfig

from gpu.request import BaselineOutcome, WorkerRequest


def carrier_bundle(family: str, model: str, parent: Path, executor: str) -> Any:
    """A bundle of ``family``'s reference job on ``model``: what the executor factory needs to exist (a
    baseline request trains nothing and imports none of its code)."""
    from task_families import reference_files
    from ait_env.jobs.bundle import build_bundle
    from ait_env.jobs.schema import parse_job
    from task_families import get_family

    ws = Path(parent) / "ws"
    ws.mkdir(parents=True)
    files = reference_files(family, model, backend=executor)
    for name, text in files.items():
        (ws / name).write_text(text)
    job, issues = parse_job(files["job.toml"])
    if job is None:
        raise RuntimeError(f"the reference job of {family} does not validate for {model}: {issues}")
    return build_bundle(ws, job, get_family(family), Path(parent) / "jobs", job_id=f"baseline-{family}")


class GuardedExecutor:
    """A trainer executor whose training tree cannot outlive ``train`` (see the module docstring). Wraps the
    runner's executor in the runner child; everything else is delegated."""

    def __init__(self, inner: Any, log: Callable[[str], None], jail: JailConfig, report: Path | None) -> None:
        self.inner = inner
        self.log = log
        self.jail = jail
        self.report = report
        self.before_job = processes.live_descendants(os.getpid())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _contain(self, keep: set[int], when: str) -> None:
        from ait_env.runner import InfraFailed

        uid = self.jail.uid if os.getuid() == 0 else None
        killed, survivors = processes.kill_all(uid=uid, below=os.getpid(), keep=keep)
        state = json.loads(self.report.read_text()) if self.report and self.report.exists() else {}
        state[when] = {"killed": len(killed), "survivors": sorted(survivors)}
        if self.report:
            self.report.write_text(json.dumps(state))
        if survivors:
            raise InfraFailed(f"{len(survivors)} process(es) of the training tree survived SIGKILL {when} "
                              f"(pids {sorted(survivors)[:10]}); the eval did not run on this worker")
        self.log(f"training tree: {len(killed)} leftover process(es) killed {when}; none left" if killed
                 else f"training tree: no process left {when}")

    def train(self, eval_point: Callable[[int], float | None]) -> Any:
        keep = processes.live_descendants(os.getpid())   # the executor's servers, started before training
        try:
            return self.inner.train(eval_point)
        finally:
            self._contain(keep, "after training, before the post eval")

    def close(self) -> None:
        try:
            self.inner.close()
        finally:
            self._contain(self.before_job, "after the job")


def guarded_factory(executor: str, jail: JailConfig, report: Path | None) -> Callable[..., Any]:
    """The runner's executor factory for ``executor``, each executor wrapped in :class:`GuardedExecutor`
    (passed to :func:`ait_env.runner.run`; the settings' backend name still names the baseline store and
    the result)."""
    from ait_env.runner import executor_factory

    inner = executor_factory(executor)
    return lambda bundle, settings, log, progress: GuardedExecutor(inner(bundle, settings, log, progress),
                                                                   log, jail, report)


def measure_baseline(req: WorkerRequest, log: Callable[[str], None]) -> BaselineOutcome:
    """The baseline request, in the runner child: ``measure_base`` of the executor on the full hidden set
    (``eval_limit`` in tests), through the same harness the runner uses."""
    import ait_env.runner as runner
    from ait_env.hidden.secrets import hidden_set, job_context
    from task_families import get_family

    assert req.family and req.model
    settings = RunnerSettings.of(req.settings.options)
    fam = get_family(req.family)
    n = min(settings.eval_limit or len(hidden_set(fam.name)), len(hidden_set(fam.name)))
    scored = runner.hidden_evaluator(fam.name, settings)

    def evaluate(served: runner.Served) -> Any:
        return scored(served, n)

    with tempfile.TemporaryDirectory(prefix="ait-baseline-") as tmp:
        try:
            bundle = carrier_bundle(fam.name, req.model, Path(tmp), req.executor)
            executor = runner.executor_factory(req.executor)(bundle, req.settings, log, False)
        except runner.InfraFailed as exc:
            return BaselineOutcome(status="infra_failed", error=str(exc))
        try:
            log(f"measuring the untrained {req.model} on {n} hidden {fam.name} instances")
            res = executor.measure_base(req.model, evaluate)
            ctx = job_context(fam.name, [req.model], {req.model: executor.weights_hash(req.model)})
            entry = BaselineEntry(backend=req.settings.name, family=ctx.family, model=req.model,
                                  score=res.score, ci95=res.ci95, n=res.n, hidden_set_hash=ctx.hidden_set_hash,
                                  model_hash=ctx.weights_hash(req.model),
                                  command=f"python scripts/seed_baselines.py backend={req.settings.name}")
            log(f"{req.model} on {fam.name}: {entry.score:.3f} ± {entry.ci95:.3f} (n={entry.n})")
            return BaselineOutcome(status="succeeded", entry=entry)
        except runner.InfraFailed as exc:
            return BaselineOutcome(status="infra_failed", error=str(exc))
        finally:
            executor.close()


def child_main(request_path: Path) -> int:
    """The runner child (``--child``): one request, then exit."""
    import ait_env.runner as runner

    req = WorkerRequest.model_validate_json(Path(request_path).read_text())
    processes.become_subreaper()
    jail = isolation.TrainingJail.from_env().config
    report = req.private_dir / "guard.json" if req.private_dir else None
    if req.kind == "job":
        assert req.bundle_dir is not None
        runner.run(req.bundle_dir, req.settings, progress=False, baselines_dir=req.baselines_dir,
                   executor=guarded_factory(req.executor, jail, report))
        return 0

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    try:
        outcome = measure_baseline(req, log)
    except Exception as exc:  # noqa: BLE001 - anything else is ours
        outcome = BaselineOutcome(status="infra_failed", error=f"{type(exc).__name__}: {exc}"[:2000])
    assert req.private_dir is not None
    (req.private_dir / "baseline.json").write_text(outcome.model_dump_json())
    return 0
