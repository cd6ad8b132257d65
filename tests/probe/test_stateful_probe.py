"""The probe on a stateful family (warehouse): the reference job passes; each stateful mistake an agent
makes is refused with its own code and a fix, found by scripted rollouts that run verifiers' own rollout
code in the sandbox (issue: stateful inner tasks)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("verifiers")

from hostile import MODEL, submit  # noqa: E402
from task_families import reference_files  # noqa: E402

SETUP = '        state["world"] = new_world(state["info"]["world"])\n'
UPDATE = '        return {**tool_args, "world": state["world"]}\n'


def warehouse(replace: list[tuple[str, str]] = (), suffix: str = "") -> dict[str, str]:
    files = reference_files("warehouse", MODEL)
    text = files["environment.py"]
    for old, new in replace:
        assert old in text, old
        text = text.replace(old, new)
    files["environment.py"] = text + suffix
    return files


#: each stateful mistake: (files, the probe's code, words of its message)
MISTAKES = {
    # the world kept in a module global: concurrent rollouts pack into one another's boxes
    "module_global_world": (warehouse([(SETUP, '        global WORLD\n        WORLD = new_world(state["info"]["world"])\n'),
                                       (UPDATE, '        return {**tool_args, "world": WORLD}\n')],
                                      suffix="\nWORLD = None\n"), "world_per_rollout", "shared between rollouts"),
    # one world for the whole environment, built once
    "one_world_for_all": (warehouse([(SETUP, '        state["world"] = self.shared\n'),
                                     ("        super().__init__(tools=[], **kwargs)\n",
                                      "        super().__init__(tools=[], **kwargs)\n"
                                      "        self.shared = new_world(self.dataset[0]['info']['world'])\n")]),
                          "world_per_rollout", "fresh world"),
    # tools acting on a fresh world at every call: the box never holds what was picked before
    "world_not_kept": (warehouse([(UPDATE, '        return {**tool_args, "world": new_world(state["info"]["world"])}\n')]),
                       "world_per_rollout", "tool call"),
    # a rubric that reads the answer text and never the state
    "state_ignored": (warehouse([("    rubric = vf.Rubric(funcs=[packed_and_labelled, lines_packed], weights=[0.9, 0.1])\n",
                                  "    rubric = vf.Rubric(funcs=[label_only], weights=[1.0])\n")],
                                suffix="\n\ndef label_only(completion, answer, **kwargs) -> float:\n"
                                       "    return 1.0 if _label(completion) == answer else 0.0\n"),
                      "state_ignored", "reads the answer text but not the world"),
    # a world keyed by another info layout than the family's: the rollouts cannot start
    "own_info_layout": (warehouse([(SETUP, '        state["world"] = new_world(state["info"]["spec"])\n')]),
                        "stateful_rollout", "setup_state"),
}


def test_the_reference_passes_and_each_stateful_mistake_is_refused_with_a_fix(make_env):
    env = make_env(family="warehouse")   # one env (one sandbox) for every submission
    obs, info = submit(env, reference_files("warehouse", MODEL))
    assert info["reward"]["status"] == "scored", obs
    for name, (files, code, words) in sorted(MISTAKES.items()):
        obs, info = submit(env, files)
        assert f"[{code}]" in obs and words in obs, (name, obs)
        assert "reward" not in info, (name, info)


def test_whatever_the_sandbox_sends_back_the_checks_do_not_raise():
    """The rollout results come from the agent's process: any shape is read as a failure, never an exception,
    and results that name no reply of the probe's model never pass."""
    from ait_env.probe.dynamic import DynamicProbe
    from ait_env.jobs.schema import parse_job
    from task_families import get_family
    from task_families.base import Bounds

    fam = get_family("warehouse")
    task = fam.make_task(0, Bounds(base_models=[MODEL], max_steps=10, max_batch_size=8, max_group_size=4,
                                   max_seq_len=4096, max_tokens=256))
    job, _ = parse_job(reference_files("warehouse", MODEL)["job.toml"])
    from ait_env.probe.scripted_model import ScriptedModel

    probe = DynamicProbe.__new__(DynamicProbe)
    junk = [None, 5, "x", [], [None], [[1, 2]], [[{"error": 7}] * 4] * 3, [[{"response_ids": 5, "reward": "x"}] * 4] * 3,
            [[{"response_ids": ["probe-0"], "reward": float("nan"), "errors": 3}] * 4] * 3]
    for rollouts in junk:
        for model in (None, ScriptedModel(Path("/nonexistent.sock"), DynamicProbe.scripts(task, fam))):
            out = probe._rollout_checks({"rollouts": rollouts, "rubric_errors": rollouts}, model, task, fam,
                                        "environment.py")
            assert out and all(f.code == "stateful_rollout" for f in out), out
