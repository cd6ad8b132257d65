import math

import pytest

from ait_env.episode.reward import RewardSettings, combine, episode_reward, research_charge, uplift_score

S = RewardSettings()


@pytest.mark.parametrize("post,pre,expected", [
    (0.3, 0.3, 0.5), (1.0, 0.3, 1.0), (0.0, 0.3, 0.0), (0.65, 0.3, 0.75), (0.15, 0.3, 0.25),
    (0.5, 1.0, 0.0 + 0.25), (1.0, 1.0, 0.5), (0.0, 0.0, 0.5), (0.4, 0.0, 0.7),
])
def test_uplift_mapping(post, pre, expected):
    assert uplift_score(post, pre) == pytest.approx(expected)


def test_scored_formula():
    b = episode_reward("scored", S, attempts=1, validated_attempt=1, post=0.65, best_pre=0.3,
                train_seconds=600, wall_clock_limit_s=3600)
    assert b.V == 1.0 and b.U == pytest.approx(0.75)
    assert b.Q == pytest.approx(0.25 * 0.65 + 0.75 * 0.75)
    assert b.S == pytest.approx(1 - 600 / 3600)
    assert b.total == pytest.approx(0.35 * 1 + 0.6 * b.Q + 0.05 * b.S)
    assert b.uplift == pytest.approx(0.35)


def test_speed_counts_only_for_jobs_that_lift_the_model():
    fast_noop = episode_reward("scored", S, attempts=1, validated_attempt=1, post=0.3, best_pre=0.3,
                        train_seconds=10, wall_clock_limit_s=3600)
    slow_real = episode_reward("scored", S, attempts=1, validated_attempt=1, post=0.3, best_pre=0.3,
                        train_seconds=3000, wall_clock_limit_s=3600)
    assert fast_noop.S == slow_real.S == 0.0 and fast_noop.total == slow_real.total
    lifted = episode_reward("scored", S, attempts=1, validated_attempt=1, post=0.31, best_pre=0.3,
                     train_seconds=3000, wall_clock_limit_s=3600)
    assert lifted.S == pytest.approx(1 - 3000 / 3600) and lifted.total > fast_noop.total


def test_validation_decays_with_attempts():
    vals = [episode_reward("scored", S, attempts=a, validated_attempt=a, post=0.5, best_pre=0.3).V for a in (1, 2, 3)]
    assert vals == [1.0, 0.5, 0.25]


def test_better_jobs_get_more_reward():
    rs = [episode_reward("scored", S, attempts=1, validated_attempt=1, post=p, best_pre=0.3).total
          for p in (0.0, 0.2, 0.3, 0.5, 0.9)]
    assert rs == sorted(rs) and len(set(rs)) == 5


def test_statuses():
    assert episode_reward("unparsable", S, attempts=0).total == pytest.approx(-0.1)
    assert episode_reward("invalid", S, attempts=3).total == 0.0
    jf = episode_reward("job_failed", S, attempts=2, validated_attempt=2)
    assert jf.Q == 0.0 and jf.total == pytest.approx(0.35 * 0.5)
    infra = episode_reward("infra_failed", S, attempts=1, validated_attempt=1)
    assert infra.total is None and infra.drop and infra.gym_reward == 0.0


def test_scored_requires_finite_scores():
    with pytest.raises(ValueError):
        episode_reward("scored", S, attempts=1, validated_attempt=1, post=math.nan, best_pre=0.2)


def test_weights_come_from_config():
    from ait_env.config import compose as compose_settings
    s = compose_settings(family="arithmetic", overrides=["reward.weights.validation=0.5", "reward.validation_decay=0.9"])
    assert s.reward.weights.validation == 0.5
    b = episode_reward("scored", s.reward, attempts=2, validated_attempt=2, post=0.3, best_pre=0.3)
    assert b.V == pytest.approx(0.9)


def _job(post: float, attempts: int = 1, cost: float = 0.0, status: str = "scored", job_id: str = "j"):
    if status != "scored":
        return episode_reward(status, S, attempts=attempts, validated_attempt=attempts, best_pre=0.3,  # type: ignore[arg-type]
                       reason="boom").model_copy(update={"job_id": job_id, "cost_usd": cost})
    return episode_reward("scored", S, attempts=attempts, validated_attempt=attempts, post=post, best_pre=0.3,
                   train_seconds=600, wall_clock_limit_s=3600).model_copy(update={"job_id": job_id, "cost_usd": cost})


