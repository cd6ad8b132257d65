"""Property: no submission, however hostile, ends ``infra_failed`` (an episode the trainers drop, so a
submission that could reach it would void its own bad score) unless our side really failed.

Hypothesis generates hostile but parsable jobs — extreme numbers in every exposed field, integers past
64 bits and other odd TOML values in ``[env]``, environment code that breaks at import, in
``load_environment``, in the rubric or only when the training process loads it (where the probe never
looks), rubrics that return NaN, huge or non-numeric rewards, workers that post garbage to the trainer,
datasets and environments whose values our parsers would choke on (a 5,000-digit number in a question or the
system prompt, a system prompt that is no string, an infinite ``max_turns``, lone surrogates: the guard of
issue 46, item 5, ``ait_env/jobs/guard.py``) —
and submits each through ``gym.make`` with text tool calls, on the ``stub`` backend (validation and
dispatch) and on the ``local`` backend (real training through ``python -m ait_env.runner``, bounded: tiny
jobs on untrained catalog-shaped models, :mod:`tests.fakes.local_models`). Whatever happens, the status is
one the agent earned: ``scored``, ``job_failed``, ``invalid`` or ``unparsable``.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any, Iterator

import gymnasium as gym
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ait_env  # noqa: F401
from task_families import reference_files
from tests.helpers import call
from tests.fakes.local_models import install_untrained_models

pytest.importorskip("verifiers")

EARNED = ("scored", "job_failed", "invalid", "unparsable")
HUGE = "0x" + "f" * 20_000
#: numbers a field can hold in TOML: zero, negatives, 64-bit edges, past them, tiny and huge floats
NUMBERS = st.sampled_from(["0", "-1", "1", "3", "9223372036854775807", "-9223372036854775808", HUGE,
                           "99999999999999999999", "1e308", "-1e308", "5e-324", "-0.0", "0.5", "2.5", "1e-12",
                           "inf", "nan", '"8"', "true", "[]"])
FIELDS = ["max_steps", "seq_len", "batch_size", "group_size", "max_tokens", "temperature", "lr", "weight_decay",
          "warmup_steps", "min_lr", "num_examples", "seed"]
ENV_VALUES = st.sampled_from([HUGE, "-" + HUGE, "1e400", '"' + "x" * 5000 + '"', '"\\u0000"', "[" * 30 + "]" * 30,
                              "1979-05-27", "{ a = { b = 1 } }", '"\U0001F600"', "9223372036854775807"])
#: where the hostile code runs: always, or only in the training process (the rollout worker), which the
#: probe's own load never sees
#: (agent code reaches ``os`` and ``httpx`` through verifiers' own imports, past the static allow-list; the
#: trainer's step channel, ``endpoint.sock``, is in the training process's working folder only)
IN_TRAINING = "_vu.os.path.exists('endpoint.sock')"
POST = "_vu.httpx.Client(transport=_vu.httpx.HTTPTransport(uds='endpoint.sock'), base_url='http://x').post"
ACTIONS = st.sampled_from([
    "raise RuntimeError('boom')",
    "raise SystemExit(3)",
    "raise KeyboardInterrupt",
    "raise MemoryError",
    "import os; os._exit(0)",
    "raise ImportError('No module named x')",
    "__import__('nonexistent_module_xyz')",
    "raise RecursionError('deep')",
    # garbage posted to the trainer's step channel
    POST + "('/ait/results', json={'step': -1, 'rows': 'many'})",
    POST + "('/ait/results', json={'step': 0, 'groups': [[{'reward': 1.0}]]})",
    POST + "('/ait/results', json={'step': 0, 'groups': 'x'})",
    POST + "('/ait/results', json={'step': 1, 'error': {'nested': [1]}})",
])
WHERE = st.sampled_from(["import", "load", "load_in_training", "none"])
#: hostile rewards, returned always (the probe refuses most) or only in training (the probe sees an honest one)
HOSTILE_REWARDS = ["float('nan')", "float('inf')", "1e308", "-1e308 if len(str(completion)) % 2 else 1e308", "'text'",
                   "None", "[1]", "10 ** 400", "(_ for _ in ()).throw(ValueError('x'))"]
HONEST = "correct_answer(completion, answer)"  # the reference rubric's own check
REWARDS = st.builds(lambda r, training: f"({r}) if {IN_TRAINING} else {HONEST}" if training else r,
                    st.sampled_from(HOSTILE_REWARDS), st.booleans())


def _set(job: str, key: str, value: str) -> str:
    return re.sub(rf"(?m)^{key} = .*$", f"{key} = {value}", job)


#: what a job's environment reports to the probe (and shows the model), edited after it loads: values our
#: parsers would choke on (``e`` is the loaded environment)
DATA_EDITS = [
    "_ask(e, ' ' + '9' * 5000 + ' minutes')",
    "_ask(e, ' ' + '7' * 400 + '.5 hours')",
    "_ask(e, '\\ud800')",
    "e.system_prompt = '9' * 5000 + ' minutes. ' + str(e.system_prompt)",
    "e.system_prompt = _deep(950)",
    "e.max_turns = float('inf')",
    "e.max_turns = 10 ** 4000",
]
DATA_WRAPPER = """

