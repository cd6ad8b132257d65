"""Python parses in one process are serialized (task_families.base.AST_LOCK): CPython 3.11's AST constructor
keeps its recursion depth in interpreter-wide state, so two threads parsing at once can fail with
"SystemError: AST constructor recursion depth mismatch" (a fresh-clone CI saw it in the static probe while
another episode's probe decision ran the arithmetic calculator). Every parser of the project takes the one lock."""

from __future__ import annotations

from task_families import get_family
from task_families.base import AST_LOCK


def test_tools_run_under_the_parse_lock(monkeypatch) -> None:
    fam = get_family("arithmetic")
    seen: list[bool] = []

    def calculator(expression: str) -> str:
        seen.append(AST_LOCK.locked())
        return expression

    monkeypatch.setattr(fam.tools_module, "TOOLS", [calculator])
    assert fam.call_tool("calculator", {"expression": "1+2"}) == "1+2" and seen == [True]
    assert not AST_LOCK.locked()


def test_the_static_probe_parses_under_the_same_lock() -> None:
    from ait_env.probe import static

    assert static._PARSE_LOCK is AST_LOCK
