"""The research episode's part of the submission state machine (a part of
:class:`ait_env.episode.submission.EpisodeJobs`, whose contract holds here too): ``submit_jobs`` (several
folders validated, then run as one batch), their job reports, and ``finish`` (the episode ends on the best job
so far)."""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from ait_env.episode.reward import best_job, ran
from ait_env.episode.tools import ToolOutcome
from ait_env.hidden.baselines import BaselinesNotSeeded
from ait_env.hidden.redact import for_agent
from ait_env.jobs.bundle import build_bundle
from ait_env.observe.ledger import BudgetExceeded
from ait_env.sandbox import SandboxError
from ait_env.sandbox.workspace import WorkspaceError

_log = logging.getLogger("ait_env")


class _ResearchJobs:
    """``submit_jobs`` and ``finish`` (see the module docstring)."""

    def _internal_error(self, tool: str, exc: Exception) -> ToolOutcome:
        """What ``submit_job`` or ``submit_jobs`` answers when it raised inside the env: our bug, so the
        traceback goes to the log and the episode is dropped (``infra_failed``: unscored, never the agent's)."""
        _log.exception("%s failed inside the env (episode %s)", tool, self.episode_id)
        self._drop(f"internal error in {tool}: {type(exc).__name__}: {exc}")
        return ToolOutcome(tool, False, "Your submission could not be processed because of an internal error on "
                           f"our side ({type(exc).__name__}: {exc}). {self._ours()}", ends_episode=True)

    def submit_many(self, folders: list[str]) -> ToolOutcome:
        """``submit_jobs``: several jobs at once, one per workspace folder. Each is validated on its own (a
        refused one does not stop the others; each folder is one submit attempt), the valid ones run
        concurrently on the backend (:meth:`Backend.run_batch`) and are reported together. Never raises
        (the contract of :meth:`submit`)."""
        staged: list[Path] = []
        try:
            outcome = self._submit_many_checked(folders, staged)
        except Exception as exc:  # noqa: BLE001 - the contract: step never raises
            outcome = self._internal_error("submit_jobs", exc)
        finally:
            for path in staged:
                shutil.rmtree(path, ignore_errors=True)
        outcome.text = for_agent(outcome.text)
        return outcome

    def _folders(self, folders: list[str]) -> tuple[list[str], str]:
        """The folders as workspace paths ("." the root), or an error that names what is wrong (the call is
        then refused whole and counts no attempt)."""
        assert self._ws is not None
        out: list[str] = []
        for folder in folders:
            name = folder.strip().strip("/")
            try:
                rel = "." if name in ("", ".") else self._ws.normalise(name)
                path = self._ws.root if rel == "." else self._ws.resolve(rel)
            except WorkspaceError as exc:
                return [], f"error: folder {folder!r}: {exc}"
            if not path.is_dir():
                return [], (f"error: {folder!r} is not a folder of the workspace. Write each job's files into "
                            f"its own folder (e.g. write_file {rel}/job.toml and {rel}/environment.py), then "
                            "name the folders.")
            if rel in out:
                return [], f"error: folder {rel!r} is named twice; name each job's folder once."
            out.append(rel)
        if not out:
            return [], "error: folders is empty; name at least one folder that holds a complete job."
        if len(out) > self.jobs_left:
            return [], (f"error: you named {len(out)} folders but have {self.jobs_left} job"
                        f"{'s' if self.jobs_left != 1 else ''} left in this episode; submit at most that many. "
                        "Nothing was validated or run.")
        return out, ""

    def _stage(self, rel: str, staged: list[Path]) -> Path:
        """The directory the probe and the bundle read for a folder's job: the folder's files with the
        workspace's read-only files (``family_tools.py``); the root's job is the workspace itself."""
        assert self._ws is not None
        if rel == ".":
            return self._ws.root
        root = Path(tempfile.mkdtemp(prefix="ait-job-", dir=self._ws.root.parent))
        staged.append(root)
        shutil.copytree(self._ws.root / rel, root, symlinks=True, dirs_exist_ok=True)
        for name in self._ws.read_only:
            shutil.copyfile(self._ws.root / name, root / name)
        return root

    def _submit_many_checked(self, folders: list[str], staged: list[Path]) -> ToolOutcome:
        assert self._ws is not None and self._spec is not None and self._family is not None
        tool, max_attempts = "submit_jobs", self.settings.env.max_attempts
        names, error = self._folders(folders)
        if error:
            return ToolOutcome(tool, False, error)
        base = self._job_attempts              # refused submissions since a job last ran
        sections: dict[int, str] = {}
        valid: list[tuple[int, str, Any, Path]] = []
        for i, rel in enumerate(names):
            self.attempts += 1
            root = self._stage(rel, staged)
            try:
                report, job = self.probe.run(root, self._spec, self._family)
            except SandboxError as exc:
                self._drop(f"validation sandbox failed: {exc}")
                return ToolOutcome(tool, False, f"The validation sandbox failed ({exc}); this is our fault, "
                                   f"not yours. {self._ours()}", ends_episode=True)
            self._any_parsable = self._any_parsable or report.parsable
            ours = [f for f in report.failures if f.code == "backend_config"]
            if ours:
                self._drop(f"backend configuration: {ours[0].message}")
                return ToolOutcome(tool, False, f"Your job in {rel} could not be run because of our configuration "
                                   f"({ours[0].message}). {self._ours()}", ends_episode=True)
            if job is None:
                sections[i] = f"Folder {rel}: refused, not run.\n{report.render()}"
            else:
                valid.append((i, rel, job, root))
        refused = len(names) - len(valid)
        if not valid:
            self._job_attempts = base + refused
            left = max_attempts - self._job_attempts
            text = "\n\n".join(sections[i] for i in sorted(sections))
            if left > 0:
                return ToolOutcome(tool, False, f"{text}\n\nNo job was valid. Fix these and submit again ({left} "
                                   f"attempt{'s' if left != 1 else ''} left; each folder submitted counts as one).")
            n_ran = len(self._job_scores)
            self.end("attempts", reason="no valid submission within the attempt limit")
            return ToolOutcome(tool, False, f"{text}\n\nNo attempts left; the episode ends."
                               + (f" It counts your best job. {self.closing()}" if n_ran else ""), ends_episode=True)
        # bundle and reserve each valid job; one the budget cannot pay for is neither run nor charged
        planned: list[tuple[int, str, Any, Any]] = []
        for i, rel, job, root in valid:
            bundle = build_bundle(root, job, self._family, self.runs_dir / "jobs", episode_id=self.episode_id,
                                  renderer=self._spec.bounds.model_renderers.get(job.job.base_model))
            try:
                hold = self.ledger.reserve(self.episode_id, self.backend.estimate_cost_usd(bundle),
                                           what=bundle.job_id)
            except BudgetExceeded as exc:
                sections[i] = (f"Folder {rel}: valid, but the episode's budget cannot pay for it: {exc}. It is "
                               "not run and not charged.")
                continue
            planned.append((i, rel, bundle, hold))
        if not planned:
            if self._job_scores:
                self.end("budget", reason="dispatch refused: the budget cannot pay for another job")
                text = "\n\n".join(sections[i] for i in sorted(sections))
                return ToolOutcome(tool, False, f"{text}\n\nThe episode ends with your best job. {self.closing()}",
                                   ends_episode=True)
            self._drop("dispatch refused: the budget cannot pay for a job")
            return ToolOutcome(tool, False, "Your jobs are valid, but none could be dispatched within the budget. "
                               f"{self._ours()}", ends_episode=True)
        t0 = time.time()
        results = self.backend.run_batch([b for _, _, b, _ in planned])
        wall = time.time() - t0
        self.batches += 1
        validated = base + 1
        reports: list[str] = []
        for (i, rel, bundle, hold), result in zip(planned, results, strict=True):
            self._record(bundle, hold, result)
            kw: dict[str, Any] = {"attempts": validated, "validated_attempt": validated}
            if result.status == "infra_failed":   # dropped alone (no voiding): reported, never scored
                self._add_job(result, "infra_failed", reason=result.error or "infrastructure failure", **kw)
                sections[i] = (f"Folder {rel}: valid, but the infrastructure failed ({result.error}); this job "
                               "does not count (not scored, not charged).")
                continue
            if result.status == "job_failed":
                score = self._add_job(result, "job_failed", reason=result.error,
                                      best_pre=self._best_pre_if_known(result), fault=result.fault, **kw)
            else:
                try:
                    best_pre = self._best_pre(result)
                except BaselinesNotSeeded as exc:
                    self._add_job(result, "infra_failed", reason=str(exc), **kw)
                    sections[i] = (f"Folder {rel}: ran, but could not be scored on our side ({exc}); this job "
                                   "does not count (not scored, not charged).")
                    continue
                score = self._add_job(result, "scored", post=result.post_score, best_pre=best_pre,
                                      train_seconds=result.train_seconds,
                                      wall_clock_limit_s=self._spec.bounds.wall_clock_minutes * 60,
                                      train_fraction=self._training_share(bundle), **kw)
            sections[i] = self._job_report(result, score, bundle.job.job.base_model, k=len(self._job_scores),
                                           folder=rel)
            reports.append(rel)
        self._charge_run_costs()
        self._next_job(refused)
        lost = [j for j in self._job_scores if not ran(j)]
        if lost:   # the jobs that ran keep their scores; the lost ones are dropped alone (no voiding)
            self.end("infra_failed", reason=lost[0].reason)
            text = "\n\n".join(sections[i] for i in sorted(sections))
            return ToolOutcome(tool, True, f"{text}\n\nThe infrastructure failed for {len(lost)} of your jobs. "
                               f"{self._ours()}", ends_episode=True)
        longest = max(r.wall_seconds for r in results)
        head = (f"Ran {len(planned)} job{'s' if len(planned) != 1 else ''} at once in {wall:.1f} s (the longest "
                f"{longest:.1f} s; one after another they would have taken about "
                f"{sum(r.wall_seconds for r in results):.1f} s).")
        text = head + "\n\n" + "\n\n".join(sections[i] for i in sorted(sections))
        return self._after_jobs(text, planned[-1][2], tool)

    def finish(self) -> ToolOutcome:
        """``finish`` (research episodes only): end now, scored on the jobs that ran."""
        n_ran = len(self._job_scores)
        self.end("finish", reason="the agent called finish")
        b = self.breakdown
        assert b is not None
        if not n_ran:
            return ToolOutcome("finish", True, f"Episode finished without a job ({b.status}): reward "
                               f"{b.gym_reward:.3f}.", ends_episode=True)
        return ToolOutcome("finish", True, f"Episode finished after {n_ran} job{'s' if n_ran != 1 else ''}. "
                           f"{self.closing()}", ends_episode=True)

    def _after_jobs(self, text: str, bundle: Any, tool: str) -> ToolOutcome:
        """The end of a research episode's answer to the jobs that just ran (``text``: their reports): the
        episode's end, or what is left and how to go on."""
        es, charge = self.settings.env, self.settings.reward.research
        n, limit = len(self._job_scores), es.max_jobs_per_episode
        if n >= limit:
            self.end("job_limit")
            return ToolOutcome(tool, True, f"{text}\n\nThat was the last of your {limit} jobs; the "
                               f"episode ends. {self.closing()}", ends_episode=True)
        left, estimate = self.budget_left(), self.backend.estimate_cost_usd(bundle)
        if left is not None and left < estimate:
            self.end("budget")
            return ToolOutcome(tool, True, f"{text}\n\nThe episode's budget cannot pay for another "
                               f"job like this one (${left:.2f} left, ${estimate:.2f} a job); the episode "
                               f"ends. {self.closing()}", ends_episode=True)
        best = best_job(self._job_scores)
        budget = ("no USD budget" if left is None
                  else f"${left:.2f} of ${self.ledger.episode_budget_usd:.2f} left")
        usd = f" plus {charge.per_usd:g} per USD it costs" if charge.per_usd else ""
        return ToolOutcome(tool, True,
                           f"{text}\n\nBest so far: job {best + 1} (reward "
                           f"{self._job_scores[best].gym_reward:.3f} on its own). Jobs left: {limit - n} "
                           f"of {limit}; budget: {budget}. Revise the workspace and call submit_job to run "
                           f"another job, or submit_jobs to run several at once (each charged "
                           f"{charge.per_extra_job:g} in reward{usd}; a job identical to one that ran is "
                           "served from the cache, free), or call finish to end the episode with your best job.")
