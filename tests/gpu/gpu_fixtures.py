"""Fixtures of the gpu tests: jobs run through the runner with the fake prime-rl ``rl`` and fake ``vllm``
(``tests/gpu/fakes``), on the micro model saved as an HF folder. A plugin module (``pytest_plugins``), not a
``conftest.py`` (see ``gpu_helpers.py``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from task_families import reference_files
from ait_env.jobs.settings import BackendBounds, BackendSettings, ModelInfo
from gpu.vllm_server import free_port
from tests.gpu.gpu_helpers import FAKES, FAKE_VLLM, MODEL, OTHER, ROOT

_FAKE_PYPROJECT = """[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "ait-fake-prime-rl"
version = "0.7.0"

[project.scripts]
rl = "ait_fake_primerl.fake_rl:main"

[tool.setuptools]
packages = ["ait_fake_primerl"]
"""


@pytest.fixture(scope="session")
def fake_primerl() -> Iterator[Path]:
    """The fake ``rl`` installed the way prime-rl's lock installs the real one: an **editable** install in
    a venv of its own, its code in a folder outside that venv that nothing else names (a copy of
    ``tests/gpu/fakes`` as the package ``ait_fake_primerl``, below a fresh folder in ``/tmp``), so a jail
    that binds only the venv cannot import it (issue 31, item 1). The venv reaches this project's packages
    (verifiers, torch, ait_env: what the fake imports) through a ``.pth`` file naming this venv's
    ``site-packages`` and the checkout, as a venv reaches any folder outside itself. Yields ``venv/bin/rl``."""
    root = Path(tempfile.mkdtemp(prefix="ait-fake-rl-", dir="/tmp"))
    root.chmod(0o755)   # the training uid passes through (user mode)
    try:
        pkg = root / "src" / "ait_fake_primerl"
        shutil.copytree(FAKES, pkg, ignore=shutil.ignore_patterns("__pycache__"))
        (root / "src" / "pyproject.toml").write_text(_FAKE_PYPROJECT)
        venv = root / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        site = next((venv / "lib").glob("python3*/site-packages"))
        (site / "ait_deps.pth").write_text(f"{sysconfig.get_paths()['purelib']}\n{ROOT}\n")
        out = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
                              "--no-deps", "--no-build-isolation", "--no-index", "-q", "-e", str(root / "src")],
                             capture_output=True, text=True, check=False,
                             env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
        assert out.returncode == 0, out.stdout + out.stderr
        for path in [root, *root.rglob("*")]:
            if path.is_dir():
                path.chmod(0o755)
        yield venv / "bin" / "rl"
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def micro_dirs(tmp_path_factory: pytest.TempPathFactory, micro_model: Any,
               micro_tokenizer: Any) -> dict[str, str]:
    """HF folders of the micro model for both model ids (the fakes' "hub")."""
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for name in (MODEL, OTHER):
        d = root / name.replace("/", "--")
        micro_model.save(d)
        micro_tokenizer.save(d, model_max_length=micro_model.cfg.max_position_embeddings)
        out[name] = str(d)
    return out


@pytest.fixture
def gpu_bundle(tmp_path: Path) -> Callable[..., Any]:
    """``make(env_edit=...)``: a 3-step arithmetic job on ``MODEL``, bundled with its rendered rl.toml."""
    from ait_env.jobs.bundle import build_bundle
    from ait_env.jobs.schema import parse_job
    from task_families import get_family

    def make(env_edit: Callable[[str], str] = lambda t: t) -> Any:
        ws = tmp_path / f"ws-{uuid.uuid4().hex[:6]}"
        ws.mkdir()
        files = reference_files("arithmetic", MODEL)
        job_toml = files["job.toml"]
        for old, new in (("max_steps = 60", "max_steps = 3"), ("batch_size = 128", "batch_size = 16"),
                         ("group_size = 8", "group_size = 4"), ("warmup_steps = 5", "warmup_steps = 1"),
                         ("max_tokens = 256", "max_tokens = 48"),
                         ("num_examples = 4000", "num_examples = 200")):
            job_toml = job_toml.replace(old, new)
        files["job.toml"] = job_toml
        files["environment.py"] = env_edit(files["environment.py"])
        for k, v in files.items():
            (ws / k).write_text(v)
        job, issues = parse_job(files["job.toml"])
        assert job is not None, issues
        bundle = build_bundle(ws, job, get_family("arithmetic"), tmp_path / "jobs")
        assert (bundle.root / "rl.toml").is_file()
        return bundle

    return make


@pytest.fixture
def gpu_settings(tmp_path: Path, micro_dirs: dict[str, str], fake_primerl: Path,
                 monkeypatch: pytest.MonkeyPatch) -> Callable[..., BackendSettings]:
    """``make(scenario, **options)``: the ``gpu`` backend's settings with the fakes; ``run_id`` (the
    ``FAKE_RUN_ID`` of every process it starts) is in ``settings.options["env"]``. The training jail is
    ``none`` unless a test sets ``$AIT_TRAINING_JAIL`` itself (the jail's own tests do)."""
    from gpu.isolation import JAIL_ENV, JailConfig

    monkeypatch.setenv(JAIL_ENV, JailConfig(mode="none", reason="tests").model_dump_json())

    def make(scenario: str = "success", models: tuple[str, ...] = (MODEL,),
             **options: Any) -> BackendSettings:
        env = {"FAKE_PRIMERL_MODELS": json.dumps(micro_dirs), "FAKE_PRIMERL_SCENARIO": scenario,
               "FAKE_RUN_ID": uuid.uuid4().hex, "FAKE_VLLM_RECORD": str(tmp_path / "vllm_launches.jsonl"),
               **options.pop("env", {})}
        opts = {"primerl_cmd": [str(fake_primerl)], "vllm_cmd": FAKE_VLLM, "gpus": [0],
                "model_paths": dict(micro_dirs),
                "env": env, "eval_every": 0, "eval_subset": 8, "eval_limit": 8, "eval_max_tokens": 48,
                "eval_concurrency": 8, "measure_pre": True, "kill_grace_s": 2.0, "poll_s": 0.1,
                "vllm_startup_timeout_s": 60.0, "policy_port": free_port(), **options}
        return BackendSettings(name="gpu", models=[ModelInfo(name=m) for m in models],
                               bounds=BackendBounds(wall_clock_minutes=5), options=opts)

    return make

