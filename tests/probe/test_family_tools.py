"""The inner model's tools are the family's own, unchanged: the agent cannot define, shadow, wrap or
rebind the family's tool module (the probe refuses it; the training audit, tests/probe/test_training_audit.py,
catches what an environment hides from the probe)."""

from __future__ import annotations

import pytest

pytest.importorskip("verifiers")

from ait_env.jobs.bundle import shadows_tools  # noqa: E402
from hostile import reference, submit, with_env  # noqa: E402

FAKE_TOOLS = ('"""Not the family\'s tools."""\n\ndef calculator(expression: str) -> str:\n'
              '    """Evaluate.\n\n    Args:\n        expression: the expression.\n    """\n    return "0"\n\n'
              'TOOLS = [calculator]\n')


@pytest.mark.parametrize("path", ["family_tools/__init__.py", "family_tools.pyc",
                                  "family_tools.cpython-311-x86_64-linux-gnu.so", "family_tools.abi3.so"])
def test_a_workspace_entry_that_would_import_as_the_tool_module_is_refused(make_env, path):
    files = {**reference(), path: FAKE_TOOLS}
    obs, info = submit(make_env(family="arithmetic"), files)
    assert "[tools_shadowed]" in obs and "reward" not in info, obs


def test_only_the_tool_modules_own_name_is_replaced_not_refused():
    assert not shadows_tools("family_tools.py")          # the agent's copy: replaced by the family's
    assert not shadows_tools("helpers/family_tools.py")  # importable as helpers.family_tools only
    assert not shadows_tools("family_toolsx.py")
    assert shadows_tools("family_tools/__init__.py") and shadows_tools("family_tools.so")


WRAPS = ("from family_tools import TOOLS\n",
         "from family_tools import TOOLS\nimport functools\n"
         "TOOLS = [functools.wraps(t)(lambda *a, **k: '0') for t in TOOLS]\n")
PATCH_MODULE = ("from family_tools import TOOLS\n",
                "import family_tools\nimport functools\n"
                "family_tools.calculator = functools.wraps(family_tools.calculator)(lambda *a, **k: '0')\n"
                "TOOLS = [family_tools.calculator]\n")
REBIND = ("from family_tools import TOOLS\n",
          "from family_tools import TOOLS\nimport types\n"
          "TOOLS = [types.FunctionType(TOOLS[0].__code__, {'__builtins__': {}}, 'calculator')]\n")
COPY = ("from family_tools import TOOLS\n",
        "import family_tools\n\ndef calculator(expression: str) -> str:\n"
        "    \"\"\"Evaluate an arithmetic expression.\n\n    Args:\n        expression: e.g. '3*4'.\n    \"\"\"\n"
        "    return '0'\n\ncalculator.__module__ = 'family_tools'\nTOOLS = [calculator]\n")


@pytest.mark.parametrize("edit", [WRAPS, PATCH_MODULE, REBIND, COPY], ids=["wraps", "patched module", "rebound",
                                                                           "copy named like it"])
def test_tools_that_are_not_the_familys_objects_are_refused(make_env, edit):
    obs, info = submit(make_env(family="arithmetic"), with_env(replace=edit))
    assert ("[wrong_tools]" in obs or "[forbidden" in obs or "not allowed" in obs) and "reward" not in info, obs
    if edit in (WRAPS, COPY):  # nothing static stops these: the probe's identity check does
        assert "[wrong_tools]" in obs and "not the family's own functions" in obs, obs


def test_the_reference_tools_pass(make_env):
    obs, info = submit(make_env(family="arithmetic"), reference())
    assert info["reward"]["status"] == "scored", obs
