"""Every module run as ``python -m <module>`` hands over to its canonical import before doing anything.

A module run with ``-m`` is imported as ``__main__``; when the same module is also imported by its name
(an executor importing ``ait_env.runner``), its classes exist twice, and ``except JobFailed`` in the one
copy does not catch the other's (every job failure of the local backend once ended ``infra_failed``).
The rule: the ``__main__`` block imports ``main`` from the module's own dotted name, or from its package's
``cli`` module, where the command line of a package lives (``gpu.worker`` runs ``gpu.cli``). The sandbox's zygote
is exempt: it runs from a copy of its file inside the sandbox and imports nothing of the project.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXEMPT = {"ait_env/sandbox/zygote.py"}


def _main_blocks() -> dict[str, ast.If]:
    out = {}
    for pkg in ("ait_env", "gpu", "task_families"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, ast.If) and "__name__" in ast.unparse(node.test) \
                        and "__main__" in ast.unparse(node.test):
                    out[rel] = node
    return out


def test_entry_points_run_their_canonical_module():
    blocks = _main_blocks()
    assert "ait_env/runner.py" in blocks and "gpu/worker.py" in blocks
    wrong = []
    for rel, node in blocks.items():
        if rel in EXEMPT:
            continue
        dotted = rel[:-3].replace("/", ".")
        imports = [n for n in ast.walk(node) if isinstance(n, ast.ImportFrom)]
        canonical = {dotted, dotted.rsplit(".", 1)[0] + ".cli"}
        if not any(n.module in canonical and any(a.name == "main" for a in n.names) for n in imports):
            wrong.append(f"{rel}: its __main__ block must run `from {dotted} import main` (or its package's cli)")
    assert not wrong, "\n".join(wrong)
