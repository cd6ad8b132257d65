"""The worker's self-check, run once at worker start: is this machine the pinned worker it claims to be?

:func:`run` records, for the trainer executor the worker will use (``gpu``: prime-rl; ``local``: the
tiny CPU models):

- **versions**: Python, this project, the runpod SDK (where installed) and, in the interpreter that
  trains (prime-rl's own venv, ``$AIT_PRIME_RL_DIR/.venv``, for ``gpu``; this one for ``local``), torch,
  vllm, transformers, verifiers and prime-rl with its git commit;
- the **image revision** (``$AIT_IMAGE_REVISION``, baked into the image by ``gpu/Dockerfile``);
- the **GPUs** (``nvidia-smi``, else ``torch.cuda``; none here is reported as such);
- the **model files** by sha256 against a manifest (``$AIT_MODEL_MANIFEST``, written at image build by
  ``python -m gpu.selfcheck --write-manifest``);
- the **isolation** the training tree gets (:func:`gpu.isolation.probe`).

Every ``problem`` refuses jobs: the worker answers them ``infra_failed`` with :meth:`SelfCheck.refusal`
(what is wrong and how to fix it) instead of running them on a machine that is not what was pinned.
``warnings`` are reported, never refused. :meth:`SelfCheck.summary` is what every result carries
(``JobResult.worker``).

    python -m gpu.selfcheck [--executor gpu|local]            # print the check as JSON
    python -m gpu.selfcheck --write-manifest models.json --models Qwen/Qwen3-0.6B Qwen/Qwen3-1.7B
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from ait_env.jobs.primerl import PRIME_RL_COMMIT, PRIME_RL_TAG, VERIFIERS_VERSION
from gpu.isolation import JailConfig, probe

#: what prime-rl's own ``uv.lock`` at tag v0.7.0 (commit d334ea5) installs: ``uv sync --locked`` must give
#: exactly these (read from that lock; checked against the training venv at worker start)
PRIME_RL_LOCKED: dict[str, str] = {"torch": "2.11.0+cu128", "vllm": "0.24.0+cu129", "transformers": "5.6.2",
                                   "verifiers": VERIFIERS_VERSION}
#: GPUs a worker needs: one runs prime-rl's default 1 inference + 1 trainer colocated (filesystem weight
#: broadcast, gpu/gpu_plan.py ``plan_gpus``); two give each its own; a job asking for more than the
#: worker has is refused by the executor with what it needs
GPU_JOB_MIN_GPUS = 1
DEFAULT_PRIME_RL_DIR = "/opt/prime-rl"
DEFAULT_MANIFEST = "/opt/ait/models.manifest.json"
#: Runpod's cached models (docs: serverless/development/huggingface-models.mdx, "Locate cached models")
RUNPOD_HF_CACHE = "/runpod-volume/huggingface-cache/hub"
_PACKAGES = ("torch", "vllm", "transformers", "verifiers", "prime-rl")


class GpuInfo(BaseModel):
    name: str
    memory_mib: int = 0


class SelfCheck(BaseModel):
    executor: str
    image_revision: str = "unknown"
    versions: dict[str, str] = Field(default_factory=dict)
    gpus: list[GpuInfo] = Field(default_factory=list)
    gpu_source: str = "none"
    models: dict[str, str] = Field(default_factory=dict)   # model -> "ok" | what is wrong
    isolation: JailConfig | None = None
    problems: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems

    def refusal(self) -> str:
        """The ``infra_failed`` message for a job this worker refuses ("" when it runs jobs)."""
        if self.ok:
            return ""
        return (f"this worker refuses {self.executor!r} jobs (self-check, image {self.image_revision}): "
                + " | ".join(self.problems))

    def summary(self) -> dict[str, Any]:
        """What every result carries about the worker that produced it (``JobResult.worker``)."""
        jail = self.isolation.describe() if self.isolation else "not probed"
        agent_code = ("the local executor's sandbox (ait_env.sandbox: bubblewrap or its fallback, "
                      "docs/security.md)" if self.executor == "local" else "the training jail")
        return {"image_revision": self.image_revision, "executor": self.executor, "versions": self.versions,
                "gpus": [f"{g.name} ({g.memory_mib} MiB)" for g in self.gpus], "models": self.models,
                "isolation": {"training_jail": jail, "agent_code_runs_in": agent_code},
                "selfcheck": "ok" if self.ok else "refused", "warnings": self.warnings}


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return ""


_QUERY = ("import importlib.metadata as m, json, platform\n"
          "def v(d):\n    try:\n        return m.version(d)\n"
          "    except m.PackageNotFoundError:\n        return ''\n"
          "print(json.dumps({'python': platform.python_version(), "
          f"**{{d: v(d) for d in {list(_PACKAGES)!r}}}}}))")


def training_versions(python: str, timeout_s: float = 60.0) -> dict[str, str]:
    """Python and package versions of the interpreter ``python`` (a venv other than this one)."""
    out = subprocess.run([python, "-I", "-c", _QUERY], capture_output=True, text=True, timeout=timeout_s,
                         check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{python} could not report its versions: {out.stderr.strip()[-300:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def prime_rl_commit(root: Path) -> str:
    """The commit of the prime-rl checkout at ``root`` (``.ait-commit``, written at image build, else git)."""
    stamp = root / ".ait-commit"
    if stamp.is_file():
        return stamp.read_text().strip()
    if shutil.which("git") and (root / ".git").exists():
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             check=False, timeout=30)
        return out.stdout.strip()
    return ""


def detect_gpus(env: dict[str, str] | None = None) -> tuple[list[GpuInfo], str]:
    """(GPUs this process may use, where the answer came from): ``nvidia-smi``'s rows that
    ``CUDA_VISIBLE_DEVICES`` names (by index or UUID; all when unset), else ``torch.cuda``, else none.

    nvidia-smi lists every GPU of the machine whatever ``CUDA_VISIBLE_DEVICES`` says; a SkyPilot pool job sees
    only its own (Ray sets the variable to the job's ``num_gpus``, sky/backends/task_codegen.py, 0.14.1), and two
    1-GPU jobs may share a 2-GPU worker: the result's ``worker.gpus`` is what the job's bill counts."""
    env = dict(os.environ) if env is None else env
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=index,uuid,name,memory.total", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=30, check=False)
            if out.returncode == 0:
                return visible_smi_rows(out.stdout, env.get("CUDA_VISIBLE_DEVICES")), "nvidia-smi"
        except (OSError, subprocess.SubprocessError):
            pass
    if importlib.util.find_spec("torch") is not None:
        import torch

        if torch.cuda.is_available():   # torch itself honours CUDA_VISIBLE_DEVICES
            return [GpuInfo(name=torch.cuda.get_device_name(i),
                            memory_mib=torch.cuda.get_device_properties(i).total_memory // 2**20)
                    for i in range(torch.cuda.device_count())], "torch.cuda"
        return [], "torch.cuda (no device)"
    return [], "none (no nvidia-smi, no torch)"


def visible_smi_rows(text: str, visible: str | None) -> list[GpuInfo]:
    """The GPUs of ``nvidia-smi --query-gpu=index,uuid,name,memory.total --format=csv,noheader,nounits``
    output that ``visible`` (``CUDA_VISIBLE_DEVICES``: indices or UUIDs, comma-separated; None: all) names,
    in its order; an entry naming no GPU is skipped, as CUDA does from the first such entry on."""
    rows: list[tuple[str, str, GpuInfo]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",", 2)]
        if len(parts) == 3:
            rows.append((parts[0], parts[1], parse_smi_line(parts[2])))
        else:
            rows.append(("", "", parse_smi_line(line)))
    if visible is None:
        return [g for _, _, g in rows]
    picked: list[GpuInfo] = []
    for token in (t.strip() for t in visible.split(",")):
        hit = next((g for idx, uuid, g in rows if token and (token == idx or (uuid and uuid.startswith(token)))),
                   None)
        if hit is None:
            break   # CUDA ignores the entries after an invalid one
        picked.append(hit)
    return picked


def parse_smi_line(line: str) -> GpuInfo:
    """One line of ``nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits``."""
    name, _, mem = line.rpartition(",")
    try:
        return GpuInfo(name=name.strip(), memory_mib=int(float(mem.strip())))
    except ValueError:
        return GpuInfo(name=line.strip())


# ---------------------------------------------------------------------------------------------- model files
def model_dir(model: str, env: dict[str, str] | None = None) -> Path | None:
    """Where ``model``'s files are: ``$AIT_MODELS_DIR/<org>/<name>`` (weights baked into the image), else
    the newest snapshot in the Hugging Face cache (``$HF_HUB_CACHE``, or Runpod's cached models on a
    mounted volume, :data:`RUNPOD_HF_CACHE`); None when neither holds it."""
    env = dict(os.environ) if env is None else env
    if env.get("AIT_MODELS_DIR"):
        d = Path(env["AIT_MODELS_DIR"]) / model
        return d if d.is_dir() else None
    hf_home = f"{env['HF_HOME']}/hub" if env.get("HF_HOME") else None
    for cache in (env.get("HF_HUB_CACHE"), hf_home, RUNPOD_HF_CACHE):
        if not cache:
            continue
        root = Path(cache) / f"models--{model.replace('/', '--')}"
        ref = root / "refs" / "main"
        if ref.is_file() and (root / "snapshots" / ref.read_text().strip()).is_dir():
            return root / "snapshots" / ref.read_text().strip()
        snaps = sorted((root / "snapshots").glob("*")) if (root / "snapshots").is_dir() else []
        if snaps:
            return snaps[-1]
    return None


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def write_manifest(models: list[str], out: Path) -> dict[str, Any]:
    """Hash every file of ``models`` (found by :func:`model_dir`) into the manifest ``out``."""
    data: dict[str, Any] = {"models": {}}
    for m in models:
        d = model_dir(m)
        if d is None:
            raise SystemExit(f"model {m} not found (set AIT_MODELS_DIR or HF_HUB_CACHE); download it first")
        files = sorted(p for p in d.rglob("*") if p.is_file() and not p.name.startswith("."))
        data["models"][m] = {str(p.relative_to(d)): sha256_file(p) for p in files}
    out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return data


def check_models(manifest: dict[str, Any]) -> dict[str, str]:
    """model -> "ok", or what is missing or differs (each a refusal)."""
    status: dict[str, str] = {}
    for model, files in manifest.get("models", {}).items():
        d = model_dir(model)
        if d is None:
            status[model] = "missing (not in AIT_MODELS_DIR nor in the Hugging Face cache)"
            continue
        bad = [rel for rel, digest in files.items()
               if not (d / rel).is_file() or sha256_file(d / rel) != digest]
        status[model] = "ok" if not bad else f"files differ from the manifest: {', '.join(bad[:5])}"
    return status


# ---------------------------------------------------------------------------------------------- the check
def run(executor: str, *, require_revision: str | None = None, isolation: str | None = None,
        min_gpus: int | None = None) -> SelfCheck:
    """Check this worker for jobs of ``executor`` (see the module docstring). ``require_revision``: the image
    revision the caller expects (a mismatch refuses); ``isolation``: the jail mode to insist on (default
    ``$AIT_ISOLATION`` or ``auto``)."""
    from ait_env.runner import EXECUTORS

    t0 = time.time()
    chk = SelfCheck(executor=executor, image_revision=os.environ.get("AIT_IMAGE_REVISION", "unknown"))
    chk.versions = {"python": platform.python_version(), "ai-trains-ai": _version("ai-trains-ai")}
    if _version("runpod"):
        chk.versions["runpod"] = _version("runpod")
    if require_revision and require_revision != chk.image_revision:
        chk.problems.append(f"image revision {chk.image_revision!r}, the caller requires "
                            f"{require_revision!r}: deploy the image it was built for (gpu/README.md)")
    if executor not in EXECUTORS:
        landed = ("; the prime-rl executor (gpu/primerl_executor.py) has not landed in this checkout"
                  if executor == "gpu" else "")
        chk.problems.append(f"no trainer executor for {executor!r} in ait_env.runner.EXECUTORS (known: "
                            f"{', '.join(EXECUTORS)}){landed}")
    elif importlib.util.find_spec(EXECUTORS[executor].partition(":")[0]) is None:
        chk.problems.append(f"the {executor!r} executor's module {EXECUTORS[executor]} is not importable")
    chk.gpus, chk.gpu_source = detect_gpus()
    if executor == "gpu":
        _check_gpu_stack(chk, min_gpus if min_gpus is not None else int(os.environ.get("AIT_MIN_GPUS",
                                                                                       GPU_JOB_MIN_GPUS)))
    else:
        chk.versions.update({d: v for d in ("torch", "verifiers") if (v := _version(d))})
    manifest_path = Path(os.environ.get("AIT_MODEL_MANIFEST", DEFAULT_MANIFEST))
    if executor == "gpu" and manifest_path.is_file():
        chk.models = check_models(json.loads(manifest_path.read_text()))
        chk.problems += [f"model {m}: {s} (rebuild the image or re-download the weights; gpu/README.md)"
                         for m, s in chk.models.items() if s != "ok"]
    elif executor == "gpu":
        chk.warnings.append(f"model files not checked: no manifest at {manifest_path} "
                            "(set AIT_MODEL_MANIFEST)")
    try:
        chk.isolation = probe(isolation or os.environ.get("AIT_ISOLATION", "auto"))  # type: ignore[arg-type]
    except RuntimeError as exc:
        chk.problems.append(str(exc))
    if chk.isolation is not None and chk.isolation.mode != "bwrap":
        chk.warnings.append(chk.isolation.describe())
    chk.seconds = round(time.time() - t0, 2)
    return chk


def prime_rl_dir() -> Path:
    """The prime-rl checkout with its ``.venv`` (``$AIT_PRIME_RL_DIR``, default the image's /opt/prime-rl)."""
    return Path(os.environ.get("AIT_PRIME_RL_DIR", DEFAULT_PRIME_RL_DIR))


def _check_gpu_stack(chk: SelfCheck, min_gpus: int) -> None:
    """The prime-rl side: GPUs, the training venv's versions against the pins, the prime-rl commit."""
    if len(chk.gpus) < min_gpus:
        chk.problems.append(f"{len(chk.gpus)} GPU(s) on this worker ({chk.gpu_source}); a prime-rl job "
                            f"needs at least {min_gpus}: run it on a GPU machine, or use "
                            "the local executor (--backend local) for the tiny CPU models")
    root = prime_rl_dir()
    python = root / ".venv" / "bin" / "python"
    if not python.exists():
        chk.problems.append(f"prime-rl {PRIME_RL_TAG} is not installed at {root} (no {python}); build the "
                            "image (gpu/Dockerfile) or set AIT_PRIME_RL_DIR to a checkout synced with "
                            "`uv sync --locked`")
        return
    try:
        found = training_versions(str(python))
    except (RuntimeError, OSError, subprocess.SubprocessError, ValueError) as exc:
        chk.problems.append(f"the training venv does not answer: {exc}")
        return
    chk.versions.update({f"train:{k}": v for k, v in found.items()})
    commit = prime_rl_commit(root)
    chk.versions["train:prime-rl-commit"] = commit
    if commit != PRIME_RL_COMMIT:
        chk.problems.append(f"prime-rl at {commit or 'an unknown commit'} in {root}, pinned {PRIME_RL_TAG} = "
                            f"{PRIME_RL_COMMIT}: check out the tag and `uv sync --locked`")
    for pkg, want in PRIME_RL_LOCKED.items():
        if found.get(pkg) != want:
            chk.problems.append(f"{pkg} {found.get(pkg) or 'missing'} in the training venv, prime-rl's lock "
                                f"pins {want}: re-run `uv sync --locked` in {root}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpu.selfcheck", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--executor", default="gpu", help="the trainer executor to check for (gpu | local)")
    ap.add_argument("--write-manifest", type=Path, help="hash the model files into this manifest and exit")
    ap.add_argument("--models", nargs="*", default=["Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B"])
    args = ap.parse_args(argv)
    if args.write_manifest:
        data = write_manifest(args.models, args.write_manifest)
        print(f"wrote {args.write_manifest}: {sum(len(f) for f in data['models'].values())} files")
        return 0
    chk = run(args.executor)
    print(chk.model_dump_json(indent=1))
    return 0 if chk.ok else 1


if __name__ == "__main__":
    # the canonical module's main, not this __main__ copy's: one class object per exception and type
    from gpu.selfcheck import main as _main

    raise SystemExit(_main())
