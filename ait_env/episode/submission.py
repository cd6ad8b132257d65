"""The submission state machine of one episode: ``submit_job`` (validate, dispatch, score), the research
episode's job reports and ``finish``, and how the episode ends (:class:`EpisodeJobs`).

Contract: :meth:`EpisodeJobs.submit` and :meth:`EpisodeJobs.finish` never raise, whatever the submission
holds (an unexpected exception is our bug: the episode ends ``infra_failed``, unscored, never blamed on the
agent, and the traceback goes to the ``ait_env`` log); what the agent reads has every host path redacted
(:func:`ait_env.hidden.redact.for_agent`). Each job that ran is scored as if it were the episode's only job
(:func:`ait_env.episode.reward.episode_reward`); the episode's reward combines them
(:func:`ait_env.episode.reward.combine`: the best, less the research charge). A job's bound is reserved in
the cost ledger before it runs and its charge replaces the reservation. :mod:`ait_env.env` owns one per
episode and wraps it in the Gymnasium contract.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ait_env.episode.reward import End, RewardBreakdown, Status, best_job, combine, episode_reward, training_share
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


class EpisodeJobs:
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

    def _drop(self, reason: str) -> None:
        """End the episode ``infra_failed`` outside a job's run (sandbox, our bug, a budget refusal of the
        first job): unscored, never blamed on the agent."""
        b = episode_reward("infra_failed", self.settings.reward, attempts=self.attempts,
                           validated_attempt=self._validated_attempt, reason=reason)
        self.breakdown = b.model_copy(update={"jobs": list(self._job_scores), "end": "infra_failed"})
        self.done = True

    def _add_job(self, result: JobResult, status: Status, **kw: Any) -> RewardBreakdown:
        """Score the job that just ran as if it were the episode's only job; the next job's attempts start
        from zero. Between jobs, ``info["job"]`` is the best job so far."""
        score = episode_reward(status, self.settings.reward, attempts=self._job_attempts,
                               validated_attempt=self._validated_attempt, **kw)
        score = score.model_copy(update={"job_id": result.job_id, "cost_usd": result.cost_usd})
        self._job_scores.append(score)
        self._job_attempts = 0
        self._validated_attempt = None
        if status != "infra_failed":
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
        n, best = len(b.jobs), b.jobs[b.best_job]
        if not b.charge:
            return f"Reward {b.total:.3f}" + (f": job {b.best_job + 1} of {n}, the best." if n > 1 else ".")
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
            _log.exception("submit_job failed inside the env (episode %s)", self.episode_id)
            self._drop(f"internal error in submit_job: {type(exc).__name__}: {exc}")
            outcome = ToolOutcome("submit_job", False, "Your submission could not be processed because of an "
                                  f"internal error on our side ({type(exc).__name__}: {exc}); this is not counted "
                                  "against you. The episode ends unscored.", ends_episode=True)
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
                               "not yours. The episode ends unscored.", ends_episode=True)
        self._any_parsable = self._any_parsable or report.parsable
        ours = [f for f in report.failures if f.code == "backend_config"]
        if ours:   # the backend cannot run what it offers: our configuration, never the agent's fault
            self._drop(f"backend configuration: {ours[0].message}")
            return ToolOutcome("submit_job", False, f"Your job could not be run because of our configuration "
                               f"({ours[0].message}); this is not counted against you. The episode ends "
                               "unscored.", ends_episode=True)
        if job is None:
            left = max_attempts - self._job_attempts
            text = report.render()
            if left > 0:
                return ToolOutcome("submit_job", False, f"{text}\n\nFix these and call submit_job again "
                                   f"({left} attempt{'s' if left != 1 else ''} left).")
            ran = len(self._job_scores)
            self.end("attempts", reason="no valid submission within the attempt limit")
            return ToolOutcome("submit_job", False, f"{text}\n\nNo attempts left; the episode ends."
                               + (f" It counts your best job. {self.closing()}" if ran else ""),
                               ends_episode=True)
        self._validated_attempt = self._job_attempts
        return self._dispatch(job)

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
                               "This is not counted against you; the episode ends.", ends_episode=True)
        t0 = time.time()
        try:
            result = self.backend.run(bundle)
        except Exception as exc:  # noqa: BLE001 - any backend crash is an infrastructure failure
            result = JobResult(job_id=bundle.job_id, backend=self.backend.name, status="infra_failed",
                               error=f"{type(exc).__name__}: {exc}", wall_seconds=time.time() - t0)
        self.results.append(result)
        self.result = result
        self.ledger.settle(hold, CostRecord(kind="gpu_job", episode_id=self.episode_id, seconds=result.wall_seconds,
                                            usd=result.cost_usd, meta={"job_id": result.job_id,
                                                                       "backend": result.backend,
                                                                       "status": result.status}))
        try:   # the run's own costs (idle, always-on workers) catch up: the global budget sees them
            self.backend.charge_run_costs(self.ledger)
        except Exception:  # noqa: BLE001 - accounting must not end the episode; the journal keeps the figures
            _log.exception("charging the backend's run costs to %s failed", self.ledger.path)
        if not (bundle.root / "result.json").exists():  # written by the runner for the jobs it ran
            result.save(bundle.root / "result.json")
        if result.status == "infra_failed":
            self._add_job(result, "infra_failed", reason=result.error or "infrastructure failure")
            self.end("infra_failed")
            return ToolOutcome("submit_job", True, "Your job was valid but the infrastructure failed "
                               f"({result.error}); this episode is not scored.", ends_episode=True)
        if result.status == "job_failed":
            score = self._add_job(result, "job_failed", reason=result.error,
                                  best_pre=self._best_pre_if_known(result), fault=result.fault)
            if self.research:
                return self._after_job(result, score, bundle)
            self.end("job_limit")
            return ToolOutcome("submit_job", True, f"Your job was valid but failed while running: {result.error}\n"
                               f"{result.log_tail[-1500:]}", ends_episode=True)
        try:
            best_pre = self._best_pre(result)
        except BaselinesNotSeeded as exc:
            self._add_job(result, "infra_failed", reason=str(exc))
            self.end("infra_failed")
            return ToolOutcome("submit_job", True, f"Your job ran but could not be scored ({exc}); this episode "
                               "is not scored.", ends_episode=True)
        score = self._add_job(result, "scored", post=result.post_score, best_pre=best_pre,
                              train_seconds=result.train_seconds,
                              wall_clock_limit_s=self._spec.bounds.wall_clock_minutes * 60,
                              train_fraction=self._training_share(bundle))
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

    def finish(self) -> ToolOutcome:
        """``finish`` (research episodes only): end now, scored on the jobs that ran."""
        ran = len(self._job_scores)
        self.end("finish", reason="the agent called finish")
        b = self.breakdown
        assert b is not None
        if not ran:
            return ToolOutcome("finish", True, f"Episode finished without a job ({b.status}): reward "
                               f"{b.gym_reward:.3f}.", ends_episode=True)
        return ToolOutcome("finish", True, f"Episode finished after {ran} job{'s' if ran != 1 else ''}. "
                           f"{self.closing()}", ends_episode=True)

    def _after_job(self, result: JobResult, score: RewardBreakdown, bundle: Any) -> ToolOutcome:
        """A research episode's answer to a job that ran: its result, then either the end (the job limit, or
        a budget that cannot pay for another job like this one) or what is left and how to go on."""
        es, charge = self.settings.env, self.settings.reward.research
        text = self._job_report(result, score, bundle.job.job.base_model)
        n, limit = len(self._job_scores), es.max_jobs_per_episode
        if n >= limit:
            self.end("job_limit")
            return ToolOutcome("submit_job", True, f"{text}\n\nThat was the last of your {limit} jobs; the "
                               f"episode ends. {self.closing()}", ends_episode=True)
        left, estimate = self.budget_left(), self.backend.estimate_cost_usd(bundle)
        if left is not None and left < estimate:
            self.end("budget")
            return ToolOutcome("submit_job", True, f"{text}\n\nThe episode's budget cannot pay for another "
                               f"job like this one (${left:.2f} left, ${estimate:.2f} a job); the episode "
                               f"ends. {self.closing()}", ends_episode=True)
        best = best_job(self._job_scores)
        budget = ("no USD budget" if left is None
                  else f"${left:.2f} of ${self.ledger.episode_budget_usd:.2f} left")
        usd = f" plus {charge.per_usd:g} per USD it costs" if charge.per_usd else ""
        return ToolOutcome("submit_job", True,
                           f"{text}\n\nBest so far: job {best + 1} (reward "
                           f"{self._job_scores[best].gym_reward:.3f} on its own). Jobs left: {limit - n} "
                           f"of {limit}; budget: {budget}. Revise the workspace and call submit_job to run "
                           f"another job (charged {charge.per_extra_job:g} in reward{usd}), or call finish "
                           "to end the episode with your best job.")

    def _job_report(self, result: JobResult, score: RewardBreakdown, model: str) -> str:
        """What a research episode's agent reads about a job that ran."""
        k, limit = len(self._job_scores), self.settings.env.max_jobs_per_episode
        label = " [SURROGATE score: stub backend, nothing was trained]" if result.surrogate else ""
        if score.status == "job_failed":
            lines = [f"Job {k} of {limit} ({result.job_id}) was valid but failed while running: "
                     f"{result.error}", result.log_tail[-1500:]]
        else:
            assert result.post_score is not None and score.best_pre is not None and score.uplift is not None
            ci = f" ± {result.post_ci95:.3f}" if result.post_ci95 is not None else ""
            pre = result.baselines.get(model)
            mine = f"{model} before training {pre:.3f}; " if pre is not None else ""
            lines = [f"Job {k} of {limit} ({result.job_id}) finished{label}: hidden-eval score "
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
        return self.backend.baselines.best_pre(self._spec.family, self._spec.bounds.base_models, result.baselines,
                                               self.backend.built_weights_hash)
