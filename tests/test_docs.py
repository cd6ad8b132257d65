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