_data_load = load_environment


def _deep(n):
    v = []
    for _ in range(n):
        v = [v]
    return v


def _ask(e, tail):
    e.dataset = e.dataset.select(range(64)).map(lambda r: {{"question": r["question"] + tail}})


def load_environment(**kwargs):
    e = _data_load(**kwargs)
    {edit}
    return e
"""


def _hostile_files(family_files: dict[str, str], numbers: dict[str, str], env_extra: str | None, action: str,
                   where: str, reward: str | None, data: str | None = None) -> dict[str, str]:
    files = dict(family_files)
    job = files["job.toml"]
    for key, value in numbers.items():
        job = _set(job, key, value)
    if env_extra is not None:
        job = job.replace("[env]\n", f"[env]\nhostile = {env_extra}\n")
    files["job.toml"] = job
    env = files["environment.py"].replace("from family_tools import TOOLS\n", "from family_tools import TOOLS\n"
                                          "import verifiers.utils.client_utils as _vu\n")
    if where == "import":
        env = env.replace("from family_tools import TOOLS\n", f"from family_tools import TOOLS\n{action}\n")
    elif where in ("load", "load_in_training"):
        cond = IN_TRAINING if where == "load_in_training" else "True"
        env = env.replace("def load_environment(", "def _real_load_environment(") + (
            f"\n\ndef load_environment(**kwargs):\n    if {cond}:\n        {action}\n"
            "    return _real_load_environment(**kwargs)\n")
    if reward is not None:
        env = env.replace("funcs=[correct_answer, calculator_use]", "funcs=[hostile_reward, calculator_use]") + (
            f"\n\ndef hostile_reward(completion, answer, **kwargs):\n    return {reward}\n")
    if data is not None:
        env += DATA_WRAPPER.format(edit=data)
    files["environment.py"] = env
    return files


def _episode(env: gym.Env, files: dict[str, str]) -> tuple[str, dict[str, Any]]:
    env.reset(seed=0)
    env.step("".join(call("write_file", path=k, content=v) for k, v in files.items()))
    obs, reward, terminated, truncated, info = env.step(call("submit_job"))
    assert isinstance(obs, str) and isinstance(reward, float) and math.isfinite(reward)
    return obs, info


def _status(env: gym.Env, obs: str, info: dict[str, Any]) -> str:
    return info["reward"]["status"] if "reward" in info else "pending"


hostile_jobs = st.fixed_dictionaries({
    "numbers": st.dictionaries(st.sampled_from(FIELDS), NUMBERS, max_size=3),
    "env_extra": st.none() | ENV_VALUES,
    "action": ACTIONS, "where": WHERE,
    "reward": st.none() | REWARDS,
    "data": st.none() | st.sampled_from(DATA_EDITS),
})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=hostile_jobs)
def test_stub_no_hostile_submission_is_infra_failed(make_env, case):
    env = make_env(family="arithmetic", overrides={"env": {"max_attempts": 1}})
    obs, info = _episode(env, _hostile_files(reference_files("arithmetic", "Qwen/Qwen3-1.7B"), **case))
    status = _status(env, obs, info)
    assert status in EARNED, (status, info.get("reward", {}).get("reason"), obs[-600:])


@pytest.mark.slow  # 6-18 s a submission (2026-12-05, load 5); the default run covers the same parsers through
# tests/test_hostile_values.py::test_the_probe_reads_any_sandbox_report (calendar's, on a report of the sandbox)
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(family=st.sampled_from(["calendar", "inventory", "units", "persona", "warehouse"]),
       data=st.sampled_from(DATA_EDITS))
def test_stub_no_hostile_dataset_is_infra_failed(make_env, family, data):
    """Each family's own parsers read the dataset's and the prompts' numbers (issue 46: a question with a
    5,000-digit number of minutes raised ``ValueError`` from the calendar family's parser inside submit_job)."""
    env = make_env(family=family, overrides={"env": {"max_attempts": 1}})
    files = reference_files(family, "Qwen/Qwen3-1.7B")
    files["environment.py"] += DATA_WRAPPER.format(edit=data)
    obs, info = _episode(env, files)
    status = _status(env, obs, info)
    assert status in EARNED, (status, info.get("reward", {}).get("reason"), obs[-600:])


