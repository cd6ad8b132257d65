from pathlib import Path

import pytest

from ait_env.hidden.baselines import BaselineEntry, BaselinesNotSeeded, BaselineStore
from ait_env.hidden.secrets import job_context
from tests.helpers import call


def test_unseeded_store_names_the_seed_command(tmp_path):
    store = BaselineStore("nobackend", user_dir=tmp_path)
    with pytest.raises(BaselinesNotSeeded, match="python scripts/seed_baselines.py backend=nobackend families=arithmetic"):
        store.get("arithmetic", "m")


def test_user_store_overrides_pinned(tmp_path):
    store = BaselineStore("stub", user_dir=tmp_path)
    pinned = store.get("arithmetic", "Qwen/Qwen3-0.6B").score
    store.put([BaselineEntry(backend="stub", family="arithmetic", model="Qwen/Qwen3-0.6B", score=0.5)])
    assert store.get("arithmetic", "Qwen/Qwen3-0.6B").score == 0.5 != pinned


def test_get_baseline_scores_tool_reports_unseeded(make_env):
    env = make_env(family="arithmetic", overrides={"backend": {"models": [{"name": "other/model", "role": "small"}]}})
    env.reset(seed=0)
    obs, *_ = env.step(call("get_baseline_scores"))
    assert "other/model: not measured for this machine's build yet (not seeded" in obs
    assert "seed_baselines.py backend=stub families=arithmetic" in obs and "your job measures it" in obs


def test_get_baseline_scores_tool(make_env):
    env = make_env(family="arithmetic")
    env.reset(seed=0)
    obs, *_ = env.step(call("get_baseline_scores"))
    assert "Qwen/Qwen3-0.6B: 0.116" in obs and "Qwen/Qwen3-1.7B: 0.216" in obs


def test_get_baseline_scores_flags_a_pin_measured_on_other_weights(make_env, tmp_path):
    env = make_env(family="arithmetic")
    inner = env.unwrapped
    inner.backend.baselines.put([BaselineEntry(backend="stub", family="arithmetic", model="Qwen/Qwen3-0.6B",
                                              score=0.2, model_hash="old")])
    inner.backend.built_weights_hash = lambda m: {"Qwen/Qwen3-0.6B": "new"}.get(m, "")
    env.reset(seed=0)
    obs, *_ = env.step(call("get_baseline_scores"))
    # what the reward would not use is not shown: the job measures it
    assert "0.200" not in obs
    assert "Qwen/Qwen3-0.6B: not measured for this machine's build yet (measured on other weights (old, built " \
           "here: new))" in obs
    assert "Qwen/Qwen3-1.7B: 0.216\n" in obs   # no hash recorded: taken as it is, not flagged
    assert "0.216 so far" in obs


def test_entry_knows_when_it_was_measured_on_other_weights():
    e = BaselineEntry(backend="local", family="arithmetic", model="m", score=0.5, model_hash="abc")
    assert not e.measured_on_other_weights("abc")
    assert e.measured_on_other_weights("def")
    assert not e.measured_on_other_weights("")   # weights unknown here: the pin is taken as it is
    legacy = BaselineEntry(backend="local", family="arithmetic", model="m", score=0.5)
    assert not legacy.measured_on_other_weights("def")   # pinned before hashes were recorded


def test_entry_says_why_it_is_stale():
    e = BaselineEntry(backend="local", family="arithmetic", model="m", score=0.5, model_hash="abc", n=300,
                      hidden_set_hash="s1")
    assert e.stale("abc", "s1") == ""
    assert e.stale("def", "s1") == "measured on other weights (abc, built here: def)"
    assert e.stale("abc", "s2") == "measured on another hidden set (s1, now: s2)"
    formula = BaselineEntry(backend="stub", family="arithmetic", model="m", score=0.5, hidden_set_hash="stub-formula")
    assert formula.stale("", "s2") == ""   # n = 0: a formula, not a measurement of any hidden set


def test_store_keeps_one_pin_per_build_and_picks_the_matching_one(tmp_path):
    store = BaselineStore("local-test", user_dir=tmp_path)
    store.put([BaselineEntry(backend="local-test", family="arithmetic", model="m", score=s, model_hash=h,
                             seeded_at=t) for h, s, t in (("a", 0.1, 1.0), ("b", 0.2, 2.0))])
    assert len(store.entries()) == 2
    assert store.get("arithmetic", "m", "a").score == 0.1 and store.get("arithmetic", "m", "b").score == 0.2
    assert store.get("arithmetic", "m").score == 0.2            # weights unknown: the newest
    assert store.get("arithmetic", "m", "c").score == 0.2       # no pin of these weights: the newest (stale)


def test_lookup_says_why_a_pin_does_not_hold(tmp_path):
    from ait_env.hidden.secrets import hidden_set_hash

    store = BaselineStore("local-test", user_dir=tmp_path)
    store.put([BaselineEntry(backend="local-test", family="units", model="m", score=0.4, model_hash="a", n=300,
                             hidden_set_hash=hidden_set_hash("units")),
               BaselineEntry(backend="local-test", family="persona", model="m", score=0.3, model_hash="a", n=300,
                             hidden_set_hash="an-old-set")])
    assert store.lookup("units", "m", "a")[1] == ""
    assert store.lookup("units", "m", "b")[1] == "measured on other weights (a, built here: b)"
    assert store.lookup("persona", "m", "a")[1].startswith("measured on another hidden set (an-old-set, now: ")
    stub = BaselineStore("stub", user_dir=tmp_path)   # formula entries (n = 0) hold for any hidden set
    assert stub.lookup("arithmetic", "Qwen/Qwen3-0.6B")[1] == ""


