"""The runner's choice of pinned baselines: a pin measured on other weights is not trusted for the job's model."""

from __future__ import annotations

from pathlib import Path

from ait_env.baselines import BaselineEntry, BaselineStore
from ait_env.runner import pinned_baselines


def _store(tmp_path: Path, hashes: dict[str, str]) -> BaselineStore:
    store = BaselineStore("unit-test-backend", user_dir=tmp_path)
    store.put([BaselineEntry(backend="unit-test-backend", family="arithmetic", model=m, score=s, model_hash=hashes[m])
               for m, s in (("small", 0.1), ("large", 0.4))])
    return store


def test_pins_of_the_built_weights_are_used(tmp_path: Path) -> None:
    lines: list[str] = []
    store = _store(tmp_path, {"small": "aa", "large": "bb"})
    got = pinned_baselines(store, "arithmetic", ["small", "large"], {"small": "aa", "large": "bb"},
                           lines.append)
    assert got == {"small": 0.1, "large": 0.4} and lines == []


def test_stale_pins_are_left_out_and_logged(tmp_path: Path) -> None:
    lines: list[str] = []
    store = _store(tmp_path, {"small": "aa", "large": "bb"})
    got = pinned_baselines(store, "arithmetic", ["small", "large"], {"small": "zz", "large": "cc"},
                           lines.append)
    # every stale pin is measured instead (the job's model and the other one), each flagged with the fix
    assert got == {}
    assert any("large was measured on other weights (bb, built here: cc); measuring it" in x for x in lines)
    assert any("small was measured on other weights (aa, built here: zz); measuring it" in x
               and "seed_baselines.py backend=local pin=true" in x for x in lines)
    only_other = pinned_baselines(store, "arithmetic", ["small", "large"], {"small": "zz", "large": "bb"},
                                  lambda _: None)
    assert only_other == {"large": 0.4}


def test_pins_without_a_hash_and_unbuilt_models_are_trusted(tmp_path: Path) -> None:
    lines: list[str] = []
    store = _store(tmp_path, {"small": "", "large": "bb"})
    got = pinned_baselines(store, "arithmetic", ["small", "large", "absent"], {"small": "aa"}, lines.append)
    assert got == {"small": 0.1, "large": 0.4} and lines == []


def test_each_build_takes_its_own_pin_and_a_pin_of_another_hidden_set_is_measured(tmp_path: Path) -> None:
    from ait_env.secrets import hidden_set_hash

    store = BaselineStore("unit-test-backend", user_dir=tmp_path)
    now = hidden_set_hash("arithmetic")
    store.put([BaselineEntry(backend="unit-test-backend", family="arithmetic", model="large", score=s,
                             model_hash=h, n=300, hidden_set_hash=now) for h, s in (("intel", 0.44), ("amd", 0.43))])
    for built, want in (("intel", 0.44), ("amd", 0.43)):
        assert pinned_baselines(store, "arithmetic", ["large"], {"large": built}, lambda _: None) == {"large": want}
    store.put([BaselineEntry(backend="unit-test-backend", family="arithmetic", model="large", score=0.5,
                             model_hash="amd", n=300, hidden_set_hash="an-old-set")])
    lines: list[str] = []
    assert pinned_baselines(store, "arithmetic", ["large"], {"large": "amd"}, lines.append) == {}
    assert any(f"measured on another hidden set (an-old-set, now: {now}); measuring it" in x for x in lines)