# ---------------------------------------------------------------- the local backend: real training, bounded
SMALL = {"max_steps": "2", "batch_size": "8", "group_size": "4", "max_tokens": "8", "warmup_steps": "0",
         "num_examples": "64"}


@pytest.fixture(scope="module")
def local_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[gym.Env]:
    cache = install_untrained_models(tmp_path_factory.mktemp("models"))
    old = os.environ.get("AIT_CACHE_DIR")
    os.environ["AIT_CACHE_DIR"] = str(cache)
    runs = tmp_path_factory.mktemp("runs")
    env = gym.make("AIT/JobWriting-v0", family="arithmetic", backend="local", overrides={
        "env": {"runs_dir": str(runs), "max_attempts": 1},
        "backend": {"options": {"eval_every": 0, "eval_limit": 4, "eval_max_tokens": 8, "step_timeout_s": 60}}})
    yield env
    env.close()
    if old is None:
        os.environ.pop("AIT_CACHE_DIR", None)
    else:
        os.environ["AIT_CACHE_DIR"] = old


local_jobs = st.fixed_dictionaries({
    "numbers": st.just({}), "env_extra": st.none() | st.sampled_from(["9223372036854775807", '"\\u0000"']),
    "action": ACTIONS, "where": st.sampled_from(["load_in_training", "load_in_training", "none"]),
    "reward": st.none() | st.builds(lambda r: f"({r}) if {IN_TRAINING} else {HONEST}", st.sampled_from(HOSTILE_REWARDS)),
})


@pytest.mark.slow  # 146 s of real local jobs (2026-12-02); test_stub_no_hostile_submission_is_infra_failed and
# tests/backends/test_local_job_failures.py cover the same rule in the default run
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=local_jobs)
def test_local_no_hostile_job_is_infra_failed(local_env, case):
    base = reference_files("arithmetic", "ait-tiny-s", backend="local")
    for key, value in SMALL.items():
        base["job.toml"] = _set(base["job.toml"], key, value)
    obs, info = _episode(local_env, _hostile_files(base, **case))
    status = _status(local_env, obs, info)
    assert status in EARNED, (status, info.get("reward", {}).get("reason"), obs[-800:])
