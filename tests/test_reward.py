import math

import pytest

from ait_env.reward import RewardSettings, compose, uplift_score

S = RewardSettings()


@pytest.mark.parametrize("post,pre,expected", [
    (0.3, 0.3, 0.5), (1.0, 0.3, 1.0), (0.0, 0.3, 0.0), (0.65, 0.3, 0.75), (0.15, 0.3, 0.25),
    (0.5, 1.0, 0.0 + 0.25), (1.0, 1.0, 0.5), (0.0, 0.0, 0.5), (0.4, 0.0, 0.7),
])
def test_uplift_mapping(post, pre, expected):
    assert uplift_score(post, pre) == pytest.approx(expected)


def test_scored_formula():
    b = compose("scored", S, attempts=1, validated_attempt=1, post=0.65, best_pre=0.3,
                train_seconds=600, wall_clock_limit_s=3600)
    assert b.V == 1.0 and b.U == pytest.approx(0.75)
    assert b.Q == pytest.approx(0.25 * 0.65 + 0.75 * 0.75)
    assert b.S == pytest.approx(1 - 600 / 3600)
    assert b.total == pytest.approx(0.35 * 1 + 0.6 * b.Q + 0.05 * b.S)
    assert b.uplift == pytest.approx(0.35)


def test_speed_counts_only_for_jobs_that_lift_the_model():
    fast_noop = compose("scored", S, attempts=1, validated_attempt=1, post=0.3, best_pre=0.3,
                        train_seconds=10, wall_clock_limit_s=3600)
    slow_real = compose("scored", S, attempts=1, validated_attempt=1, post=0.3, best_pre=0.3,
                        train_seconds=3000, wall_clock_limit_s=3600)
    assert fast_noop.S == slow_real.S == 0.0 and fast_noop.total == slow_real.total
    lifted = compose("scored", S, attempts=1, validated_attempt=1, post=0.31, best_pre=0.3,
                     train_seconds=3000, wall_clock_limit_s=3600)
    assert lifted.S == pytest.approx(1 - 3000 / 3600) and lifted.total > fast_noop.total


def test_validation_decays_with_attempts():
    vals = [compose("scored", S, attempts=a, validated_attempt=a, post=0.5, best_pre=0.3).V for a in (1, 2, 3)]
    assert vals == [1.0, 0.5, 0.25]


def test_better_jobs_get_more_reward():
    rs = [compose("scored", S, attempts=1, validated_attempt=1, post=p, best_pre=0.3).total
          for p in (0.0, 0.2, 0.3, 0.5, 0.9)]
    assert rs == sorted(rs) and len(set(rs)) == 5


def test_statuses():
    assert compose("unparsable", S, attempts=0).total == pytest.approx(-0.1)
    assert compose("invalid", S, attempts=3).total == 0.0
    jf = compose("job_failed", S, attempts=2, validated_attempt=2)
    assert jf.Q == 0.0 and jf.total == pytest.approx(0.35 * 0.5)
    infra = compose("infra_failed", S, attempts=1, validated_attempt=1)
    assert infra.total is None and infra.drop and infra.gym_reward == 0.0


def test_scored_requires_finite_scores():
    with pytest.raises(ValueError):
        compose("scored", S, attempts=1, validated_attempt=1, post=math.nan, best_pre=0.2)


def test_weights_come_from_config():
    from ait_env.config import compose as compose_settings
    s = compose_settings(family="arithmetic", overrides=["reward.weights.validation=0.5", "reward.validation_decay=0.9"])
    assert s.reward.weights.validation == 0.5
    b = compose("scored", s.reward, attempts=2, validated_attempt=2, post=0.3, best_pre=0.3)
    assert b.V == pytest.approx(0.9)
