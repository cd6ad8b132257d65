"""The submission state machine of one episode: ``submit_job`` (validate, dispatch, score), the research
episode's ``submit_jobs``, job reports and ``finish`` (:mod:`ait_env.episode.research`), and how the episode
ends (:class:`EpisodeJobs`).

Contract: :meth:`EpisodeJobs.submit` and :meth:`EpisodeJobs.finish` never raise, whatever the submission
holds (an unexpected exception is our bug: the episode ends ``infra_failed``, unscored, never blamed on the
agent, and the traceback goes to the ``ait_env`` log); what the agent reads has every host path redacted
(:func:`ait_env.hidden.redact.for_agent`). Each job that ran is scored as if it were the episode's only job
(:func:`ait_env.episode.reward.episode_reward`); the episode's reward combines them
(:func:`ait_env.episode.reward.combine`: the best, less the research charge). **No voiding**: a failure on our
side (a job ``infra_failed``, the validation sandbox, our bug, a budget refusal) ends the episode, scored on
the jobs that ran; the lost job is dropped alone, and only an episode in which no job ran is dropped
(``infra_failed``). A job's bound is reserved in
the cost ledger before it runs and its charge replaces the reservation. :mod:`ait_env.env` owns one per
episode and wraps it in the Gymnasium contract.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ait_env.episode.research import _ResearchJobs
from ait_env.episode.reward import (End, RewardBreakdown, Status, best_job, combine, episode_reward, ran,
                                    training_share)
from ait_env.episode.tools import ToolOutcome
from ait_env.hidden.baselines import BaselinesNotSeeded
from ait_env.hidden.redact import for_agent
from ait_env.jobs.bundle import build_bundle
from ait_env.jobs.result import JobResult
from ait_env.observe.ledger import BudgetExceeded, CostLedger, CostRecord
from ait_env.sandbox import SandboxError
from ait_env.sandbox.workspace import Workspace
from task_families.base import TaskFamily, TaskSpec

if TYPE_CHECKING:
    from ait_env.backends import Backend
    from ait_env.config import Settings
    from ait_env.probe import ValidationProbe

_log = logging.getLogger("ait_env")
_CURVE_POINTS = 12  # eval points a research episode's job report shows at most


class EpisodeJobs(_ResearchJobs):
    """The jobs of one episode (see the module docstring)."""

    def __init__(self, settings: Settings, backend: Backend, ledger: CostLedger, probe: ValidationProbe,
                 runs_dir: Path, episode_id: str, workspace: Workspace, spec: TaskSpec, family: TaskFamily) -> None:
        self.settings, self.backend, self.ledger, self.probe = settings, backend, ledger, probe
        self.runs_dir, self.episode_id = runs_dir, episode_id
        self._ws, self._spec, self._family = workspace, spec, family
        self.research = settings.env.max_jobs_per_episode > 1
        self.attempts = 0                             # submit_job calls in the episode
        self._job_attempts = 0                        # submit_job calls since the last job ran
        self._validated_attempt: int | None = None
        self._any_parsable = False
        self.breakdown: RewardBreakdown | None = None  # the episode's reward, once it ended
        self.result: JobResult | None = None           # the job the reward counts (between jobs: the best so far)
        self.results: list[JobResult] = []             # every job that ran
        self._job_scores: list[RewardBreakdown] = []   # each job that ran, scored as the episode's only job
        self.batches = 0                               # dispatches (a submit_job or submit_jobs call that ran jobs)
        self.done = False

    @property
    def jobs_ran(self) -> int:
        return len(self._job_scores)

    @property
    def attempts_left(self) -> int:
        return self.settings.env.max_attempts - self._job_attempts

    @property
    def jobs_left(self) -> int:
        return self.settings.env.max_jobs_per_episode - len(self.results)

    def _no_job_status(self) -> Status:
        return "invalid" if self._any_parsable else "unparsable"

    def end(self, end: End, reason: str = "") -> None:
        """End the episode, scored on the jobs that ran (the best, less the research charge); without one,
        ``invalid`` or ``unparsable``."""
        if self._job_scores:
            self.breakdown = combine(self._job_scores, self.settings.reward, attempts=self.attempts, end=end,
                                      reason=reason)
            best = self.breakdown.best_job
            self.result = self.results[best if best is not None else -1]
        else:
            b = episode_reward(self._no_job_status(), self.settings.reward, attempts=self.attempts,
                               reason=reason)
            self.breakdown = b.model_copy(update={"end": end})
        self.done = True

    def _any_ran(self) -> bool:
        return any(ran(j) for j in self._job_scores)

    def _drop(self, reason: str) -> None:
        """End the episode because our side failed outside a job's run (sandbox, our bug, a budget refusal of
        the first job): scored on the jobs that ran (no voiding); with none, ``infra_failed``, unscored, never
        blamed on the agent."""
        if self._any_ran():
            self.end("infra_failed", reason=reason)
            return
        b = episode_reward("infra_failed", self.settings.reward, attempts=self.attempts,
                           validated_attempt=self._validated_attempt, reason=reason)
        self.breakdown = b.model_copy(update={"jobs": list(self._job_scores), "end": "infra_failed"})
        self.done = True

    def _ours(self) -> str:
        """How an answer ends when our side failed and the episode ended (after :meth:`_drop` or an
        ``infra_failed`` job): not counted against the agent; scored on the jobs that ran, if any."""
        if self.breakdown is not None and self.breakdown.total is not None:
            return (f"This is not counted against you: the episode ends, scored on the jobs that ran. "
                    f"{self.closing()}")
        return "This is not counted against you; the episode ends unscored."

    def _add_job(self, result: JobResult, status: Status, *, attempts: int | None = None,
                 validated_attempt: int | None = None, batch: int | None = None, **kw: Any) -> RewardBreakdown:
        """Score the job that just ran as if it were the episode's only job (``attempts``/``validated_attempt``:
        that job's; default: the submit_job attempts since the last job ran). Between jobs, ``info["job"]`` is
        the best job so far. The caller resets the next job's attempts."""
        attempts = self._job_attempts if attempts is None else attempts
        validated_attempt = self._validated_attempt if validated_attempt is None else validated_attempt
        score = episode_reward(status, self.settings.reward, attempts=attempts,
                               validated_attempt=validated_attempt, **kw)
        score = score.model_copy(update={"job_id": result.job_id, "cost_usd": result.cost_usd,
                                         "cache_hit": bool(result.cache_hit),
                                         "batch": self.batches - 1 if batch is None else batch})
        self._job_scores.append(score)
        if ran(score):
            self.result = self.results[best_job(self._job_scores)]
        return score

    def budget_left(self) -> float | None:
        """What is left of the episode's USD budget (``env.ledger.episode_budget_usd``); None: no budget."""
        budget = self.ledger.episode_budget_usd
        return None if budget is None else budget - self.ledger.spent(self.episode_id)

    def closing(self) -> str:
        """How the episode's reward was made up, for the agent's last observation."""
        b = self.breakdown
        assert b is not None and b.total is not None and b.best_job is not None
        n, best = sum(1 for j in b.jobs if ran(j)), b.jobs[b.best_job]
        if not b.charge:
            return f"Reward {b.total:.3f}" + (f": job {b.best_job + 1}, the best of {n}." if n > 1 else ".")
        return (f"Reward {b.total:.3f}: job {b.best_job + 1}'s {best.gym_reward:.3f} less a charge of "
                f"{b.charge:.3f} for {n - 1} more job{'s' if n > 2 else ''}.")

    # ------------------------------------------------------------------ submit_job
    def submit(self) -> ToolOutcome:
        """``submit_job``: validate, dispatch, score. Never raises, whatever the submission holds: an
        unexpected exception is our bug, so the episode ends ``infra_failed`` (unscored, never blamed on
        the agent) and the traceback goes to the ``ait_env`` log. What the agent reads has every host
        path redacted (:func:`ait_env.hidden.redact.for_agent`)."""
        try:
            outcome = self._submit_checked()
        except Exception as exc:  # noqa: BLE001 - the contract: step never raises
            outcome = self._internal_error("submit_job", exc)
        outcome.text = for_agent(outcome.text)
        return outcome

    def _submit_checked(self) -> ToolOutcome:
        assert self._ws is not None and self._spec is not None and self._family is not None
        max_attempts = self.settings.env.max_attempts
        self.attempts += 1
        self._job_attempts += 1
        try:
            report, job = self.probe.run(self._ws.root, self._spec, self._family)
        except SandboxError as exc:
            self._drop(f"validation sandbox failed: {exc}")
            return ToolOutcome("submit_job", False, f"The validation sandbox failed ({exc}); this is our fault, "
                               f"not yours. {self._ours()}", ends_episode=True)
        self._any_parsable = self._any_parsable or report.parsable
        ours = [f for f in report.failures if f.code == "backend_config"]
        if ours:   # the backend cannot run what it offers: our configuration, never the agent's fault
            self._drop(f"backend configuration: {ours[0].message}")
            return ToolOutcome("submit_job", False, f"Your job could not be run because of our configuration "
                               f"({ours[0].message}). {self._ours()}", ends_episode=True)
        if job is None:
            left = max_attempts - self._job_attempts
            text = report.render()
            if left > 0:
                return ToolOutcome("submit_job", False, f"{text}\n\nFix these and call submit_job again "
                                   f"({left} attempt{'s' if left != 1 else ''} left).")
            n_ran = len(self._job_scores)
            self.end("attempts", reason="no valid submission within the attempt limit")
            return ToolOutcome("submit_job", False, f"{text}\n\nNo attempts left; the episode ends."
                               + (f" It counts your best job. {self.closing()}" if n_ran else ""),
                               ends_episode=True)
        self._validated_attempt = self._job_attempts
        return self._dispatch(job)

    def _record(self, bundle: Any, hold: Any, result: JobResult) -> None:
        """A job that ran: kept, its ledger reservation replaced by its charge, its result saved."""
        self.results.append(result)
        self.result = result
        self.ledger.settle(hold, CostRecord(kind="gpu_job", episode_id=self.episode_id, seconds=result.wall_seconds,
                                            usd=result.cost_usd, meta={"job_id": result.job_id,
                                                                       "backend": result.backend,
                                                                       "status": result.status,
                                                                       "cache_hit": bool(result.cache_hit)}))
        if not (bundle.root / "result.json").exists():  # written by the runner for the jobs it ran
            result.save(bundle.root / "result.json")

    def _charge_run_costs(self) -> None:
        try:   # the run's own costs (idle, always-on workers) catch up: the global budget sees them
            self.backend.charge_run_costs(self.ledger)
        except Exception:  # noqa: BLE001 - accounting must not end the episode; the journal keeps the figures
            _log.exception("charging the backend's run costs to %s failed", self.ledger.path)

    def _dispatch(self, job: Any) -> ToolOutcome:
        assert self._ws is not None and self._family is not None and self._spec is not None
        try:
            bundle = build_bundle(self._ws.root, job, self._family, self.runs_dir / "jobs",
                                  episode_id=self.episode_id,
                                  renderer=self._spec.bounds.model_renderers.get(job.job.base_model))
            # the job's bound is held against the budgets until its charge replaces it (ait_env/observe/ledger.py)
            estimate = self.backend.estimate_cost_usd(bundle)
            hold = self.ledger.reserve(self.episode_id, estimate, what=bundle.job_id)
        except BudgetExceeded as exc:
            if self._job_scores:  # a research episode whose budget cannot pay for one more job
                self.end("budget", reason=f"dispatch refused: {exc}")
                return ToolOutcome("submit_job", False, f"Your job is valid, but the episode's budget cannot "
                                   f"pay for it: {exc}. It is not run and not charged; the episode ends with "
                                   f"your best job. {self.closing()}", ends_episode=True)
            self._drop(f"dispatch refused: {exc}")
            return ToolOutcome("submit_job", False, f"Your job is valid, but it could not be dispatched: {exc}. "
                               f"{self._ours()}", ends_episode=True)
        t0 = time.time()
        try:
            result = self.backend.run(bundle)
        except Exception as exc:  # noqa: BLE001 - any backend crash is an infrastructure failure
            result = JobResult(job_id=bundle.job_id, backend=self.backend.name, status="infra_failed",
                               error=f"{type(exc).__name__}: {exc}", wall_seconds=time.time() - t0)
        self.batches += 1
        self._record(bundle, hold, result)
        self._charge_run_costs()
        if result.status == "infra_failed":   # dropped alone: the jobs that ran keep their scores (no voiding)
            self._add_job(result, "infra_failed", reason=result.error or "infrastructure failure")
            self._next_job()
            self.end("infra_failed", reason=result.error or "infrastructure failure")
            return ToolOutcome("submit_job", True, "Your job was valid but the infrastructure failed "
                               f"({result.error}); the job does not count. {self._ours()}", ends_episode=True)
        if result.status == "job_failed":
            score = self._add_job(result, "job_failed", reason=result.error,
                                  best_pre=self._best_pre_if_known(result), fault=result.fault)
            self._next_job()
            if self.research:
                return self._after_job(result, score, bundle)
            self.end("job_limit")
            return ToolOutcome("submit_job", True, f"Your job was valid but failed while running: {result.error}\n"
                               f"{result.log_tail[-1500:]}", ends_episode=True)
        try:
            best_pre = self._best_pre(result)
        except BaselinesNotSeeded as exc:
            self._add_job(result, "infra_failed", reason=str(exc))
            self._next_job()
            self.end("infra_failed", reason=str(exc))
            return ToolOutcome("submit_job", True, f"Your job ran but could not be scored ({exc}); the job does "
                               f"not count. {self._ours()}", ends_episode=True)
        score = self._add_job(result, "scored", post=result.post_score, best_pre=best_pre,
                              train_seconds=result.train_seconds,
                              wall_clock_limit_s=self._spec.bounds.wall_clock_minutes * 60,
                              train_fraction=self._training_share(bundle))
        self._next_job()
        if self.research:
            return self._after_job(result, score, bundle)
        self.end("job_limit")
        b = self.breakdown
        assert b is not None and b.total is not None
        label = " [SURROGATE score: stub backend, nothing was trained]" if result.surrogate else ""
        return ToolOutcome("submit_job", True,
                           f"Job {result.job_id} finished{label}: hidden-eval score {result.post_score:.3f} "
                           f"(best untrained base {best_pre:.3f}, uplift {b.uplift:+.3f}). Reward {b.total:.3f}.",
                           ends_episode=True)

    def _next_job(self, refused: int = 0) -> None:
        """A job ran: the next one has its attempts again, less the ``refused`` folders of the same
        ``submit_jobs`` call (their next submission is their next attempt)."""
        self._job_attempts = min(refused, self.settings.env.max_attempts - 1)
        self._validated_attempt = None

    def _after_job(self, result: JobResult, score: RewardBreakdown, bundle: Any) -> ToolOutcome:
        """A research episode's answer to a job that ran: its result, then either the end (the job limit, or
        a budget that cannot pay for another job like this one) or what is left and how to go on."""
        return self._after_jobs(self._job_report(result, score, bundle.job.job.base_model), bundle, "submit_job")

    def _job_report(self, result: JobResult, score: RewardBreakdown, model: str, k: int | None = None,
                    folder: str = "") -> str:
        """What a research episode's agent reads about a job that ran (``k``: its number in the episode,
        default the last; ``folder``: the workspace folder it came from, for a batch)."""
        k = len(self._job_scores) if k is None else k
        limit = self.settings.env.max_jobs_per_episode
        where = f" from {folder}" if folder else ""
        label = " [SURROGATE score: stub backend, nothing was trained]" if result.surrogate else ""
        if score.status == "job_failed":
            lines = [f"Job {k} of {limit}{where} ({result.job_id}) was valid but failed while running: "
                     f"{result.error}", result.log_tail[-1500:]]
        else:
            assert result.post_score is not None and score.best_pre is not None and score.uplift is not None
            ci = f" ± {result.post_ci95:.3f}" if result.post_ci95 is not None else ""
            pre = result.baselines.get(model)
            mine = f"{model} before training {pre:.3f}; " if pre is not None else ""
            cached = " [served from the cache: an identical job ran before; not charged]" if result.cache_hit else ""
            lines = [f"Job {k} of {limit}{where} ({result.job_id}) finished{label}{cached}: hidden-eval score "
                     f"{result.post_score:.3f}{ci} ({mine}best untrained base {score.best_pre:.3f}; uplift "
                     f"{score.uplift:+.3f})."]
        steps, scores = result.curves.get("eval_step") or [], result.curves.get("eval_score") or []
        if steps and len(steps) == len(scores):
            shown = list(range(len(steps)))
            if len(steps) > _CURVE_POINTS:  # evenly thinned, first and last kept
                last = len(steps) - 1
                shown = sorted({round(i * last / (_CURVE_POINTS - 1)) for i in range(_CURVE_POINTS)})
            lines.append("Eval points during training (step: score): "
                         + ", ".join(f"{steps[i]:g}: {scores[i]:.3f}" for i in shown))
        lines.append(f"Wall time {result.wall_seconds:.1f} s (training {result.train_seconds:.1f} s); "
                     f"cost ${result.cost_usd:.2f}. This job's reward on its own: {score.gym_reward:.3f}.")
        return "\n".join(line for line in lines if line)

    def _best_pre_if_known(self, result: JobResult) -> float | None:
        """:meth:`_best_pre`, or None where no baseline is known (a failed job's reward does not use it: a job
        that dies before any base model was measured must still be charged to the agent)."""
        try:
            return self._best_pre(result)
        except BaselinesNotSeeded:
            return None

    def _training_share(self, bundle: Any) -> float | None:
        """The speed term's measure where the backend's wall time is not the job's (``speed_measure ==
        "rollouts"``: the local CPU backend): the rollouts it trained on over the bounds'; None: wall time."""
        if getattr(self.backend, "speed_measure", "wall_time") != "rollouts":
            return None
        p, b = bundle.job.prime_rl, self._spec.bounds
        return training_share(p.max_steps, p.batch_size, b.max_steps, b.max_batch_size)

    def _best_pre(self, result: JobResult) -> float:
        """The best untrained score of the allowed models: what the job was compared with (its result's
        baselines), completed by the one baselines policy (:meth:`BaselineStore.best_pre`)."""
        job = self.backend.job_context(self._spec.family, self._spec.bounds.base_models)
        return self.backend.baselines.best_pre(job, result.baselines)
