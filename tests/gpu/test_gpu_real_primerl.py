"""The real prime-rl v0.7.0 inside each training jail, on a CPU (issue 31). Slow; needs the install that
``bash scripts/install_primerl.sh`` makes (skipped with that command when it is absent):

    AIT_TRAINING_UID=61031 AIT_PRIME_RL_DIR=~/.cache/ai-trains-ai/prime-rl-v0.7.0/prime-rl \\
        .venv/bin/python -m pytest -m slow tests/gpu/test_gpu_real_primerl.py -v -s

(the default ``-n 2`` runs the cases side by side: each case gets a training uid of its own, the dry runs
``$AIT_TRAINING_UID`` + 0 / + 1, the liveness cases + 2..9, since every jail kills all processes of its uid;
give each suite its own base. User mode needs every folder above prime-rl's interpreter to let the training uid pass: under a
0700 home the test opens them (``o+x``) for its run and restores them after.)

For each jail mode (``bwrap``, ``user``, ``none``) and every family's reference bundle:

- the executor's own dry run (:class:`gpu.primerl_executor.PrimeRLExecutor`, ``rl @ <bundle>/rl.toml
  --output-dir ... --dry-run`` started by :meth:`gpu.isolation.TrainingJail.command` exactly as for a job)
  must pass and write the resolved configs;
- prime-rl's orchestrator code then starts each bundle's train env server in the same jail as it does in a
  run (``tests/gpu/primerl_env_probe.py``: ``prime_rl.orchestrator.envs.Env.start``: a ``spawn`` child with
  verifiers' legacy server, its address over a ``multiprocessing`` queue, then ``info()``), and
  ``localhost`` must resolve and a ``multiprocessing`` queue must work in the jail.

``-k broken`` (issue 48): for the ``bwrap`` and ``none`` jails and four broken environments (raises, ``os._exit``,
``sys.exit``, a sleep at import), ``PrimeRLExecutor.train`` with the real launcher, orchestrator and env server
(``inference`` and ``torchrun`` are programs that wait) must end the job ``job_failed`` within 120 s of the env
server's start, naming the cause. On a CPU install the orchestrator imports only with an import-only
``ring_flash_attn`` (:data:`RING_FLASH_ATTN_STUB`; flash_attn is a CUDA build), used only where needed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ait_env.jobs.settings import BackendBounds, BackendSettings, ModelInfo
from gpu.isolation import JAIL_ENV, JailConfig, TrainingJail, bwrap_works, training_uid
from gpu.venv_paths import program_paths

pytestmark = pytest.mark.slow

MODEL = "Qwen/Qwen3-0.6B"
PRIME_RL = Path(os.environ.get("AIT_PRIME_RL_DIR")
                or Path.home() / ".cache" / "ai-trains-ai" / "prime-rl-v0.7.0" / "prime-rl")
PROBE = Path(__file__).with_name("primerl_env_probe.py")


def _installed() -> str | None:
    if not (PRIME_RL / ".venv" / "bin" / "rl").exists() or not (PRIME_RL.parent / "INSTALLED").exists():
        return (f"no prime-rl v0.7.0 install at {PRIME_RL} (set AIT_PRIME_RL_DIR, or run: bash "
                "scripts/install_primerl.sh --help)")
    return None


@pytest.fixture(scope="module")
def bundles() -> Iterator[dict[str, Any]]:
    """Every family's reference bundle on Qwen3-0.6B, below a folder every uid may pass."""
    from task_families import reference_files
    from ait_env.jobs.bundle import build_bundle
    from ait_env.jobs.schema import parse_job
    from task_families import FAMILY_NAMES, get_family

    why = _installed()
    if why:
        pytest.skip(why)
    root = Path(tempfile.mkdtemp(prefix="ait-real-primerl-", dir="/tmp"))
    root.chmod(0o755)
    out = {}
    try:
        for family in FAMILY_NAMES:
            ws = root / f"ws-{family}"
            ws.mkdir()
            files = reference_files(family, MODEL)
            for name, text in files.items():
                (ws / name).write_text(text)
            job, issues = parse_job(files["job.toml"])
            assert job is not None, issues
            out[family] = build_bundle(ws, job, get_family(family), root / "jobs", job_id=f"real-{family}")
        for path in [root, *root.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        yield out
    finally:
        shutil.rmtree(root, ignore_errors=True)


#: each jail mode's training uid above $AIT_TRAINING_UID: cases run side by side under -n 2, and a jail kills
#: every process of its uid when it ends (the liveness cases take uids of their own above these: ``case``)
UID_OFFSET = {"bwrap": 0, "user": 1}


def _jail(mode: str, case: int = 0) -> JailConfig:
    """The jail of one test case; ``case`` > 0 gives it a training uid no other case uses."""
    root = os.getuid() == 0
    if mode == "bwrap":
        ok, why = bwrap_works()
        if not ok:
            pytest.skip(f"bubblewrap cannot run here: {why}")
        return JailConfig(mode="bwrap", uid=training_uid() + UID_OFFSET[mode] + 2 * case if root else None)
    if mode == "user":
        if not root:
            pytest.skip("the user jail needs root")
        return JailConfig(mode="user", uid=training_uid() + UID_OFFSET[mode] + 2 * case)
    return JailConfig(mode="none")


@pytest.fixture
def passable_ancestors() -> Iterator[Any]:
    """``open(paths)``: let every uid pass the folders above ``paths`` (``o+x``) until the test ends, then put
    their modes back (an install under a 0700 home, which user mode cannot reach otherwise)."""
    changed: dict[Path, int] = {}

    def open_(paths: list[str]) -> None:
        for p in paths:
            for d in Path(p).resolve().parents:
                mode = d.stat().st_mode & 0o7777
                if not mode & 0o001 and d not in changed:
                    changed[d] = mode
                    d.chmod(mode | 0o001)

    try:
        yield open_
    finally:
        for d, mode in changed.items():
            d.chmod(mode)


@pytest.mark.parametrize("mode", ["bwrap", "user", "none"])
def test_real_primerl_dry_run_and_env_server_in_the_jail(mode: str, bundles: dict[str, Any],
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        record_property: Any, passable_ancestors: Any) -> None:
    from gpu.primerl_executor import PrimeRLExecutor

    cfg = _jail(mode)
    jail = TrainingJail(cfg)
    rl = PRIME_RL / ".venv" / "bin" / "rl"
    python = PRIME_RL / ".venv" / "bin" / "python"
    if mode == "user":   # every folder above the install must let the training uid pass
        passable_ancestors(program_paths(python))
        try:
            jail.prepare([], None, readable=program_paths(python))
        except RuntimeError as exc:
            pytest.skip(f"user mode cannot reach the install: {exc}")
    monkeypatch.setenv(JAIL_ENV, cfg.model_dump_json())
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    settings = BackendSettings(name="gpu", models=[ModelInfo(name=MODEL)], bounds=BackendBounds(),
                               options={"primerl_cmd": [str(rl)], "gpus": [0], "dry_run": True,
                                        "colocated_gpu_memory_utilization": 0.3, "kill_grace_s": 2.0})
    t0 = time.monotonic()
    lines: list[str] = []
    for family, bundle in bundles.items():
        out = bundle.root / "outputs"
        ex = PrimeRLExecutor(bundle, settings, log=lines.append, progress=False)   # runs the dry run
        try:
            assert (out / "configs" / "orchestrator.toml").is_file(), (family, lines[-5:])
            assert f"training jail {mode}" in "\n".join(lines)
        finally:
            ex.close()
    dry_s = time.monotonic() - t0
    # the env servers, as prime-rl's orchestrator starts them, in the same jail
    home = Path(next(iter(bundles.values())).root).parent / f"home-{mode}"
    report = home / "report.json"
    outs = [str(b.root / "outputs") for b in bundles.values()]
    env = {"PYTHONPATH": os.pathsep.join(str(b.root / "src") for b in bundles.values()),
           "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "PATH": f"{python.parent}:/usr/bin:/bin"}
    t1 = time.monotonic()
    proc = jail.popen([str(python), str(PROBE), str(report), *outs], home=home,
                      writable=[str(b.root / "outputs") for b in bundles.values()],
                      readable=[*program_paths(python), str(PROBE.parent),
                                *[str(b.root) for b in bundles.values()]],
                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        log = proc.communicate(timeout=1500)[0].decode(errors="replace")
    finally:
        assert not jail.reap()
    env_s = time.monotonic() - t1
    record_property("dry_run_seconds", round(dry_s, 1))
    record_property("env_server_seconds", round(env_s, 1))
    print(f"\n[{mode}] {len(bundles)} dry runs in {dry_s:.0f} s; {len(bundles)} env servers in {env_s:.0f} s")
    assert report.is_file(), log[-3000:]
    data = json.loads(report.read_text())
    assert data["localhost"] == ["127.0.0.1"] and data["mp_queue"] == "ok", data
    for family, bundle in bundles.items():
        got = data["envs"][str(bundle.root / "outputs")]
        assert got.get("num_tasks", 0) > 0 and got["env_name"] == family, (family, got, log[-2000:])


# ----------------------------------------------------------------------------- issue 48: env server liveness
#: the job's environment, broken four ways; each must end the job job_failed within 120 s of its env
#: server's start, with the cause named (issue 48's table)
BROKEN_ENVS = {
    "raises": ("    dataset = build_dataset(num_examples, seed)\n",
               "    raise RuntimeError('broken at training time')\n", "broken at training time"),
    "os_exit": ("    dataset = build_dataset(num_examples, seed)\n", "    import os\n    os._exit(1)\n",
                "did not become ready"),
    "sys_exit": ("    dataset = build_dataset(num_examples, seed)\n",
                 "    import sys\n    sys.exit('dataset not found')\n", "dataset not found"),
    "sleeps_at_import": ("from __future__ import annotations\n",
                         "from __future__ import annotations\nimport time as _t\n_t.sleep(3600)\n",
                         "did not become ready"),
}
#: stand-ins for the two processes a CPU cannot run, put first on the launcher's PATH (rl.py starts
#: ``inference @ ...`` and ``torchrun ...`` by name): they only wait, so everything else is prime-rl's own
FAKE_PROGRAM = "#!/bin/sh\necho \"fake $(basename $0) (no GPU here): waiting\"\nexec sleep 100000\n"


#: gives the stand-in tokenizer (SmolLM2's) the special tokens prime-rl's Qwen3 renderer looks up, and no unk token
QWEN3_TOKENS_ADDER = (
    "import sys\nfrom transformers import AutoTokenizer\n"
    "tok = AutoTokenizer.from_pretrained(sys.argv[1])\n"
    "need = ['<|im_start|>', '<|im_end|>', '<|endoftext|>', '<tool_call>', '</tool_call>', '<tool_response>',\n"
    "        '</tool_response>', '<think>', '</think>']\n"
    "tok.add_special_tokens({'additional_special_tokens': [t for t in need if t not in tok.get_vocab()]})\n"
    "tok.save_pretrained(sys.argv[1])\n"
    # SmolLM2's unk token is <|endoftext|> (id 0); Qwen3 has none, and the renderer refuses an id equal to unk's
    "import json, pathlib\n"
    "for name in ('special_tokens_map.json', 'tokenizer_config.json'):\n"
    "    p = pathlib.Path(sys.argv[1], name)\n"
    "    if p.is_file():\n"
    "        d = json.loads(p.read_text()); d.pop('unk_token', None); p.write_text(json.dumps(d))\n")
#: what prime-rl's CPU-only install lacks for the orchestrator to import: ``prime_rl/utils/cp.py`` (reached from
#: ``orchestrator.py`` -> ``prime_rl.trainer.model``) imports ``update_ring_flash_attn_params`` from
#: ``ring_flash_attn``, which imports ``flash_attn``'s CUDA kernels. The orchestrator never calls it (context
#: parallelism is the trainer's); the stub raises if anything does. Everything else runs as installed.
RING_FLASH_ATTN_STUB = (
    '"""Import-only stand-in for ring_flash_attn on a CPU (flash_attn is a CUDA build)."""\n\n\n'
    "def update_ring_flash_attn_params(*args, **kwargs):\n"
    "    raise RuntimeError('ring_flash_attn stub: this CPU test has no CUDA kernels')\n")


def _cuda_kernel_stub_needed(venv: Path) -> bool:
    """Whether the orchestrator needs :data:`RING_FLASH_ATTN_STUB` to import (a CPU install), else skip the
    test saying why it cannot import at all."""
    def imports(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(venv / "python"), "-c", "import prime_rl.orchestrator.orchestrator"],
                              capture_output=True, text=True, timeout=300, check=False, env={**os.environ, **env})

    probe = imports({})
    if probe.returncode == 0:      # the GPU image: flash_attn is installed
        return False
    last = (probe.stderr.strip().splitlines() or ["?"])[-1][:200]
    if "flash_attn" not in probe.stderr:   # e.g. torchtitan: install_primerl.sh --git-dep torchtitan=<mirror>
        pytest.skip(f"prime-rl's orchestrator cannot be imported from this install ({last})")
    with tempfile.TemporaryDirectory() as stubs:
        Path(stubs, "ring_flash_attn").mkdir()
        Path(stubs, "ring_flash_attn", "__init__.py").write_text(RING_FLASH_ATTN_STUB)
        again = imports({"PYTHONPATH": stubs})
    if again.returncode != 0:
        pytest.skip("prime-rl's orchestrator cannot be imported even with ring_flash_attn stubbed "
                    f"({(again.stderr.strip().splitlines() or ['?'])[-1][:200]})")
    return True


@pytest.mark.parametrize("mode", ["bwrap", "none"])
@pytest.mark.parametrize("broken", sorted(BROKEN_ENVS))
def test_real_primerl_a_broken_environment_is_job_failed_within_120_s_of_its_start(
        mode: str, broken: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, record_property: Any) -> None:
    """The real launcher, orchestrator and env server (prime-rl v0.7.0 in the jail; inference and torchrun
    replaced by programs that wait): the executor's liveness rule and traceback rule end each broken env's
    job job_failed within 120 s of the env server's start, naming the cause."""
    from task_families import get_family, reference_files

    from ait_env.jobs.bundle import build_bundle
    from ait_env.jobs.failures import JobFailed
    from ait_env.jobs.schema import parse_job
    from gpu.primerl_executor import PrimeRLExecutor

    why = _installed()
    if why:
        pytest.skip(why)
    venv = PRIME_RL / ".venv" / "bin"
    cuda_stub = _cuda_kernel_stub_needed(venv)
    old, new, cause = BROKEN_ENVS[broken]
    root = Path(tempfile.mkdtemp(prefix="ait-live-", dir="/tmp"))
    root.chmod(0o755)
    try:
        fakebin = root / "bin"
        fakebin.mkdir()
        # the launcher as is, but for its model pre-download (rl.py: pre_download_model downloads the weights
        # from the hub): nothing to download here
        (fakebin / "rl").write_text(
            f"#!{venv / 'python'}\nimport sys, types\n"
            "stub = types.ModuleType('prime_rl.trainer.model')\nstub.pre_download_model = lambda name: None\n"
            "sys.modules['prime_rl.trainer.model'] = stub\n"
            "from prime_rl.entrypoints.rl import main\nsys.exit(main())\n")
        # the orchestrator loads the model's tokenizer first (orchestrator.py setup): the hub is out of reach,
        # so a tokenizer the project has (SmolLM2's, a ChatML template) stands in the hub cache for Qwen3-0.6B
        snap = root / "hf" / "models--Qwen--Qwen3-0.6B" / "snapshots" / ("0" * 40)
        snap.mkdir(parents=True)
        (root / "hf" / "models--Qwen--Qwen3-0.6B" / "refs").mkdir()
        (root / "hf" / "models--Qwen--Qwen3-0.6B" / "refs" / "main").write_text("0" * 40)
        from ait_env.agent_models.catalog import model_dir as agent_model_dir

        smol = agent_model_dir("smollm2-135m")
        if not (smol / "tokenizer.json").is_file():
            pytest.skip("needs SmolLM2's tokenizer: python -m ait_env.agent_models.obtain smollm2-135m")
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "config.json"):
            shutil.copy(smol / name, snap / name)
        # prime-rl's Qwen3 renderer (deps/renderers/renderers/qwen3.py, Qwen3Renderer.__init__) asserts Qwen3's
        # special tokens are in the vocabulary: add the ones SmolLM2's lacks, with the install's transformers
        subprocess.run([str(venv / "python"), "-c", QWEN3_TOKENS_ADDER, str(snap)], check=True, timeout=300,
                       capture_output=True)
        for name in ("inference", "torchrun"):
            (fakebin / name).write_text(FAKE_PROGRAM)
        if cuda_stub:
            (fakebin / "cpu-stubs" / "ring_flash_attn").mkdir(parents=True)
            (fakebin / "cpu-stubs" / "ring_flash_attn" / "__init__.py").write_text(RING_FLASH_ATTN_STUB)
        for f in fakebin.iterdir():
            f.chmod(0o755)
        ws = root / "ws"
        ws.mkdir()
        files = reference_files("arithmetic", MODEL)
        assert old in files["environment.py"]
        files["environment.py"] = files["environment.py"].replace(old, new, 1)
        for name, text in files.items():
            (ws / name).write_text(text)
        job, issues = parse_job(files["job.toml"])
        assert job is not None, issues
        bundle = build_bundle(ws, job, get_family("arithmetic"), root / "jobs", job_id=f"live-{broken}")
        for path in [root, *root.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else (path.stat().st_mode & 0o777) | 0o644)
        # the executor's own PYTHONPATH (the bundle's src, PrimeRLExecutor.child_env), then the stub's folder
        python_path = ({"PYTHONPATH": os.pathsep.join([str(bundle.root.resolve() / "src"), str(fakebin / "cpu-stubs")])}
                       if cuda_stub else {})
        cfg = _jail(mode, case=1 + sorted(BROKEN_ENVS).index(broken))   # -n 2: never another case's uid
        monkeypatch.setenv(JAIL_ENV, cfg.model_dump_json())
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        settings = BackendSettings(name="gpu", models=[ModelInfo(name=MODEL)], bounds=BackendBounds(),
                                   options={"primerl_cmd": [str(fakebin / "rl")], "gpus": [0], "dry_run": True,
                                            "colocated_gpu_memory_utilization": 0.3, "kill_grace_s": 2.0,
                                            "readable": [str(fakebin), str(PRIME_RL), *program_paths(venv / "python")], "wall_clock_s": 600.0,
                                            "env": {"PATH": f"{fakebin}:{venv}:/usr/bin:/bin",
                                                    "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(root / "hf"),
                                                    **python_path}})
        lines: list[str] = []
        stamps: list[tuple[float, str]] = []

        def log(text: str) -> None:
            lines.append(text)
            stamps.append((time.monotonic(), text))

        ex = PrimeRLExecutor(bundle, settings, log=log, progress=False)
        try:
            with pytest.raises(JobFailed) as failed:
                ex.train(lambda step: None)
        finally:
            ex.close()
        stopped = next(t for t, text in stamps if text.startswith("stopping prime-rl"))
        env_start = next((t for t, text in stamps if text.startswith("[env train/")), None)
        log_text = "\n".join(lines)
        assert env_start is not None or broken in ("os_exit", "sleeps_at_import"), log_text[-3000:]
        started = env_start or next(t for t, text in stamps if text.startswith("prime-rl: "))
        record_property("seconds_to_verdict", round(stopped - started, 1))
        print(f"\n[{mode}/{broken}] job_failed {stopped - started:.0f} s after the env start: "
              f"{str(failed.value).splitlines()[0][:160]}")
        assert stopped - started <= 120, log_text[-3000:]
        assert cause in str(failed.value), (str(failed.value), log_text[-3000:])
    finally:
        shutil.rmtree(root, ignore_errors=True)
