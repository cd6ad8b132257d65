"""No voiding (issue 46, item 4): an episode's reward is decided by the jobs that ran. A job lost on our side
(``infra_failed``, the validation sandbox failing, a budget refusal) is dropped alone and ends the episode; the
jobs that ran keep their scores, and only an episode in which no job ran is dropped.

Two properties over generated schedules: :func:`ait_env.episode.reward.combine` over any mix of job outcomes,
and whole research episodes through ``gym.make`` on a scripted stub (single submissions and batches, jobs that
score, fail or are lost, a sandbox that fails between jobs), each compared with the same episode in which the
agent had called ``finish`` instead of dispatching what was lost."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ait_env.agents.reference import with_steps
from ait_env.backends.stub import StubBackend
from ait_env.config import compose
from ait_env.episode.reward import RewardBreakdown, RewardSettings, combine, episode_reward, ran, research_charge
from ait_env.jobs.result import JobResult
from ait_env.sandbox import SandboxError
from task_families import reference_files
from tests.helpers import call

S = RewardSettings()
FILES = reference_files("arithmetic", "Qwen/Qwen3-1.7B")

# ------------------------------------------------------------------------------------------ combine

OUTCOME = st.one_of(
    st.tuples(st.just("scored"), st.floats(0.0, 1.0), st.floats(0.0, 0.9), st.booleans(), st.floats(0.0, 3.0)),
    st.tuples(st.just("job_failed"), st.just(0.0), st.floats(0.0, 0.9), st.booleans(), st.floats(0.0, 3.0)),
    st.tuples(st.just("infra_failed"), st.just(0.0), st.just(0.0), st.booleans(), st.floats(0.0, 3.0)),
)


def _breakdown(o: tuple[str, float, float, bool, float], k: int) -> RewardBreakdown:
    status, post, pre, cache_hit, usd = o
    b = episode_reward(status, S, attempts=1, validated_attempt=1,  # type: ignore[arg-type]
                       post=post if status == "scored" else None, best_pre=pre)
    return b.model_copy(update={"job_id": f"j{k}", "cache_hit": cache_hit, "cost_usd": usd})


@settings(max_examples=300, deadline=None)
@given(st.lists(OUTCOME, min_size=1, max_size=8))
def test_combine_decides_by_the_jobs_that_ran_and_drops_only_an_episode_without_one(outcomes):
    jobs = [_breakdown(o, k) for k, o in enumerate(outcomes)]
    counted = [j for j in jobs if ran(j)]
    b = combine(jobs, S, attempts=len(jobs), end="job_limit")
    assert b.jobs == jobs                                    # every job is reported, lost ones too
    if not counted:
        assert b.status == "infra_failed" and b.total is None and b.drop
        return
    assert not b.drop and b.total is not None and b.status in ("scored", "job_failed")
    alone = combine(counted, S, attempts=len(jobs), end="job_limit")   # as if the lost jobs never were
    assert b.total == pytest.approx(alone.total)
    assert b.charge == pytest.approx(research_charge(counted, S)) and b.best_job is not None
    assert ran(jobs[b.best_job]) and jobs[b.best_job].job_id == alone.job_id
    assert b.total == pytest.approx(max(j.gym_reward for j in counted) - b.charge)


# ------------------------------------------------------------------------------------------ episodes

class PlannedStub(StubBackend):
    """The stub, whose n-th job ends as its plan says: ``("ok", post)`` scores ``post``, ``("failed",)`` dies
    of the job's own fault, ``("lost",)`` is an ``infra_failed`` result, ``("raise",)`` a backend crash."""

    def __init__(self, *args: Any, plan: dict[int, tuple[Any, ...]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.plan = dict(plan)

    def run(self, bundle: Any, timeout: float | None = None) -> JobResult:
        # the jobs of a batch are run in threads; each reads its outcome by its job.toml's max_steps
        kind = self.plan[bundle.job.prime_rl.max_steps]
        if kind[0] == "raise":
            raise RuntimeError("pod lost (simulated)")
        result = super().run(bundle, timeout)
        if kind[0] == "lost":
            return result.model_copy(update={"status": "infra_failed", "post_score": None,
                                             "error": "worker lost (simulated)"})
        if kind[0] == "failed":
            return result.model_copy(update={"status": "job_failed", "post_score": None, "curves": {},
                                             "error": "loss is NaN at step 3"})
        return result.model_copy(update={"post_score": kind[1]})


class FlakyProbe:
    """The env's probe, whose validation sandbox fails once when ``fail`` is set (our side, not the job)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.fail = inner, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def run(self, *args: Any, **kwargs: Any) -> Any:
        if self.fail:
            self.fail = False
            raise SandboxError("the sandbox died (simulated)")
        return self.inner.run(*args, **kwargs)


JOB = st.one_of(st.tuples(st.just("ok"), st.sampled_from([0.1, 0.3, 0.5, 0.7, 0.9])),
                st.just(("failed",)), st.just(("lost",)), st.just(("raise",)))
#: a dispatch: one job (submit_job), several (submit_jobs), or a validation whose sandbox fails
DISPATCH = st.one_of(st.lists(JOB, min_size=1, max_size=3), st.just("sandbox"))


def _numbered(dispatches: list[Any]) -> list[Any]:
    """Each job tagged with its number k (1, 2, ...: its ``max_steps``, which the control keeps)."""
    out, k = [], 0
    for d in dispatches:
        if d == "sandbox":
            out.append(d)
            continue
        out.append([(k := k + 1, job) for job in d])
    return out


def _play(make_env: Any, runs_dir: Path, dispatches: list[Any], limit: int) -> dict[str, Any]:
    """Play the schedule of numbered jobs (:func:`_numbered`; a job's number is its ``max_steps``, so a job keeps
    its own reward wherever it is dispatched), then ``finish`` if the episode is still open; the final info's
    reward breakdown."""
    plan = {k: job for d in dispatches if d != "sandbox" for k, job in d}
    backend = PlannedStub(compose(backend="stub").backend, runs_dir, plan=plan)
    env = make_env(family="arithmetic", backend=backend,
                   overrides={"env": {"max_jobs_per_episode": limit, "max_turns": 30, "probe": {"enabled": False}}})
    env.reset(seed=0)
    jobs = env.unwrapped._jobs
    jobs.probe = FlakyProbe(jobs.probe)
    info: dict[str, Any] = {}
    term = False
    for d in dispatches:
        if d == "sandbox":
            jobs.probe.fail = True
            env.step(call("write_file", path="job.toml", content=with_steps(FILES["job.toml"], 1)) +
                     call("write_file", path="environment.py", content=FILES["environment.py"]))
            _, _, term, _, info = env.step(call("submit_job"))
        elif len(d) == 1:
            env.step(call("write_file", path="job.toml", content=with_steps(FILES["job.toml"], d[0][0])) +
                     call("write_file", path="environment.py", content=FILES["environment.py"]))
            _, _, term, _, info = env.step(call("submit_job"))
        else:
            names = []
            for k, _ in d:
                names.append(f"f{k}")
                env.step(call("write_file", path=f"f{k}/job.toml", content=with_steps(FILES["job.toml"], k)) +
                         call("write_file", path=f"f{k}/environment.py", content=FILES["environment.py"]))
            _, _, term, _, info = env.step(call("submit_jobs", folders=names))
        if term:
            return info["reward"]
    if limit > 1:
        _, _, term, _, info = env.step(call("finish"))
    assert term
    return info["reward"]


def _fits(dispatches: list[Any], limit: int) -> bool:
    return sum(len(d) for d in dispatches if d != "sandbox") <= limit


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(st.lists(DISPATCH, min_size=1, max_size=3).filter(lambda ds: _fits(ds, 4)))
def test_a_job_lost_on_our_side_never_voids_the_jobs_that_ran(make_env, runs_dir, dispatches):
    dispatches = _numbered(dispatches)
    b = _play(make_env, runs_dir / "episode", dispatches, limit=4)
    # where our side first failed: that dispatch's jobs that ran count, nothing after it is dispatched
    cut = next((i for i, d in enumerate(dispatches)
                if d == "sandbox" or any(j[0] in ("lost", "raise") for _, j in d)), None)
    kept = dispatches if cut is None else dispatches[:cut + 1]
    counted = [j for d in kept if d != "sandbox" for _, j in d if j[0] in ("ok", "failed")]
    if not counted:
        assert b["status"] == "infra_failed" and b["total"] is None and b["drop"], b
        return
    assert not b["drop"] and b["total"] is not None, b
    assert b["end"] == ("infra_failed" if cut is not None else "finish") or b["end"] == "job_limit"
    # the control: the same jobs that ran, each dispatched as it was, then finish (nothing lost)
    control = [[(k, j) for k, j in d if j[0] in ("ok", "failed")] for d in kept if d != "sandbox"]
    c = _play(make_env, runs_dir / "control", [d for d in control if d], limit=4)
    assert b["total"] == pytest.approx(c["total"]) and b["charge"] == pytest.approx(c["charge"])
    assert b["status"] == c["status"]
    lost = [j for j in b["jobs"] if j["status"] == "infra_failed"]
    assert len(b["jobs"]) == len(c["jobs"]) + len(lost) and b["jobs"][b["best_job"]]["status"] != "infra_failed"


@pytest.mark.parametrize("how", ["lost", "raise"])
def test_a_one_job_episode_whose_job_is_lost_is_dropped(make_env, runs_dir, how):
    b = _play(make_env, runs_dir, _numbered([[(how,)]]), limit=1)
    assert b["status"] == "infra_failed" and b["total"] is None and b["drop"] and b["end"] == "infra_failed"


def test_the_agent_reads_that_the_lost_job_does_not_count(make_env, runs_dir):
    """The issue's case: job 1 ran (scored), job 2 was lost on our side; the episode keeps job 1's reward."""
    backend = PlannedStub(compose(backend="stub").backend, runs_dir, plan={1: ("ok", 0.43), 2: ("raise",)})
    env = make_env(family="arithmetic", backend=backend,
                   overrides={"env": {"max_jobs_per_episode": 3, "probe": {"enabled": False}}})
    env.reset(seed=0)
    for k in (1, 2):
        env.step(call("write_file", path="job.toml", content=with_steps(FILES["job.toml"], k)) +
                 call("write_file", path="environment.py", content=FILES["environment.py"]))
        obs, r, term, _, info = env.step(call("submit_job"))
    b = info["reward"]
    assert term and b["status"] == "scored" and not b["drop"] and b["end"] == "infra_failed"
    assert r == b["total"] == pytest.approx(b["jobs"][0]["total"]) and b["charge"] == 0.0
    assert [j["status"] for j in b["jobs"]] == ["scored", "infra_failed"] and "pod lost" in b["reason"]
    assert "the job does not count. This is not counted against you: the episode ends, scored on the jobs " \
           "that ran. Reward " in obs


def test_metrics_count_only_the_jobs_that_ran():
    """``ait/jobs`` and the first-vs-best metrics read the jobs that ran; a lost first job is not 'the first'."""
    from ait_env.observe.metrics import episode_metrics

    lost, a, b = (_breakdown(("infra_failed", 0.0, 0.0, False, 0.0), 0), _breakdown(("scored", 0.4, 0.3, False, 0.0), 1),
                  _breakdown(("scored", 0.6, 0.3, False, 0.0), 2))
    reward = combine([lost, a, b], S, attempts=3, end="infra_failed").model_dump()
    m = episode_metrics(reward, None, "arithmetic", turns=4, total_reward=reward["total"], research=True)
    assert m["ait/jobs"] == 2 and m["ait/later_job_best"] == 1.0 and m["ait/end/infra_failed"] == 1.0
    assert m["ait/post_gain"] == pytest.approx(0.2) and m["ait/best_vs_first"] == pytest.approx(b.total - a.total)
