"""The folders a Python program needs to read to start: its venv, the interpreter the venv points to, and
the **editable** installs of that venv, wherever they live.

Contract: :func:`program_paths` takes a program (a console script or an interpreter of a venv, or a name on
``path``) and returns the folders a jail must make readable for it to import what its venv installs;
:func:`editable_roots` returns only the editable part. Nothing here starts a process; it reads files.

Why: a venv does not hold the code of an editable install. prime-rl v0.7.0's own ``uv.lock`` installs
prime-rl, ``packages/prime-rl-configs``, ``deps/verifiers``, ``deps/renderers`` and
``deps/pydantic-config`` as editable (``uv.lock``: ``source = { editable = ... }``; ``pyproject.toml``
``[tool.uv.sources]``), so a jail that binds only the venv hides prime-rl from its own ``rl``. An
editable install points outside the venv in one of the forms Python's ``site`` module and the build
backends write into ``site-packages``:

- a ``*.pth`` file whose lines are folders (``site.addpackage`` adds each existing one to ``sys.path``;
  hatchling's and setuptools' "compat" editables, and ``uv``'s);
- a ``__editable__*_finder.py`` import hook (setuptools' PEP 660 "strict"/"lenient" mode) whose
  ``MAPPING`` (package -> folder) and ``NAMESPACES`` (package -> [folders]) say where each package is;
- ``*.dist-info/direct_url.json`` with ``dir_info.editable`` (PEP 610): the project folder. Used only
  when a distribution's files point nowhere else (it names the whole project, e.g. a repository root,
  which is wider than what Python reads).
"""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path
from urllib.parse import unquote, urlparse


def venv_of(program: str | Path) -> Path | None:
    """The venv (the folder holding ``pyvenv.cfg``) a program's ``bin/`` belongs to, else None."""
    p = Path(program).absolute()
    for root in (p.parent.parent, p.resolve().parent.parent):
        if (root / "pyvenv.cfg").is_file():
            return root
    return None


def base_prefix(venv: Path) -> Path | None:
    """The prefix of the interpreter a venv was made from (``pyvenv.cfg`` ``home`` is its ``bin``)."""
    try:
        for line in (venv / "pyvenv.cfg").read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home" and value.strip():
                return Path(value.strip()).resolve().parent
    except OSError:
        pass
    return None


def site_packages(venv: Path) -> list[Path]:
    return sorted(p for p in (venv / "lib").glob("python3*/site-packages") if p.is_dir())


def _pth_folders(pth: Path) -> list[Path]:
    """The folder lines of a ``.pth`` file (``site.addpackage``: comments and ``import`` lines are not
    folders; relative lines are relative to the site dir)."""
    out = []
    try:
        lines = pth.read_text(errors="replace").splitlines()
    except OSError:
        return out
    for line in lines:
        line = line.rstrip()
        if not line or line.startswith("#") or line.startswith(("import ", "import\t")):
            continue
        folder = (pth.parent / line).resolve()
        if folder.is_dir():
            out.append(folder)
    return out


def _finder_folders(finder: Path) -> list[Path]:
    """The folders of setuptools' ``__editable__*_finder.py`` (its ``MAPPING`` and ``NAMESPACES``)."""
    try:
        tree = ast.parse(finder.read_text(errors="replace"))
    except (OSError, SyntaxError):
        return []
    out: list[Path] = []
    for node in tree.body:
        target = (node.targets[0] if isinstance(node, ast.Assign) and node.targets
                  else node.target if isinstance(node, ast.AnnAssign) else None)
        if not isinstance(target, ast.Name) or target.id not in ("MAPPING", "NAMESPACES"):
            continue
        try:
            value = ast.literal_eval(node.value) if node.value is not None else {}
        except ValueError:
            continue
        for v in (value or {}).values():
            for folder in ([v] if isinstance(v, str) else v):
                if Path(folder).is_dir():
                    out.append(Path(folder).resolve())
    return out


def _direct_url_folder(dist_info: Path) -> Path | None:
    try:
        info = json.loads((dist_info / "direct_url.json").read_text())
    except (OSError, ValueError):
        return None
    if not (isinstance(info, dict) and (info.get("dir_info") or {}).get("editable")):
        return None
    url = urlparse(str(info.get("url", "")))
    folder = Path(unquote(url.path)) if url.scheme == "file" else None
    return folder.resolve() if folder is not None and folder.is_dir() else None


def editable_roots(venv: Path) -> list[Path]:
    """The folders outside ``venv`` its editable installs import from (module docstring)."""
    venv = venv.resolve()
    found: list[Path] = []
    for sp in site_packages(venv):
        for pth in sorted(sp.glob("*.pth")):
            found += _pth_folders(pth)
        for finder in sorted(sp.glob("__editable__*_finder.py")):
            found += _finder_folders(finder)
        if not found:
            for dist_info in sorted(sp.glob("*.dist-info")):
                folder = _direct_url_folder(dist_info)
                if folder is not None:
                    found.append(folder)
    roots = [f for f in dict.fromkeys(found) if venv != f and venv not in f.parents]
    # a folder inside another one already listed needs no bind of its own
    return [r for r in roots if not any(o != r and o in r.parents for o in roots)]


def program_paths(program: str | Path, path: str | None = None) -> list[str]:
    """What a jail must make readable for ``program`` (a file, or a name looked up on ``path``) to run:
    its venv (or its prefix when it is not in a venv), the venv's base interpreter prefix, and the
    venv's editable roots. ``[]`` when the program is not found."""
    exe = str(program) if "/" in str(program) else shutil.which(str(program), path=path)
    if exe is None:
        return []
    venv = venv_of(exe)
    if venv is None:
        prefix = Path(exe).absolute().parent.parent
        return sorted({str(prefix), str(Path(exe).resolve().parent.parent)} - {"/"})
    roots = {venv, venv.resolve()}
    base = base_prefix(venv.resolve())
    if base is not None:
        roots.add(base)
    roots.update(editable_roots(venv))
    return sorted(str(r) for r in roots if str(r) != "/")
