"""Parallel experiments in research episodes (``submit_jobs``): several jobs in one call, one per workspace
folder, each validated on its own (a refused one does not stop the others and its attempt counts), run at once
(``Backend.run_batch``), reported together; the reward keeps its shape (best job less the charge) and a job
served from the cache is not charged. The default episode has no ``submit_jobs``."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ait_env.agents.reference import lr_sweep, with_steps
from ait_env.backends.stub import StubBackend
from ait_env.config import compose
from ait_env.episode.reward import RewardSettings
from ait_env.episode.tools import TOOL_NAMES
from task_families import reference_files
from tests.helpers import call

MODEL = "Qwen/Qwen3-1.7B"
FILES = reference_files("arithmetic", MODEL)
S = RewardSettings()
NO_PROBE = {"probe": {"enabled": False}}


class SlowStub(StubBackend):
    """The stub, each job taking ``seconds`` of wall time; records how many ran at the same time."""

    def __init__(self, *args: Any, seconds: float = 0.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seconds, self.running, self.peak = seconds, 0, 0
        self._lock = threading.Lock()

    def run(self, bundle: Any, timeout: float | None = None) -> Any:
        with self._lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
        try:
            time.sleep(self.seconds)
            result = super().run(bundle, timeout)
            return result.model_copy(update={"wall_seconds": self.seconds})
        finally:
            with self._lock:
                self.running -= 1


def _env(make_env: Any, runs_dir: Path, jobs: int = 3, seconds: float = 0.0, cache: bool = False,
         env: dict[str, Any] | None = None) -> Any:
    settings = compose(backend="stub").backend.model_copy(update={"job_cache": cache})
    backend = SlowStub(settings, runs_dir, seconds=seconds)
    return make_env(family="arithmetic", backend=backend,
                    overrides={"env": {"max_jobs_per_episode": jobs, **NO_PROBE, **(env or {})}})


def _write_folders(files: dict[str, str]) -> str:
    return "".join(call("write_file", path=k, content=v) for k, v in files.items())


def _folder(name: str, job_toml: str) -> dict[str, str]:
    return {f"{name}/job.toml": job_toml, f"{name}/environment.py": FILES["environment.py"]}


BAD = FILES["job.toml"].replace("batch_size = 128", "batch_size = 100")  # not divisible by the group size


def test_a_default_episode_has_no_submit_jobs(make_env):
    env = make_env(family="arithmetic", overrides={"env": NO_PROBE})
    obs, info = env.reset(seed=0)
    assert [t["function"]["name"] for t in info["tools"]] == list(TOOL_NAMES) and "submit_jobs" not in obs
    obs, *_ = env.step(call("submit_jobs", folders=["a"]))
    assert "unknown tool 'submit_jobs'" in obs


def test_a_batch_validates_each_job_alone_and_runs_the_valid_ones(make_env, runs_dir):
    env = _env(make_env, runs_dir, jobs=4)
    obs, info = env.reset(seed=0)
    schema = next(t for t in info["tools"] if t["function"]["name"] == "submit_jobs")["function"]
    assert schema["parameters"]["properties"]["folders"]["type"] == "array" and "submit_jobs" in obs
    env.step(_write_folders({**_folder("a", with_steps(FILES["job.toml"], 5)), **_folder("b", BAD),
                             **_folder("c", FILES["job.toml"])}))
    obs, r, term, _, info = env.step(call("submit_jobs", folders=["a", "b", "c"]))
    assert not term and r == 0.0 and len(info["jobs"]) == 2
    assert "Ran 2 jobs at once" in obs and "Folder b: refused, not run." in obs
    assert "Job 1 of 4 from a (" in obs and "Job 2 of 4 from c (" in obs and "Jobs left: 2 of 4" in obs
    assert obs.index("Job 1 of 4 from a") < obs.index("Folder b") < obs.index("Job 2 of 4 from c")
    assert info["attempts_left"] == 2   # b's refusal counts: its next submission is its second attempt
    a, c = env.unwrapped._jobs._job_scores
    assert a.validated_attempt == c.validated_attempt == 1 and a.batch == c.batch == 0
    env.step(call("write_file", path="b/job.toml", content=with_steps(FILES["job.toml"], 15)))
    obs, r, term, _, info = env.step(call("submit_jobs", folders=["b"]))
    b = env.unwrapped._jobs._job_scores[2]
    assert b.validated_attempt == 2 and b.V == pytest.approx(S.validation_decay) and b.batch == 1
    obs, r, term, _, info = env.step(call("finish"))
    rb = info["reward"]
    assert term and rb["end"] == "finish" and len(rb["jobs"]) == 3 and rb["attempts"] == 4
    best = max(j["total"] for j in rb["jobs"])
    assert rb["charge"] == pytest.approx(2 * S.research.per_extra_job)
    assert r == rb["total"] == pytest.approx(best - 2 * S.research.per_extra_job)


def test_a_batch_runs_at_once_in_the_time_of_its_longest_job(make_env, runs_dir):
    env = _env(make_env, runs_dir, jobs=3, seconds=1.0)
    env.reset(seed=0)
    env.step(_write_folders(lr_sweep(FILES)))
    t0 = time.time()
    obs, r, term, _, info = env.step(call("submit_jobs", folders=["lr_0", "lr_1", "lr_2"]))
    wall = time.time() - t0
    backend = env.unwrapped.backend
    assert backend.peak == 3 and wall < 2.0, (backend.peak, wall)   # one after another: 3 s or more
    assert term and info["reward"]["end"] == "job_limit" and "Ran 3 jobs at once in" in obs
    assert "one after another they would have taken about 3.0 s" in obs
    b = info["reward"]
    totals = [j["total"] for j in b["jobs"]]
    assert r == b["total"] == pytest.approx(max(totals) - 2 * S.research.per_extra_job)
    assert b["best_job"] == totals.index(max(totals)) and len({j["batch"] for j in b["jobs"]}) == 1


def test_a_job_served_from_the_cache_is_not_charged(make_env, runs_dir):
    env = _env(make_env, runs_dir, jobs=3, cache=True)
    env.reset(seed=0)
    env.step(_write_folders({"job.toml": FILES["job.toml"], "environment.py": FILES["environment.py"]}))
    _, _, _, _, info = env.step(call("submit_job"))
    obs, r, term, _, info = env.step(call("submit_job"))      # the identical job again: served, free
    assert "served from the cache" in obs and info["jobs"][1]["cache_hit"]
    obs, r, term, _, info = env.step(call("finish"))
    b = info["reward"]
    assert b["charge"] == 0.0 and r == b["total"] == b["jobs"][0]["total"] and b["jobs"][1]["cache_hit"]


def test_identical_jobs_in_one_batch_train_once_and_the_copy_is_free(make_env, runs_dir):
    env = _env(make_env, runs_dir, jobs=3, cache=True)
    env.reset(seed=0)
    env.step(_write_folders({**_folder("x", FILES["job.toml"]), **_folder("y", FILES["job.toml"]),
                             **_folder("z", with_steps(FILES["job.toml"], 5))}))
    obs, r, term, _, info = env.step(call("submit_jobs", folders=["x", "y", "z"]))
    b = info["reward"]
    assert term and sum(j["cache_hit"] for j in b["jobs"]) == 1
    assert b["charge"] == pytest.approx(S.research.per_extra_job)   # only z is charged


@pytest.mark.parametrize("folders,message", [
    (["nope"], "'nope' is not a folder of the workspace"),
    (["a", "a"], "folder 'a' is named twice"),
    ([], "folders is empty"),
    (["a", "b", "c", "d"], "you named 4 folders but have 3 jobs left"),
    (["../x"], "error: folder '../x'"),
    ("a", "bad arguments for submit_jobs"),
    ([1, 2], "bad arguments for submit_jobs"),
])
def test_a_malformed_batch_is_refused_whole_and_counts_no_attempt(make_env, runs_dir, folders, message):
    env = _env(make_env, runs_dir, jobs=3)
    env.reset(seed=0)
    env.step(_write_folders({**_folder("a", FILES["job.toml"]), **_folder("b", FILES["job.toml"]),
                             **_folder("c", FILES["job.toml"]), **_folder("d", FILES["job.toml"])}))
    obs, r, term, _, info = env.step(call("submit_jobs", folders=folders))
    assert message in obs and not term and info["attempts_left"] == 3 and "jobs" not in info


def test_a_batch_of_refused_jobs_spends_one_attempt_each(make_env, runs_dir):
    env = _env(make_env, runs_dir, jobs=3, env={"max_attempts": 2})
    env.reset(seed=0)
    env.step(_write_folders({**_folder("a", BAD), **_folder("b", BAD)}))
    obs, r, term, _, info = env.step(call("submit_jobs", folders=["a", "b"]))
    assert term and info["reward"]["end"] == "attempts" and info["reward"]["status"] == "invalid"
    assert "Folder a: refused" in obs and "Folder b: refused" in obs and "No attempts left" in obs


def test_folders_given_as_json_text_are_read_as_a_list(make_env, runs_dir):
    env = _env(make_env, runs_dir, jobs=2)
    env.reset(seed=0)
    env.step(_write_folders({**_folder("a", FILES["job.toml"])}))
    obs, *_ , info = env.step(call("submit_jobs", folders=json.dumps(["a"])))
    assert len(info["jobs"]) == 1 and "Job 1 of 2 from a" in obs
