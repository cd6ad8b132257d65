"""The hidden eval sets' seeds, private per installation, and the sets they derive.

Two sources of seeds (:class:`HiddenSeeds`), chosen per process by ``$AIT_HIDDEN_SEEDS`` (``published`` or
``private``; unset: **private**), which child processes (the job runner, the eval harness) inherit:

- **private** (the default: anything that trains or scores an agent: the trainers, the integrations, the LLM
  runner, ``gym.make`` in your code): random seeds kept in a file of this installation,
  ``$AIT_SECRETS_FILE`` or ``$XDG_CONFIG_HOME/ai-trains-ai/secrets.json`` (``~/.config/...``), JSON
  ``{"<family>": <int>, ...}``. The first use creates it (mode 0600 in a folder of mode 0700, 63 random bits
  per family, under a lock: concurrent processes get the same seeds) and adds a seed for a family it lacks;
  it is refused, with the fix, inside the checkout or the Python installation (both are visible to the
  sandbox) and when group or others may read it. Nothing of it enters a workspace, a job bundle, the
  sandbox (whose environment is cleared and which binds neither the home folder nor this file) or a GPU
  worker's training jail; a GPU worker gets the seeds as ``AIT_SECRETS_JSON`` (:func:`worker_secrets_json`).
- **published** (:data:`DEFAULT_SEEDS`, in this source, so anyone can regenerate those sets): only to
  reproduce the pinned baselines (``ait_env/data/baselines``) and the figures in the docs; chosen explicitly
  (``AIT_HIDDEN_SEEDS=published``, or :func:`use_hidden_seeds` by the scripts that reproduce them). The local
  models' build always uses them (:data:`PUBLISHED`: its corpus leaves the published hidden questions out
  and its fingerprint hashes those sets), so the shipped pinned weights match whatever a run's choice.

Every result says which seeds scored it (:attr:`HiddenSeeds.label`: ``published`` or ``private:<8 hex>``, a
hash of the seeds that does not reveal them): a job's ``result.json`` (``hidden_seeds``), the env's
``info["hidden_seeds"]``, the trainers' and the LLM runner's output. Every baseline records the hash of the
hidden set it was measured on, so published pins do not hold under private seeds: jobs measure the base
scores themselves once and keep them in the user store.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import secrets as _random
import stat
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Literal

from ait_env.jobs.context import JobContext
from task_families import FAMILY_NAMES, get_family
from task_families.base import Instance, instances_hash

#: Published default seeds (see the module docstring): public by design.
DEFAULT_SEEDS: dict[str, int] = {
    "arithmetic": 90_210_001, "persona": 90_210_002, "units": 90_210_003,
    "calendar": 90_210_004, "inventory": 90_210_005, "triage": 90_210_006, "warehouse": 90_210_007,
}

Source = Literal["published", "private"]
#: the process's choice of seeds (inherited by child processes); unset: private
SEEDS_ENV = "AIT_HIDDEN_SEEDS"
#: where the private seeds live (default: $XDG_CONFIG_HOME/ai-trains-ai/secrets.json)
FILE_ENV = "AIT_SECRETS_FILE"
#: the seeds a GPU worker is given (JSON), never a file path: see :func:`worker_secrets_json`
WORKER_ENV = "AIT_SECRETS_JSON"
_ROOT = Path(__file__).resolve().parents[2]   # the checkout (or the installed package's parent)


class SecretsError(RuntimeError):
    """The private seeds cannot be used as they are; the message says how to fix it."""


@dataclass(frozen=True)
class HiddenSeeds:
    """One set of hidden-eval seeds: where they come from and the seed of each family."""

    source: Source
    seeds: tuple[tuple[str, int], ...]
    path: Path | None = field(default=None, compare=False)

    def seed(self, family: str) -> int:
        found = dict(self.seeds).get(family)
        if found is None:
            where = f"the private seeds ({self.path})" if self.path else "DEFAULT_SEEDS"
            raise KeyError(f"no hidden seed for family {family!r} in {where}: add it there (a private file gets "
                           "one by itself on its next use)")
        return found

    @property
    def label(self) -> str:
        """``published``, or ``private:<first 8 hex of the seeds' hash>`` (says which, reveals nothing)."""
        if self.source == "published":
            return "published"
        digest = hashlib.sha256(json.dumps(dict(self.seeds), sort_keys=True).encode()).hexdigest()
        return f"private:{digest[:8]}"


