"""The library's modules stay small enough to hold one concern (issue 49): no module of the packages over 500
lines, no class over 300 lines. A file that grows past them is split along its concerns (a package of
one-concern modules, or a class's parts as mixins), not allowed here by a list of exceptions."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ait_env", "fleet", "gpu", "task_families")
MAX_MODULE_LINES = 500
MAX_CLASS_LINES = 300


def library_modules() -> list[Path]:
    """The packages' own Python files (the agent-facing templates and references of the families included)."""
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py") if "__pycache__" not in p.parts)


def test_no_library_module_is_over_500_lines():
    long = {str(p.relative_to(ROOT)): n for p in library_modules()
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"split these along their concerns: {long}"


def test_no_library_class_is_over_300_lines():
    big = {}
    for p in library_modules():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ClassDef) and (n := node.end_lineno - node.lineno + 1) > MAX_CLASS_LINES:
                big[f"{p.relative_to(ROOT)}:{node.name}"] = n
    assert not big, f"split these classes (their parts as mixins or collaborators): {big}"


def test_the_rule_sees_the_library():
    """The rule reads the packages (a path mistake would make it pass on nothing)."""
    mods = library_modules()
    assert len(mods) > 150 and any(p.name == "env.py" for p in mods)
