import pytest
from hydra import compose as hydra_compose
from hydra import initialize_config_dir

from ait_env.conf import ConfigError, conf_dir
from ait_env.config import compose, settings_from_cfg, split_families
from task_families import FAMILY_NAMES


def test_hydra_and_plain_compose_agree():
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=["family=arithmetic", "env.max_turns=12"])
    via_hydra = settings_from_cfg(cfg)
    plain = compose(family="arithmetic", overrides=["env.max_turns=12"])
    assert via_hydra == plain
    assert plain.env.max_turns == 12 and plain.family.name == "arithmetic"


def test_bad_values_are_clear_errors():
    with pytest.raises(ConfigError, match="max_turns"):
        compose(overrides=["env.max_turns=1"])
    with pytest.raises(ConfigError, match="no reward config named 'nope'"):
        compose(reward="nope")


def test_a_family_marked_sampled_false_is_drawn_by_neither_split(monkeypatch):
    """``sampled: false`` (for a family the local models have not learned yet) keeps it to runs by name."""
    from ait_env import config

    real = config.family_settings
    monkeypatch.setattr(config, "family_settings", lambda n: real(n).model_copy(update={"sampled": n != "units"}))
    train, held = config.split_families(list(FAMILY_NAMES))
    assert "units" not in train + held and held == ["triage"] and len(train) == len(FAMILY_NAMES) - 2


def test_held_out_flag_splits_families(make_env):
    train, held = split_families(list(FAMILY_NAMES))
    assert held == ["triage"] and "triage" not in train
    assert sorted(train + held) == sorted(FAMILY_NAMES) and "warehouse" in train   # the stateful family too
    env = make_env(family="train")
    drawn = {env.reset(seed=s)[1]["family"] for s in range(40)}
    assert drawn == set(train)  # every training family is drawn, the held-out one never


def test_gym_make_kwargs(make_env):
    env = make_env(family="arithmetic", overrides={"env": {"max_attempts": 5}})
    _, info = env.reset(seed=0)
    assert info["attempts_left"] == 5


def test_each_xdist_worker_and_each_session_gets_its_own_training_uid() -> None:
    """The GPU jail kills every process of its uid: workers of one run, and runs side by side, must differ."""
    from tests.helpers import worker_training_uid

    a: dict[str, str] = {}
    base = worker_training_uid(a, pid=1)
    w0 = worker_training_uid({**a, "PYTEST_XDIST_WORKER": "gw0"})
    w1 = worker_training_uid({**a, "PYTEST_XDIST_WORKER": "gw1"})
    assert len({base, w0, w1}) == 3 and w1 - w0 == 100 and w0 - base == 100
    assert worker_training_uid({}, pid=2) != base  # another session (pid) on the same machine
    assert worker_training_uid({"AIT_TRAINING_UID": "62000", "PYTEST_XDIST_WORKER": "gw1"}) == 62200
