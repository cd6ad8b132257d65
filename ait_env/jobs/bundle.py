"""The job bundle: the one unit every backend runs.

Layout of a bundle directory::

    manifest.json        job id, family, base model, env id, sha256 of every file below
    job.toml             the agent's job file (validated)
    src/<env_id>/        the agent's files as an importable package; ``__init__.py`` re-exports
                         ``load_environment`` from the agent's module, and ``family_tools.py`` is
                         the family's own tool module (the agent's copy is never used)
    rl.toml              the rendered prime-rl config (added by the renderer when available)

The bundle is immutable once written: :meth:`JobBundle.verify` recomputes the hashes.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from ait_env.jobs.schema import Job
from task_families.base import TOOLS_MODULE_NAME, TaskFamily


class BundleError(RuntimeError):
    pass


class Manifest(BaseModel):
    job_id: str
    episode_id: str | None = None
    family: str
    base_model: str
    env_id: str
    environment_module: str
    created: float = Field(default_factory=time.time)
    files: dict[str, str] = Field(default_factory=dict)   # relative path -> sha256
    extra: dict[str, Any] = Field(default_factory=dict)


class JobBundle(BaseModel):
    root: Path
    manifest: Manifest
    job: Job

    @property
    def job_id(self) -> str:
        return self.manifest.job_id

    @property
    def package_dir(self) -> Path:
        return self.root / "src" / self.manifest.env_id

    def verify(self) -> None:
        for rel, digest in self.manifest.files.items():
            p = self.root / rel
            if not p.is_file() or _sha256(p) != digest:
                raise BundleError(f"bundle {self.job_id}: {rel} is missing or was modified")

    @classmethod
    def load(cls, root: Path) -> "JobBundle":
        from ait_env.jobs.schema import parse_job

        manifest = Manifest.model_validate_json((Path(root) / "manifest.json").read_text())
        job, issues = parse_job((Path(root) / "job.toml").read_text())
        if job is None:
            raise BundleError(f"bundle {root}: job.toml does not validate: {issues}")
        return cls(root=Path(root), manifest=manifest, job=job)


def _sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def env_id_for(job_id: str) -> str:
    return "ait_job_" + job_id.replace("-", "_")


def environment_module(job: Job) -> str:
    """The dotted module name of the job's environment file inside its package."""
    return Path(job.job.environment).with_suffix("").as_posix().replace("/", ".")


def shadows_tools(rel: str) -> bool:
    """Whether a workspace path would be importable as the family's tool module instead of the family's
    own ``family_tools.py``: a package or namespace folder ``family_tools/`` (a package wins over a module
    of the same name), an extension module ``family_tools.*.so`` (extensions are found before sources),
    ``family_tools.pyc`` and any other ``family_tools.<suffix>`` at the top level. The agent's own
    ``family_tools.py`` is not one: it is replaced by the family's."""
    first = rel.split("/")[0]
    return rel != f"{TOOLS_MODULE_NAME}.py" and first.split(".")[0] == TOOLS_MODULE_NAME


def write_env_package(workspace_root: Path, job: Job, family: TaskFamily, parent: Path, env_id: str) -> Path:
    """Lay out the agent's files as the importable package ``<parent>/<env_id>/`` and return its folder.

    This is the one way a job's code becomes importable: the bundle (what prime-rl imports by its env
    id), the validation probe and the local rollout worker all import ``env_id`` from a folder made
    here, the way ``verifiers.load_environment(env_id)`` does (``importlib.import_module``). The
    package's ``__init__`` imports the agent's module *relatively* (an agent file named like an
    installed package, e.g. ``verifiers.py``, can never resolve to that package instead) and puts the
    package folder on ``sys.path`` so the agent's modules import their siblings (``family_tools``,
    helpers) by plain name. ``family_tools.py`` is always the family's own, ``job.toml`` and any
    ``__init__.py`` of the agent are left out, and so are symlinks and caches."""
    pkg = Path(parent) / env_id
    pkg.mkdir(parents=True)
    ws = Path(workspace_root)
    for src in sorted(ws.rglob("*")):
        rel = src.relative_to(ws)
        if "__pycache__" in rel.parts or src.is_symlink() or not src.is_file():
            continue
        if rel.as_posix() in ("job.toml", f"{TOOLS_MODULE_NAME}.py", "__init__.py") or shadows_tools(rel.as_posix()):
            continue
        dst = pkg / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
    (pkg / f"{TOOLS_MODULE_NAME}.py").write_text(family.tools_source(), encoding="utf-8")
    (pkg / "__init__.py").write_text(
        f'"""Generated ({family.name}): prime-rl imports this package by its env id, {env_id!r}."""\n'
        "import os as _os\nimport sys as _sys\n\n"
        "# The agent's modules import siblings (family_tools, helpers) by absolute name.\n"
        "_here = _os.path.dirname(_os.path.abspath(__file__))\n"
        "if _here not in _sys.path:\n    _sys.path.insert(0, _here)\n\n"
        f"from .{environment_module(job)} import load_environment  # noqa: E402\n\n"
        "__all__ = ['load_environment']\n", encoding="utf-8")
    return pkg


def build_bundle(workspace_root: Path, job: Job, family: TaskFamily, out_dir: Path,
                 episode_id: str | None = None, job_id: str | None = None,
                 renderer: str | None = None) -> JobBundle:
    """Write a bundle for a validated job under ``out_dir/<job_id>``.

    ``renderer`` names the chat renderer for models prime-rl's renderer map does not know."""
    from ait_env.jobs.primerl import PrimeRLRenderError, RenderOptions, render_rl_toml

    job_id = job_id or time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:8]
    env_id = env_id_for(job_id)
    root = Path(out_dir) / job_id
    if root.exists():
        raise BundleError(f"bundle directory {root} already exists")
    ws = Path(workspace_root)
    write_env_package(ws, job, family, root / "src", env_id)
    module = environment_module(job)
    shutil.copyfile(ws / "job.toml", root / "job.toml")
    (root / "pyproject.toml").write_text(
        "[build-system]\nrequires = [\"setuptools>=68\"]\nbuild-backend = \"setuptools.build_meta\"\n\n"
        f"[project]\nname = \"{env_id.replace('_', '-')}\"\nversion = \"0.1.0\"\n"
        "dependencies = [\"verifiers==0.2.0\"]\n\n"
        "[tool.setuptools.packages.find]\nwhere = [\"src\"]\n", encoding="utf-8")
    manifest = Manifest(job_id=job_id, episode_id=episode_id, family=family.name,
                        base_model=job.job.base_model, env_id=env_id, environment_module=module)
    try:
        (root / "rl.toml").write_text(render_rl_toml(job, env_id=env_id, output_dir="outputs",
                                                     options=RenderOptions(renderer=renderer)), encoding="utf-8")
        manifest.extra["rl_toml"] = "rl.toml"
    except PrimeRLRenderError as exc:
        manifest.extra["rl_toml"] = f"not rendered: {exc}"
    manifest.files = {p.relative_to(root).as_posix(): _sha256(p)
                      for p in sorted(root.rglob("*")) if p.is_file()}
    (root / "manifest.json").write_text(json.dumps(manifest.model_dump(), indent=1) + "\n")
    return JobBundle(root=root, manifest=manifest, job=job)