#: the published seeds, for what reproduces the shipped pins (the local models' build, their baselines)
PUBLISHED = HiddenSeeds("published", tuple(sorted(DEFAULT_SEEDS.items())))


def private_path() -> Path:
    """Where this installation's private seeds live: ``$AIT_SECRETS_FILE``, else
    ``$XDG_CONFIG_HOME/ai-trains-ai/secrets.json`` (``~/.config/ai-trains-ai/secrets.json``)."""
    env = os.environ.get(FILE_ENV)
    if env:
        return Path(env).expanduser().absolute()
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config).expanduser().absolute() / "ai-trains-ai" / "secrets.json"


def _visible_roots() -> list[Path]:
    """Folders the sandbox (and a GPU jail) binds read-only, or that ship with the code: the checkout, the
    Python installation and virtualenv (as in :func:`ait_env.processes.python_roots`), and the system
    folders bubblewrap binds (:mod:`ait_env.sandbox.host`). A secrets file there would be readable by agent code."""
    exe = Path(sys.executable)
    roots = {_ROOT, exe.parent.parent, exe.resolve().parent.parent, Path(sys.prefix).resolve(),
             Path(sys.base_prefix).resolve()}
    roots |= {Path(d) for d in ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin")}
    return sorted(roots)


def check_private_location(path: Path) -> None:
    """Refuse a private seeds file the sandbox could see (:func:`_visible_roots`) or inside the checkout."""
    real = path.resolve()
    for root in _visible_roots():
        try:
            real.relative_to(root.resolve())
        except ValueError:
            continue
        raise SecretsError(f"the private hidden-eval seeds would be at {path}, inside {root} (the checkout or the "
                           "Python installation, which the sandbox binds read-only: agent code could read them). "
                           f"Set {FILE_ENV} to a path in your home folder, e.g. ~/.config/ai-trains-ai/secrets.json.")


def _read(path: Path) -> dict[str, int]:
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise SecretsError(f"{path} (the private hidden-eval seeds) can be read by other users (mode {mode:04o}); "
                           f"make it private with: chmod 600 {path}")
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise SecretsError(f"{path} is not JSON ({exc}); it must be an object {{\"<family>\": <int seed>, ...}}: "
                           "fix it, or move it away and a new one is made on the next run") from None
    if not isinstance(data, dict) or not all(isinstance(v, int) and not isinstance(v, bool) for v in data.values()):
        raise SecretsError(f"{path} must be a JSON object {{\"<family>\": <int seed>, ...}}; fix it, or move it "
                           "away and a new one is made on the next run")
    return {str(k): int(v) for k, v in data.items()}


def _write(path: Path, seeds: dict[str, int]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(seeds, indent=1, sort_keys=True) + "\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


@lru_cache(maxsize=8)
def _load_private(path: Path, stamp: tuple[int, int, int]) -> HiddenSeeds:  # noqa: ARG001 - stamp: cache key
    return HiddenSeeds("private", tuple(sorted(_read(path).items())), path)


def private_seeds(path: Path | None = None, create: bool = True) -> HiddenSeeds:
    """This installation's private seeds (see the module docstring): the file at ``path`` (default
    :func:`private_path`), created on first use with random seeds, completed with a seed for any family it
    lacks. ``create=False``: a missing file is a :class:`SecretsError`."""
    path = Path(path) if path is not None else private_path()
    if not path.is_file() or not set(FAMILY_NAMES) <= set(_read(path)):
        if not create:
            raise SecretsError(f"no private hidden-eval seeds at {path}; a run that trains or scores an agent "
                               f"creates them (or set {FILE_ENV} to an existing file)")
        check_private_location(path)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with open(path.with_name(f".{path.name}.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)   # two processes never draw two different sets
            seeds = _read(path) if path.is_file() else {}
            missing = [f for f in FAMILY_NAMES if f not in seeds]
            if missing:
                what = ("created private hidden-eval seeds" if len(missing) == len(FAMILY_NAMES)
                        else f"added private hidden-eval seeds for {', '.join(missing)}")
                seeds.update({f: _random.randbits(63) for f in missing})
                _write(path, seeds)
                sys.stderr.write(f"ait: {what} in {path} (mode 0600; keep it out of the repository and of "
                                 "anything you share)\n")
    check_private_location(path)
    st = path.stat()
    return _load_private(path, (st.st_mtime_ns, st.st_size, st.st_ino))


def current() -> HiddenSeeds:
    """The seeds this process uses: ``$AIT_HIDDEN_SEEDS`` (``published`` | ``private``; unset: private)."""
    choice = os.environ.get(SEEDS_ENV, "").strip() or "private"
    if choice == "published":
        return PUBLISHED
    if choice == "private":
        return private_seeds()
    raise SecretsError(f"{SEEDS_ENV}={choice!r}: use 'private' (this installation's own seeds, the default) or "
                       "'published' (the public seeds, only to reproduce the pinned baselines and the docs' figures)")


def use_hidden_seeds(source: Source) -> HiddenSeeds:
    """Choose the seeds of this process and of the processes it starts (sets ``$AIT_HIDDEN_SEEDS``); a private
    choice creates the file on first use. Returns the seeds (print their :attr:`~HiddenSeeds.label`)."""
    if source not in ("published", "private"):
        raise SecretsError(f"hidden seeds {source!r}: use 'private' or 'published'")
    os.environ[SEEDS_ENV] = source
    return current()


def default_hidden_seeds(default: Source, chosen: str | None = None) -> HiddenSeeds:
    """What an entry point calls: :func:`use_hidden_seeds` with ``chosen`` (its command line's
    ``hidden_seeds=...`` / ``--hidden-seeds``), else ``$AIT_HIDDEN_SEEDS``, else the entry point's ``default``
    (``private`` for what trains or scores an agent, ``published`` for what reproduces the docs' figures)."""
    choice = (chosen or "").strip() or os.environ.get(SEEDS_ENV, "").strip() or default
    return use_hidden_seeds(choice)  # type: ignore[arg-type]


def hidden_seeds_label() -> str:
    """:attr:`HiddenSeeds.label` of :func:`current` (what every result records)."""
    return current().label


def worker_secrets_json(seeds: HiddenSeeds | None = None) -> str | None:
    """The seeds a GPU worker must score with, as the JSON it reads from ``$AIT_SECRETS_JSON``; None for the
    published seeds (a worker given none uses those)."""
    seeds = current() if seeds is None else seeds
    return None if seeds.source == "published" else json.dumps(dict(seeds.seeds), sort_keys=True)


def hidden_seed(family: str, seeds: HiddenSeeds | None = None) -> int:
    return (current() if seeds is None else seeds).seed(family)


@lru_cache(maxsize=64)
def _hidden_set(family: str, seed: int) -> tuple[Instance, ...]:
    return tuple(get_family(family).hidden_eval(seed))


def hidden_set(family: str, seeds: HiddenSeeds | None = None) -> list[Instance]:
    """The hidden eval instances of ``family`` (orchestrator side only), under ``seeds`` (default :func:`current`)."""
    seed = hidden_seed(family, seeds)
    return list(_hidden_set(family, seed))


def hidden_keys(family: str, seeds: HiddenSeeds | None = None) -> set[str]:
    """Question keys of the hidden set (:attr:`Instance.key`), e.g. to keep them out of a corpus."""
    return {inst.key for inst in hidden_set(family, seeds)}


def hidden_questions(family: str, seeds: HiddenSeeds | None = None) -> list[str]:
    """The hidden set's question texts, for the probe's leak check (outside the sandbox)."""
    return [inst.question for inst in hidden_set(family, seeds)]


def hidden_set_hash(family: str, seeds: HiddenSeeds | None = None) -> str:
    """Which hidden set a score was measured on (:func:`task_families.base.instances_hash`)."""
    instances = hidden_set(family, seeds)
    return instances_hash(instances)


def job_context(family: str, models: Sequence[str] = (), weights: Mapping[str, str] | None = None) -> JobContext:
    """The :class:`~ait_env.jobs.context.JobContext` of a job of ``family`` in this process: the hidden set
    and seeds it is scored with here, and the given ``models`` and their built ``weights`` hashes."""
    return JobContext(family=family, hidden_set_hash=hidden_set_hash(family), hidden_seeds=hidden_seeds_label(),
                      models=tuple(models), weights=dict(weights or {}))