def test_combine_one_job_is_the_single_job_reward():
    """A research episode that ran one job gets exactly the single-job reward: no charge."""
    one = _job(0.5, cost=3.0)
    b = combine([one], S, attempts=1, end="finish")
    assert b.total == one.total and b.charge == 0.0 and b.best_job == 0 and b.jobs == [one]
    assert (b.V, b.Q, b.S, b.post, b.uplift) == (one.V, one.Q, one.S, one.post, one.uplift)


def test_combine_keeps_the_best_job_and_charges_the_research():
    """R = max_k R_k - (per_extra_job·(n-1) + per_usd·USD of jobs 2..n); the first job's USD is free."""
    jobs = [_job(0.4, cost=1.0, job_id="a"), _job(0.6, attempts=2, cost=0.5, job_id="b"),
            _job(0.5, cost=0.25, job_id="c")]
    b = combine(jobs, S, attempts=5, end="job_limit")
    best = max(jobs, key=lambda j: j.total)
    charge = S.research.per_extra_job * 2 + S.research.per_usd * 0.75
    assert b.best_job == jobs.index(best) and b.job_id == best.job_id
    assert b.charge == pytest.approx(charge) == pytest.approx(research_charge(jobs, S))
    assert b.total == pytest.approx(best.total - charge)
    assert b.attempts == 5 and b.validated_attempt == best.validated_attempt and b.end == "job_limit"
    assert b.cost_usd == pytest.approx(1.75) and b.status == "scored"
    # the per-job V counts the attempts of that job: job b validated on its 2nd attempt
    assert jobs[1].V == S.validation_decay
    # ties go to the earlier job
    assert combine([_job(0.5, job_id="x"), _job(0.5, job_id="y")], S, attempts=2, end="finish").job_id == "x"


def test_combine_statuses_and_infra_failure():
    failed, scored = _job(0.0, status="job_failed"), _job(0.5)
    assert combine([failed], S, attempts=1, end="job_limit").status == "job_failed"
    b = combine([failed, scored], S, attempts=2, end="job_limit")
    assert b.status == "scored" and b.best_job == 1
    assert b.total == pytest.approx(scored.total - S.research.per_extra_job)
    # no voiding (issue 46): a job lost on our side is dropped alone; the job that ran keeps its score
    infra = episode_reward("infra_failed", S, attempts=1, validated_attempt=1, reason="pod lost")
    d = combine([scored, infra], S, attempts=2, end="infra_failed")
    assert d.status == "scored" and d.total == scored.total and not d.drop and d.end == "infra_failed"
    assert d.best_job == 0 and d.charge == 0.0 and len(d.jobs) == 2
    # an episode in which no job ran is dropped: missing is not zero
    e = combine([infra], S, attempts=1, end="infra_failed")
    assert e.status == "infra_failed" and e.total is None and e.drop and e.reason == "pod lost"
    with pytest.raises(ValueError, match="at least one job"):
        combine([], S, attempts=0, end="finish")


def test_research_charge_comes_from_config():
    from ait_env.conf import load_group

    s = RewardSettings.model_validate(load_group("reward", "default"))
    assert s.research == RewardSettings().research  # the yaml and the code defaults agree
    cheap = RewardSettings(research={"per_extra_job": 0.0, "per_usd": 0.0})
    assert combine([_job(0.4), _job(0.6)], cheap, attempts=2, end="finish").charge == 0.0


def test_a_job_failed_for_a_forfeiting_fault_scores_as_a_refused_submission():
    """A job that trained on the hidden set (or swapped the family's tools) hid it from the probe: it must
    not earn the validation share a merely broken job keeps."""
    from ait_env.episode.reward import FORFEITING_FAULTS, RewardSettings, episode_reward

    s = RewardSettings()
    broken = episode_reward("job_failed", s, attempts=1, validated_attempt=1)
    assert broken.total == s.weights.validation
    for fault in sorted(FORFEITING_FAULTS):
        leak = episode_reward("job_failed", s, attempts=1, validated_attempt=1, fault=fault, reason="x")
        assert leak.total == 0.0 and leak.V == 0.0 and leak.status == "job_failed"
    assert episode_reward("job_failed", s, attempts=1, validated_attempt=1, fault="other").total == broken.total
