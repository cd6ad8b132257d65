"""Which optional extra (``pip install -e '.[<extra>]'``) an entry point needs, and the one-line error
an entry point gives when it is missing.

The core install (``bash scripts/setup.sh``) has no torch, no verifiers, no Tinker cookbook; each comes
with an extra of ``pyproject.toml``. An entry point that needs one says so in one line on stderr and exits
with :data:`EXIT_MISSING_EXTRA`, never with a traceback:

- :func:`require` checks up front, before anything starts or touches the disk (the Tinker trainer checks
  the ``tinker`` extra before its key, so its no-key advice, a dry run, can run);
- :func:`missing_extras_exit` wraps an entry point's body: a ``ModuleNotFoundError`` of a module that
  belongs to an extra (:data:`EXTRA_OF`) becomes that line; any other import error propagates unchanged;
- :func:`install_excepthook` (``import ait_env`` installs it) catches the rest: an entry point of this
  repository (``python -m ait_env...``, ``python scripts/...``, benchmarks, research, examples, gpu) whose
  module-level imports fail for want of an extra ends with the same line and status, not a traceback.
  It acts only when ``sys.argv[0]`` is such an entry point; a program of your own that imports
  ``ait_env`` keeps Python's own behaviour.

:func:`missing_extra_line` is the line: the entry point, the extra, the missing module and the command
that installs it (:data:`INSTALL`).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

#: the exit status of an entry point whose extra is missing
EXIT_MISSING_EXTRA = 3

#: top-level module -> the extra of pyproject.toml that installs it
EXTRA_OF: dict[str, str] = {
    "torch": "local", "tokenizers": "local", "safetensors": "local", "matplotlib": "local",
    "verifiers": "inner", "openai": "inner", "httpx": "inner", "aiohttp": "inner",
    "tinker_cookbook": "tinker", "tinker": "tinker",
    "trl": "trl", "transformers": "trl",
    "runpod": "runpod", "sky": "skypilot", "gguf": "agent", "accelerate": "agent",
    "pytest": "test", "hypothesis": "test",
}

#: extra -> the command that installs it (from the repository root)
INSTALL: dict[str, str] = {
    "trl": "VENV=.venv-trl bash scripts/setup.sh test,trl   (TRL needs its own venv, .venv-trl: docs/trl.md)",
    "skypilot": "VENV=.venv-sky bash scripts/setup.sh skypilot   (its own venv: SkyPilot 0.14.1 pins click<8.2, "
                "runpod click>=8.4.2; run the command with .venv-sky/bin/python: docs/fleet.md)",
}


def install_command(extra: str) -> str:
    """How to install ``extra`` into the project's venv."""
    return INSTALL.get(extra, f"bash scripts/setup.sh {extra}   (or: .venv/bin/pip install -e '.[{extra}]')")


def missing_extra_line(entry: str, module: str, extra: str) -> str:
    """The one line an entry point prints when ``module`` (of ``extra``) is not installed."""
    return f"error: {entry} needs the '{extra}' extra ({module} is not installed); install it with: " \
           f"{install_command(extra)}"


def _missing(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):  # a parent package missing, or a module without a spec
        return True


def require(entry: str, extra: str, *modules: str) -> None:
    """Exit with :data:`EXIT_MISSING_EXTRA` and :func:`missing_extra_line` when one of ``modules``
    (default: every module :data:`EXTRA_OF` maps to ``extra``) cannot be imported."""
    for module in modules or tuple(m for m, e in EXTRA_OF.items() if e == extra):
        if _missing(module):
            print(missing_extra_line(entry, module, extra), file=sys.stderr, flush=True)
            raise SystemExit(EXIT_MISSING_EXTRA)


@contextmanager
def missing_extras_exit(entry: str, active: bool = True) -> Iterator[None]:
    """Within the block, a ``ModuleNotFoundError`` of a module of an extra ends the process with
    :func:`missing_extra_line` and :data:`EXIT_MISSING_EXTRA` (a ``SystemExit``, which Hydra passes
    through); other errors propagate. ``active=False`` (a script's top-level imports when the script is
    imported, not run: ``active=__name__ == "__main__"``) lets every error propagate."""
    try:
        yield
    except ModuleNotFoundError as exc:
        top = (exc.name or "").split(".")[0]
        if not active or top not in EXTRA_OF:
            raise
        print(missing_extra_line(entry, top, EXTRA_OF[top]), file=sys.stderr, flush=True)
        raise SystemExit(EXIT_MISSING_EXTRA) from None


#: the repository root (the folder holding ``ait_env``), whose entry points :func:`install_excepthook` serves
REPO = Path(__file__).resolve().parents[1]
_MODULE_DIRS = ("ait_env", "gpu", "cpu", "research", "task_families")
_SCRIPT_DIRS = ("scripts", "trainers", "benchmarks", "examples")


def entry_of(argv0: str) -> str | None:
    """How the docs write the entry point whose file is ``argv0`` (``python -m cpu.tiny_models.build``,
    ``python scripts/run_episode.py``), or None when it is not one of this repository's."""
    if not argv0 or argv0 in ("-c", "-m") or not argv0.endswith(".py"):
        return None
    try:
        rel = Path(argv0).resolve().relative_to(REPO)
    except ValueError:
        return None
    if rel.parts[0] in _MODULE_DIRS:
        return "python -m " + ".".join(rel.with_suffix("").parts)
    if rel.parts[0] in _SCRIPT_DIRS:
        return f"python {rel.as_posix()}"
    return None


def _excepthook(previous: object) -> object:
    def hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        top = (getattr(exc, "name", None) or "").split(".")[0] if isinstance(exc, ModuleNotFoundError) else ""
        entry = entry_of(sys.argv[0] if sys.argv else "") if top in EXTRA_OF else None
        if entry is None:
            previous(kind, exc, tb)  # type: ignore[operator]
            return
        print(missing_extra_line(entry, top, EXTRA_OF[top]), file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(EXIT_MISSING_EXTRA)  # the status of every missing extra (an excepthook cannot choose one)

    hook.ait_extras = True  # type: ignore[attr-defined]
    return hook


def install_excepthook() -> None:
    """Install the missing-extra hook (once; see the module docstring)."""
    if not getattr(sys.excepthook, "ait_extras", False):
        sys.excepthook = _excepthook(sys.excepthook)  # type: ignore[assignment]
