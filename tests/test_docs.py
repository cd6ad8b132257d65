"""The documentation points at things that exist: every relative link in README.md, docs/*.md and
research/README.md resolves (anchors included), and every repository path named in backticks
(`ait_env/runner.py`, `tests/golden/rl_toml/`) is in the checkout."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "research" / "README.md"]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
TICKED = re.compile(r"`([^`\n]+)`")
PATHLIKE = re.compile(r"^[A-Za-z0-9_.\-]+(/[A-Za-z0-9_.\-]+)+/?$")
#: paths a run creates or that live outside the checkout
GENERATED = ("runs/", "outputs/", "weights/", ".venv", ".whl")


def anchors(md: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    heads = re.findall(r"^#+ (.*)$", md.read_text(encoding="utf-8"), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc: Path) -> None:
    broken = []
    for target in LINK.findall(doc.read_text(encoding="utf-8")):
        if re.match(r"^[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists() or anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(target)
    assert not broken, f"{doc.relative_to(ROOT)}: broken links {broken}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_named_repository_paths_exist(doc: Path) -> None:
    top = {p.name for p in ROOT.iterdir()}
    missing = []
    for ticked in TICKED.findall(doc.read_text(encoding="utf-8")):
        for word in ticked.split():
            word = word.strip(",;:()")
            if not PATHLIKE.match(word) or word.startswith(GENERATED) or word.split("/")[0] not in top:
                continue
            if not (ROOT / word).exists():
                missing.append(word)
    assert not missing, f"{doc.relative_to(ROOT)}: names paths that do not exist: {missing}"


# ------------------------------------------------------------------ the documented commands run as written
#: every document whose commands a reader runs (the README, docs/, the READMEs of gpu/ and research/)
COMMAND_DOCS = [*DOCS, ROOT / "gpu" / "README.md"]
#: ``python -m pkg.mod`` or ``python path/to/script.py``, with its interpreter as the docs write it
#: (``python`` of the activated venv, or ``.venv/bin/python`` / ``.venv-trl/bin/python``), env prefixes dropped
COMMAND = re.compile(r"(?<![\w/.-])((?:\.venv(?:-trl)?/bin/)?python3?)\s+(-m\s+[A-Za-z_][\w.]*[A-Za-z_](?![.\w])|[\w./-]+\.py\b)")
#: what an entry point's --help prints: argparse's usage line or Hydra's help
HELP = re.compile(r"usage:|powered by Hydra", re.IGNORECASE)


def documented_commands() -> dict[str, list[str]]:
    """``interpreter entry`` -> the documents that name it (whitespace inside a command normalised: an
    inline code span may wrap)."""
    found: dict[str, list[str]] = {}
    for doc in COMMAND_DOCS:
        text = re.sub(r"\s+", " ", doc.read_text(encoding="utf-8"))
        for python, entry in COMMAND.findall(text):
            key = f"{python} {' '.join(entry.split())}"
            found.setdefault(key, []).append(str(doc.relative_to(ROOT)))
    return found


COMMANDS = documented_commands()


def activated_env() -> dict[str, str]:
    """The environment `source .venv/bin/activate` gives: the venv's bin first on PATH, VIRTUAL_ENV set
    (the venv is the one running the tests)."""
    import os
    import sys

    bin_dir = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(bin_dir.parent),
               PYTHONDONTWRITEBYTECODE="1")
    return env


def test_commands_are_found_and_the_readme_says_how_to_activate_first() -> None:
    assert len(COMMANDS) >= 25 and "python trainers/tinker_grpo.py" in COMMANDS, sorted(COMMANDS)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    activate = readme.find("source .venv/bin/activate")
    first_bare = min(m.start() for m in re.finditer(r"`python -m |^python ", readme, re.MULTILINE))
    assert 0 <= activate < first_bare, "the README must say `source .venv/bin/activate` before its first " \
                                       "bare `python` command"
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    assert "source .venv/bin/activate" in index
    bare3 = [k for k in COMMANDS if k.startswith("python3 ")]
    assert not bare3, f"python3 is the system python, not the venv's: {bare3}"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_documented_command_answers_help_as_written(command: str) -> None:
    """Each documented entry point, run the way the docs write it in an activated venv, answers --help."""
    import shutil
    import subprocess

    python = command.split()[0]
    if python.startswith(".venv-trl/") and not (ROOT / python).exists():
        pytest.skip("no .venv-trl here (bash scripts/test_trl.sh makes it)")
    env = activated_env()
    assert shutil.which("python", path=env["PATH"]) is not None
    proc = subprocess.run(["bash", "-c", f"{command} --help"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=180)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and HELP.search(out), \
        f"`{command} --help` (from {COMMANDS[command]}) exited {proc.returncode}:\n{out[-2000:]}"


# ------------------------------------------------------------------ the docs stand alone
#: what no file of the project may point to: a design file and a shared folder outside the repository
OUTSIDE = re.compile(r"DESIGN\.md|\.\./shared\b|/work/shared\b")
SKIP_DIRS = {".git", ".venv", ".venv-trl", "runs", "outputs", "__pycache__", "node_modules", ".pytest_cache"}


def _project_text_files() -> list[Path]:
    out = []
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT)
        if set(rel.parts) & SKIP_DIRS or rel.parts[0].startswith(".venv") or not path.is_file():
            continue
        if path.suffix in (".md", ".py", ".yaml", ".yml", ".toml", ".sh", ".txt", ".cfg") or rel.parts[:1] == (".ci",):
            out.append(path)
    return out


def test_no_project_file_points_outside_the_repository() -> None:
    me = Path(__file__).resolve()
    hits = [f"{p.relative_to(ROOT)}:{n}: {line.strip()[:100]}"
            for p in _project_text_files() if p.resolve() != me
            for n, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
            if OUTSIDE.search(line)]
    assert not hits, "the project's files must stand alone (no DESIGN.md, no ../shared):\n" + "\n".join(hits)
