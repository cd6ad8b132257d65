"""The pinned worker image (gpu/Dockerfile, gpu/requirements.lock) cannot be built here: its every pin is
checked against the project's one source of truth (ait_env/jobs/primerl.py, pyproject.toml's extras)."""

from __future__ import annotations

import re
import tomllib

from ait_env.jobs import primerl
from gpu import selfcheck
from gpu.isolation import DEFAULT_TRAINING_UID
from tests.gpu.helpers import ROOT

DOCKERFILE = (ROOT / "gpu" / "Dockerfile").read_text()
LOCK = (ROOT / "gpu" / "requirements.lock").read_text()
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
#: prime-rl v0.7.0's own Dockerfile.cuda base image and `requires-python = "~=3.12.0"` (read at d334ea5)
PRIME_RL_BASE_IMAGE = "nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04"
PRIME_RL_PYTHON = "3.12"


def _args() -> dict[str, str]:
    return {m[1]: m[2].strip('"') for m in re.finditer(r"^ARG (\w+)=(.*)$", DOCKERFILE, re.M)}


def _extra_pin(extra: str, dist: str) -> str:
    for req in PYPROJECT["project"]["optional-dependencies"][extra]:
        m = re.fullmatch(rf"{re.escape(dist)}==([\w.+-]+)", req.strip())
        if m:
            return m[1]
    raise AssertionError(f"pyproject.toml's {extra!r} extra does not pin {dist} exactly")


def _lock() -> dict[str, str]:
    return {m[1].lower(): m[2] for m in re.finditer(r"^([A-Za-z0-9_.-]+)==(\S+)$", LOCK, re.M)}


def test_dockerfile_pins_match_the_project():
    args = _args()
    assert args["PRIME_RL_TAG"] == primerl.PRIME_RL_TAG
    assert args["PRIME_RL_COMMIT"] == primerl.PRIME_RL_COMMIT
    assert args["VERIFIERS_VERSION"] == primerl.VERIFIERS_VERSION == _extra_pin("inner", "verifiers")
    assert args["RUNPOD_VERSION"] == _extra_pin("runpod", "runpod")
    assert args["PYTHON_VERSION"] == PRIME_RL_PYTHON and args["CUDA_IMAGE"] == PRIME_RL_BASE_IMAGE
    assert re.fullmatch(r"\d+\.\d+\.\d+", args["UV_VERSION"]), "uv must be pinned to a release"
    assert args["MODELS"].split() == [m["name"] for m in _gpu_local_models()]
    assert f"--uid {DEFAULT_TRAINING_UID} " in DOCKERFILE


def test_every_dockerfile_arg_is_used():
    for name in _args():
        assert DOCKERFILE.count(f"${{{name}}}") >= 1, f"ARG {name} is declared but never used"


def test_the_lock_is_exact_and_agrees_with_pyproject():
    lock = _lock()
    assert lock["verifiers"] == _extra_pin("inner", "verifiers")
    assert lock["runpod"] == _extra_pin("runpod", "runpod")
    reqs = [ln for ln in LOCK.splitlines() if ln and not ln.startswith((" ", "#", "-"))]
    assert reqs and all("==" in ln for ln in reqs), [ln for ln in reqs if "==" not in ln]
    # the worker's venv never holds the training stack: that is prime-rl's own venv
    assert not {"torch", "vllm", "prime-rl"} & set(lock)


def test_selfcheck_expects_what_prime_rls_lock_installs():
    assert selfcheck.PRIME_RL_LOCKED["verifiers"] == primerl.VERIFIERS_VERSION
    assert all(re.fullmatch(r"[\d.]+(\+\w+)?", v) for v in selfcheck.PRIME_RL_LOCKED.values())


def _gpu_local_models() -> list[dict]:
    from ait_env.config import load_group

    return load_group("backend", "gpu-local")["models"]
