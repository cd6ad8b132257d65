"""Hostile submissions for the probe's regression tests: a valid reference job with one hostile change,
submitted through ``gym.make`` with text tool calls only, as an agent would."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from task_families import reference_files
from ait_env.jobs.bundle import JobBundle
from tests.helpers import make_bundle

MODEL = "Qwen/Qwen3-1.7B"
#: where the reference environment builds its dataset: code inserted before it runs in load_environment
LOAD = "    dataset = build_dataset(num_examples, seed)\n"
#: a way to reach `os` that the static import allow-list does not see (the sandbox must hold anyway)
OS = "from verifiers.utils.client_utils import os\n"


def call(name: str, **arguments: Any) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def reference() -> dict[str, str]:
    return reference_files("arithmetic", MODEL)


def with_env(prefix: str = "", before_load: str = "", suffix: str = "",
             replace: tuple[str, str] | None = None) -> dict[str, str]:
    """The reference files with ``prefix`` after the module's ``__future__`` import, ``before_load``
    inside ``load_environment`` before the dataset is built, ``suffix`` at the end."""
    files = reference()
    text = files["environment.py"]
    if replace:
        assert replace[0] in text, replace[0]
        text = text.replace(*replace)
    if prefix:
        head, sep, rest = text.partition("from __future__ import annotations\n")
        text = head + sep + prefix + rest
    if before_load:
        assert LOAD in text
        text = text.replace(LOAD, before_load + LOAD)
    files["environment.py"] = text + suffix
    return files


def with_job(old: str, new: str) -> dict[str, str]:
    files = reference()
    assert old in files["job.toml"], old
    files["job.toml"] = files["job.toml"].replace(old, new)
    return files


def bundle_of(files: dict[str, str], folder: Path) -> JobBundle:
    """Bundle ``files`` (no probe), as the env bundles a validated job."""
    return make_bundle(files, folder)


def submit(env: Any, files: dict[str, str], seed: int = 0) -> tuple[str, dict[str, Any]]:
    """Reset ``env``, write ``files`` and call submit_job; returns (observation, info) of the submit."""
    env.reset(seed=seed)
    writes = "".join(call("write_file", path=k, content=v) for k, v in files.items())
    obs, *_ = env.step(writes)
    assert "error" not in obs.split("</tool_response>")[0][:200], obs
    obs, _, _, _, info = env.step(call("submit_job"))
    return obs, info
