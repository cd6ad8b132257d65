"""The job result cache: identical jobs share a key whatever their ids, anything that changes the result
changes the key, a hit is served free, identical jobs running at once train once, and only results that
say something about the job are kept."""

from __future__ import annotations

import threading
import time
from typing import Any

from task_families import reference_files
from ait_env.backends import make_backend
from ait_env.backends.base import JobHandle
from ait_env.jobs.result import JobResult
from ait_env.backends.stub import StubBackend
from ait_env.config import compose
from ait_env.jobs.cache import JobCache, job_key
from tests.helpers import make_bundle

MODEL = "Qwen/Qwen3-1.7B"


def _bundle(tmp_path, name: str, edit: Any = None) -> Any:
    files = reference_files("arithmetic", MODEL)
    if edit:
        files = edit(files)
    (tmp_path / name).mkdir()
    return make_bundle(files, tmp_path / name)


def test_the_key_is_the_content_not_the_ids(tmp_path):
    a, b = _bundle(tmp_path, "a"), _bundle(tmp_path, "b")
    assert a.job_id != b.job_id and a.manifest.env_id != b.manifest.env_id
    settings = {"name": "stub", "options": {"seed": 0}}
    assert job_key(a, settings, "w", "h") == job_key(b, settings, "w", "h")
    changed = _bundle(tmp_path, "c", lambda f: {**f, "job.toml": f["job.toml"].replace("max_steps = 60",
                                                                                       "max_steps = 61")})
    env_edit = _bundle(tmp_path, "d", lambda f: {**f, "environment.py": f["environment.py"] + "\n# a comment\n"})
    keys = {job_key(a, settings, "w", "h"), job_key(changed, settings, "w", "h"),
            job_key(env_edit, settings, "w", "h"), job_key(a, {"name": "stub", "options": {"seed": 1}}, "w", "h"),
            job_key(a, settings, "other-weights", "h"), job_key(a, settings, "w", "other-hidden-set")}
    assert len(keys) == 6


def test_a_hit_is_served_free_and_marked(tmp_path):
    backend = make_backend(compose(backend="stub", overrides={"backend": {"job_cache": True,
                                                                          "cost_usd_per_job": 0.5}}).backend, tmp_path)
    first = backend.run(_bundle(tmp_path, "a"))
    second_bundle = _bundle(tmp_path, "b")
    second = backend.run(second_bundle)
    assert not first.cache_hit and first.cost_usd == 0.5
    assert second.cache_hit and second.cost_usd == 0.0 and second.cached_from == first.job_id
    assert second.job_id == second_bundle.job_id and second.post_score == first.post_score
    assert backend.job_cache is not None and backend.job_cache.stats == {"hits": 1, "misses": 1, "hit_rate": 0.5}
    # a new backend on the same runs folder (a rerun) finds it too
    again = make_backend(backend.settings, tmp_path)
    assert again.run(_bundle(tmp_path, "c")).cache_hit


class SlowStub(StubBackend):
    submitted: list[str] = []

    def submit(self, bundle: Any) -> JobHandle:
        SlowStub.submitted.append(bundle.job_id)
        return super().submit(bundle)

    def wait(self, handle: JobHandle, timeout: float | None = None) -> JobResult:
        time.sleep(0.5)
        return super().wait(handle, timeout)


def test_identical_jobs_running_at_once_train_once(tmp_path):
    settings = compose(backend="stub", overrides={"backend": {"job_cache": True}}).backend
    backend = SlowStub(settings, tmp_path)
    bundles = [_bundle(tmp_path, f"b{i}") for i in range(3)]
    results: list[JobResult] = []
    threads = [threading.Thread(target=lambda b=b: results.append(backend.run(b))) for b in bundles]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(SlowStub.submitted) == 1
    assert sorted(r.cache_hit for r in results) == [False, True, True]
    assert len({r.post_score for r in results}) == 1


def test_only_results_about_the_job_are_kept(tmp_path):
    cache = JobCache(tmp_path / "c.sqlite")
    assert not cache.put("k1", {"status": "infra_failed", "job_id": "x"})
    assert cache.put("k2", {"status": "job_failed", "job_id": "y"})
    assert cache.get("k1") is None and cache.get("k2") == {"status": "job_failed", "job_id": "y"}
    calls: list[int] = []

    def flaky() -> dict[str, Any]:
        calls.append(1)
        return {"status": "infra_failed" if len(calls) == 1 else "succeeded", "job_id": str(len(calls))}

    assert cache.get_or_run("k3", flaky) == ({"status": "infra_failed", "job_id": "1"}, False)
    assert cache.get_or_run("k3", flaky) == ({"status": "succeeded", "job_id": "2"}, False)  # retried, not served
    assert cache.get_or_run("k3", flaky) == ({"status": "succeeded", "job_id": "2"}, True)


def _files_bundle(tmp_path, name: str, extra: dict[str, str]) -> Any:
    files = {**reference_files("arithmetic", MODEL), **extra}
    (tmp_path / name).mkdir()
    return make_bundle(files, tmp_path / name)


def test_file_boundaries_are_part_of_the_key(tmp_path):
    """Two jobs whose bytes join up to the same stream but are cut into files differently run different
    code: a one-file job must not get a two-file job's result (the key once hashed path + bytes with no
    lengths)."""
    env = reference_files("arithmetic", MODEL)["environment.py"]
    helper = "HIDDEN = 1\n"
    two = _files_bundle(tmp_path, "two", {"environment_x.py": helper})
    one = _files_bundle(tmp_path, "one", {"environment.py": env + "\nenvironment_x.py\n" + helper})
    settings = {"name": "stub", "options": {}}
    assert job_key(one, settings, "w", "h") != job_key(two, settings, "w", "h")


def test_an_empty_folder_changes_the_key(tmp_path):
    """An empty folder in the package is an importable namespace package: it can change what runs."""
    a = _files_bundle(tmp_path, "a", {})
    b = _files_bundle(tmp_path, "b", {})
    (b.package_dir / "helpers").mkdir()
    settings = {"name": "stub", "options": {}}
    assert job_key(a, settings, "w", "h") != job_key(b, settings, "w", "h")


def test_distinct_trees_get_distinct_keys(tmp_path):
    """Collisions by construction: every way of cutting one byte stream into files and names is a
    different key (all splits of a short stream into 1-3 files)."""
    from itertools import combinations

    stream = "ab\ncd\nef"
    settings = {"name": "stub", "options": {}}
    base = _files_bundle(tmp_path, "base", {})
    keys: dict[str, tuple[int, ...]] = {}
    for n_cuts in range(3):
        for cuts in combinations(range(1, len(stream)), n_cuts):
            parts = [stream[i:j] for i, j in zip((0, *cuts), (*cuts, len(stream)))]
            for extra in base.package_dir.glob("extra_*.py"):
                extra.unlink()
            for k, part in enumerate(parts):
                (base.package_dir / f"extra_{k}.py").write_text(part)
            key = job_key(base, settings, "w", "h")
            assert key not in keys, (cuts, keys.get(key))
            keys[key] = cuts
    assert len(keys) == 1 + 7 + 21