# ---- the one policy (BaselineStore.for_job): what the runner, get_baseline_scores and the reward read
def _two_pins(tmp_path: Path, hashes: dict[str, str]) -> BaselineStore:
    store = BaselineStore("unit-test-backend", user_dir=tmp_path)
    store.put([BaselineEntry(backend="unit-test-backend", family="arithmetic", model=m, score=s, model_hash=hashes[m])
               for m, s in (("small", 0.1), ("large", 0.4))])
    return store


def test_pins_of_the_built_weights_hold(tmp_path: Path) -> None:
    store = _two_pins(tmp_path, {"small": "aa", "large": "bb"})
    assert store.for_job(job_context("arithmetic", ["small", "large"], {"small": "aa", "large": "bb"})) == (
        {"small": 0.1, "large": 0.4}, {})


def test_pins_of_other_weights_are_missing_with_the_reason(tmp_path: Path) -> None:
    store = _two_pins(tmp_path, {"small": "aa", "large": "bb"})
    holding, missing = store.for_job(job_context("arithmetic", ["small", "large"], {"small": "zz", "large": "cc"}))
    assert holding == {}
    assert missing == {"small": "measured on other weights (aa, built here: zz)",
                       "large": "measured on other weights (bb, built here: cc)"}
    assert store.for_job(job_context("arithmetic", ["small", "large"], {"small": "zz", "large": "bb"}))[0] == {"large": 0.4}


def test_pins_without_a_hash_hold_and_unseeded_models_are_missing(tmp_path: Path) -> None:
    store = _two_pins(tmp_path, {"small": "", "large": "bb"})
    holding, missing = store.for_job(job_context("arithmetic", ["small", "large", "absent"], {"small": "aa"}))
    assert holding == {"small": 0.1, "large": 0.4} and missing == {"absent": "not seeded"}


def test_each_build_takes_its_own_pin_and_a_pin_of_another_hidden_set_is_missing(tmp_path: Path) -> None:
    from ait_env.hidden.secrets import hidden_set_hash

    store = BaselineStore("unit-test-backend", user_dir=tmp_path)
    now = hidden_set_hash("arithmetic")
    store.put([BaselineEntry(backend="unit-test-backend", family="arithmetic", model="large", score=s,
                             model_hash=h, n=300, hidden_set_hash=now) for h, s in (("intel", 0.44), ("amd", 0.43))])
    for built, want in (("intel", 0.44), ("amd", 0.43)):
        assert store.for_job(job_context("arithmetic", ["large"], {"large": built}))[0] == {"large": want}
    # a measurement on another hidden set (another installation's private seeds) sits beside it, never over it
    store.put([BaselineEntry(backend="unit-test-backend", family="arithmetic", model="large", score=0.5,
                             model_hash="amd", n=300, hidden_set_hash="an-old-set")])
    assert store.for_job(job_context("arithmetic", ["large"], {"large": "amd"}))[0] == {"large": 0.43}
    other = BaselineStore("unit-test-backend", user_dir=tmp_path / "other")
    other.put([BaselineEntry(backend="unit-test-backend", family="arithmetic", model="large", score=0.5,
                             model_hash="amd", n=300, hidden_set_hash="an-old-set")])
    holding, missing = other.for_job(job_context("arithmetic", ["large"], {"large": "amd"}))
    assert holding == {} and missing == {"large": f"measured on another hidden set (an-old-set, now: {now})"}


def test_published_and_private_measurements_of_one_build_live_side_by_side(tmp_path: Path, monkeypatch) -> None:
    """Issue 46: a run on the private seeds records its own base scores; the published pins keep holding for
    a run on the published seeds (the main job), and each run reads its own set's."""
    from ait_env.hidden.secrets import PUBLISHED, hidden_set_hash, private_seeds

    private = private_seeds()
    pub_hash, priv_hash = hidden_set_hash("arithmetic", PUBLISHED), hidden_set_hash("arithmetic", private)
    assert pub_hash != priv_hash
    store = BaselineStore("unit-test-backend", user_dir=tmp_path)
    store.put([BaselineEntry(backend="unit-test-backend", family="arithmetic", model="m", score=s, model_hash="w",
                             n=300, hidden_set_hash=h) for h, s in ((pub_hash, 0.4), (priv_hash, 0.3))])
    assert store.for_job(job_context("arithmetic", ["m"], {"m": "w"}))[0] == {"m": 0.4}          # the suite: published
    monkeypatch.setenv("AIT_HIDDEN_SEEDS", "private")
    assert store.for_job(job_context("arithmetic", ["m"], {"m": "w"}))[0] == {"m": 0.3}


def test_a_measured_base_is_recorded_and_then_holds(tmp_path: Path) -> None:
    store = BaselineStore("unit-test-backend", user_dir=tmp_path)
    assert store.for_job(job_context("arithmetic", ["m"], {"m": "h1"})) == ({}, {"m": "not seeded"})
    store.record_measured(BaselineEntry(backend="unit-test-backend", family="arithmetic", model="m", score=0.33,
                                        model_hash="h1"))
    assert store.for_job(job_context("arithmetic", ["m"], {"m": "h1"})) == ({"m": 0.33}, {})
    assert BaselineStore("unit-test-backend").record_measured(
        BaselineEntry(backend="unit-test-backend", family="arithmetic", model="m", score=0.3)) is None
