"""The gpu executor through the runner (``ait_env.runner.run(bundle, BackendSettings(name="gpu"))``) with the
fake prime-rl ``rl`` and fake ``vllm`` (tests/gpu/fakes): each scenario's status and message, result.json,
and no process left behind. Plus the pure parts: GPU placement, the command, the children's environment."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from ait_env import runner
from ait_env.jobs.settings import BackendBounds, BackendSettings
from ait_env.hidden.baselines import BaselineEntry, BaselineStore
from ait_env.hidden.evaluation import evaluate
from ait_env.jobs.primerl import final_weights_dir
from cpu.tiny_models.endpoint import LocalEndpoint
from cpu.tiny_models.model import TinyLM
from cpu.tiny_models.tokenizer import ChatTokenizer
from ait_env.runner import InfraFailed
from gpu.isolation import training_uid
from gpu.gpu_plan import plan_gpus
from gpu.primerl_executor import PrimeRLExecutor, dir_hash, hf_revision
from tests.gpu.gpu_helpers import MODEL, OTHER, leftovers
from tests.helpers import load_scaled

UID = training_uid()   # $AIT_TRAINING_UID: suites running side by side must not share one

pytest_plugins = ("tests.gpu.gpu_fixtures",)

pytest.importorskip("verifiers")


def _run(bundle: Any, settings: BackendSettings, baselines_dir: Path | None = None) -> runner.JobResult:
    res = runner.run(bundle.root, settings, progress=False, baselines_dir=baselines_dir)
    assert leftovers(settings.options["env"]["FAKE_RUN_ID"]) == set(), "processes left behind"
    on_disk = json.loads((bundle.root / "result.json").read_text())
    assert on_disk["status"] == res.status and on_disk["error"] == res.error and on_disk["backend"] == "gpu"
    return res


def _launches(settings: BackendSettings) -> list[dict[str, Any]]:
    path = Path(settings.options["env"]["FAKE_VLLM_RECORD"])
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def pinned(tmp_path: Path, micro_dirs: dict[str, str]) -> Path:
    """A user baseline store in which the job's model holds (no pre-eval: failure tests stay short)."""
    store = BaselineStore("gpu", user_dir=tmp_path / "pins")
    store.put([BaselineEntry(backend="gpu", family="arithmetic", model=MODEL, score=0.1,
                             model_hash=dir_hash(Path(micro_dirs[MODEL])))])
    return tmp_path / "pins"


# ----------------------------------------------------------------------------- success

def test_a_job_trains_and_the_trained_weights_are_scored(gpu_bundle: Any, gpu_settings: Any,
                                                        micro_dirs: dict[str, str]) -> None:
    bundle = gpu_bundle()
    settings = gpu_settings("success", models=(MODEL, OTHER))
    res = _run(bundle, settings)
    assert res.status == "succeeded", res.error + res.log_tail
    weights = final_weights_dir(bundle.job, bundle.root / "outputs")
    assert weights == bundle.root / "outputs" / "weights" / "step_3" and (weights / "STABLE").is_file()
    # base, the other model's base (measure_base), then the trained folder: one vLLM at a time
    launches = _launches(settings)
    assert [x["argv"][1] for x in launches] == [micro_dirs[MODEL], micro_dirs[OTHER], str(weights)]
    assert [x["argv"][x["argv"].index("--served-model-name") + 1] for x in launches] == [MODEL, OTHER, MODEL]
    assert all(x["env"]["CUDA_VISIBLE_DEVICES"] == "0" for x in launches)
    # the post eval scored exactly those weights (greedy: the same score served in-process)
    with LocalEndpoint(TinyLM.load(weights), ChatTokenizer.load(weights), MODEL) as ep:
        direct = evaluate("arithmetic", base_url=ep.base_url, model=MODEL, limit=8, max_tokens=48,
                          concurrency=8)
    assert res.post_score == direct.score
    assert set(res.baselines) == {MODEL, OTHER}
    c = res.curves
    assert c["train_reward"] == pytest.approx([0.3, 0.4, 0.5])
    assert c["loss"] == pytest.approx([0.01, 0.02, 0.03])
    assert c["eval_step"] == [0.0, 3.0] and len(c["eval_score"]) == 2
    assert {"entropy", "grad_norm", "lr", "step_seconds", "rollout_error_rate"} <= set(c)
    assert res.timings["on_gpu"] == 1.0 and res.timings["colocated"] == 1.0 and res.train_seconds > 0
    # prime-rl's log streamed into the job's log, each step line once (not the launcher's copy of it)
    log = (bundle.root / "job.log").read_text()
    assert log.count("[prime-rl orchestrator]") >= 3 and "Reward 0.4000" in log
    assert sum("SUCCESS Step 2 | " in line and "Reward" in line for line in log.splitlines()) == 1
    assert "[prime-rl trainer] [trainer0]:" in log and "Training finished!" in res.log_tail
    # one GPU: both prime-rl children on it, filesystem broadcast, vLLM's share lowered (else the fake
    # refuses, as NCCL and vLLM would)
    assert "CUDA_VISIBLE_DEVICES=0,0" in log and "--weight-broadcast.type filesystem" in log
    assert (bundle.root / "outputs" / "configs" / "orchestrator.toml").is_file()  # the dry run's


def test_two_gpus_and_no_hidden_question_reaches_the_policy_server(gpu_bundle: Any, gpu_settings: Any,
                                                                    pinned: Path) -> None:
    """Two GPUs: inference on the first, trainer on the second, no colocation flags. Eval points asked for
    are not run: the policy server is in the training jail, so no hidden question may reach it."""
    bundle = gpu_bundle()
    settings = gpu_settings("success", gpus=[3, 5], eval_every=1, measure_pre=False,
                            env={"FAKE_INFERENCE_SERVE": "1", "FAKE_STEP_SECONDS": "1"})
    res = _run(bundle, settings, baselines_dir=pinned)
    assert res.status == "succeeded", res.error + res.log_tail
    log = (bundle.root / "job.log").read_text()
    # the filesystem weight broadcast on two GPUs too (issue 31, item 4: v0.7.0's CI turns NCCL off)
    assert "CUDA_VISIBLE_DEVICES=3,5" in log and "--weight-broadcast.type filesystem" in log
    assert "inference on GPU 3, trainer on GPU(s) 5" in log
    assert "no eval points during training" in log
    assert res.curves["eval_step"] == [0.0, 3.0] and len(res.curves["eval_score"]) == 2
    assert len(res.curves["train_reward"]) == 3     # prime-rl's own per-step curve
    # the eval vLLM on the inference GPU: the base model, then the trained one
    assert [x["env"]["CUDA_VISIBLE_DEVICES"] for x in _launches(settings)] == ["3", "3"]
    assert res.baselines[MODEL] == 0.1 and res.timings["colocated"] == 0.0


# ----------------------------------------------------------------------------- the job's own failures

def test_an_environment_that_raises_in_load_environment_is_job_failed(gpu_bundle: Any, gpu_settings: Any,
                                                                      pinned: Path) -> None:
    bundle = gpu_bundle(lambda t: t.replace("    dataset = build_dataset(num_examples, seed)\n",
                                            "    raise RuntimeError('broken at training time')\n"))
    res = _run(bundle, gpu_settings("success", measure_pre=False), pinned)
    assert res.status == "job_failed", res.error + res.log_tail
    assert res.error.startswith("your environment failed to load under prime-rl (load_environment raised)")
    assert "broken at training time" in res.error and "Traceback" in res.error


@pytest.mark.parametrize("scenario,message", [
    ("nan_loss", "training diverged at step 2 (loss = nan; prime-rl has no guard against it)"),
    ("nan_reward", "the mean reward was nan at training step 2: your rubric returned NaN or infinity"),
    ("oom", "the trainer ran out of GPU memory (CUDA out of memory) after 1 of 3 steps: seq_len = "),
    # slow: the fake orchestrator's env server keeps it alive after its error, so the run ends only at the
    # executor's limit (303 s of the default suite's 1,777 s, 2026-12-02); the message's classification is
    # checked in seconds by tests/gpu/test_gpu_primerl_logs.py
    pytest.param("empty_batches", "prime-rl stopped after 10 consecutive empty train batches: in every group of 4",
                 marks=pytest.mark.slow),
])
def test_the_jobs_own_failures(scenario: str, message: str, gpu_bundle: Any, gpu_settings: Any,
                               pinned: Path) -> None:
    """On two GPUs (the trainer has one of its own: an OOM there is the job's)."""
    bundle = gpu_bundle()
    res = _run(bundle, gpu_settings(scenario, measure_pre=False, gpus=[0, 1]), pinned)
    assert res.status == "job_failed", res.error + res.log_tail
    assert message in res.error
    assert res.post_score is None and not (bundle.root / "outputs" / "weights" / "step_3" / "STABLE").exists()


def test_a_job_too_slow_for_its_wall_clock_is_stopped(gpu_bundle: Any, gpu_settings: Any,
                                                       pinned: Path) -> None:
    """The trainer stops after step 1 and ignores SIGTERM, in its own session (as torch elastic starts
    ranks): the run is stopped at the limit and nothing of it survives. The limit grows with the machine's
    load (step 1 must come before it: on a busy machine the fake's start alone took 12 s, issue 46)."""
    bundle = gpu_bundle()
    wall = load_scaled(12.0)
    res = _run(bundle, gpu_settings("hang", measure_pre=False, wall_clock_s=wall, gpus=[0, 1]), pinned)
    assert res.status == "job_failed", res.error + res.log_tail
    assert res.error.startswith(f"the job ran past its wall-clock limit of {wall / 60:g} min "
                                "(bounds.wall_clock_minutes) after 1 of 3 training steps")


def test_a_job_within_the_bounds_too_slow_in_shared_mode_is_ours(gpu_bundle: Any, gpu_settings: Any,
                                                                 pinned: Path) -> None:
    """Issue 48, item 3: on one shared GPU vLLM samples from a small fixed KV cache; a job within the
    backend's bounds that runs past the wall clock there is infra_failed, never told to shrink."""
    wall = load_scaled(12.0)
    res = _run(gpu_bundle(), gpu_settings("hang", measure_pre=False, wall_clock_s=wall, gpus=[0]), pinned)
    assert res.status == "infra_failed", res.error + res.log_tail
    assert "in shared mode" in res.error and "give the worker a second GPU" in res.error


# ----------------------------------------------------------------------------- ours

def test_no_step_within_the_wall_clock_and_no_job_fault_is_ours(gpu_bundle: Any, gpu_settings: Any,
                                                                pinned: Path) -> None:
    """The policy server never gets ready (a vLLM start-up, a model download...): nothing blames the job."""
    res = _run(gpu_bundle(), gpu_settings("stall", measure_pre=False, wall_clock_s=6.0), pinned)
    assert res.status == "infra_failed", res.error + res.log_tail
    assert res.error.startswith("prime-rl made no training step within the wall-clock limit of 0.1 min")


def test_a_killed_launcher_is_infra_failed(gpu_bundle: Any, gpu_settings: Any, pinned: Path) -> None:
    res = _run(gpu_bundle(), gpu_settings("killed", measure_pre=False), pinned)
    assert res.status == "infra_failed" and "killed by SIGKILL" in res.error, res.error + res.log_tail


def test_a_config_prime_rl_refuses_fails_its_dry_run_before_any_vllm(gpu_bundle: Any,
                                                                     gpu_settings: Any) -> None:
    settings = gpu_settings("bad_config")
    res = _run(gpu_bundle(), settings)
    assert res.status == "infra_failed" and "--dry-run exited with code 1" in res.error
    assert "ait_env/jobs/primerl.py" in res.error and "Config file error" in res.error
    assert _launches(settings) == []


def test_a_colocated_vllm_share_too_large_is_ours(gpu_bundle: Any, gpu_settings: Any, pinned: Path) -> None:
    """The inference process failing (here: vLLM's free-memory check) says nothing about the job."""
    res = _run(gpu_bundle(), gpu_settings(measure_pre=False, colocated_gpu_memory_utilization=0.6), pinned)
    assert res.status == "infra_failed" and "prime-rl exited with code 1" in res.error
    assert "Inference failed with exit code 1" in res.error


def test_prime_rl_not_installed(gpu_bundle: Any, gpu_settings: Any) -> None:
    res = _run(gpu_bundle(), gpu_settings(primerl_cmd=["/nonexistent/bin/rl"]))
    assert res.status == "infra_failed" and "backend.options.primerl_cmd" in res.error


# ----------------------------------------------------------------------------- pure parts

def test_gpu_placement() -> None:
    two = plan_gpus([0, 1], 1, 1, 0.3)
    assert (two.visible, two.eval_gpu, two.colocated) == ("0,1", 0, False)
    assert two.flags == ["--weight-broadcast.type", "filesystem"]   # issue 31, item 4
    assert plan_gpus([2, 4, 6], 1, 1, 0.3).visible == "2,4"
    one = plan_gpus([7], 1, 1, 0.3)
    assert (one.visible, one.eval_gpu, one.colocated) == ("7,7", 7, True)
    assert one.flags == ["--weight-broadcast.type", "filesystem", "--inference.gpu-memory-utilization", "0.3"]
    assert plan_gpus([0, 1, 2], 1, 2, 0.3).visible == "0,1,2"
    with pytest.raises(InfraFailed, match=r"asks for 3 GPUs \(1 inference \+ 2 trainer\) but this worker"):
        plan_gpus([0, 1], 1, 2, 0.3)
    with pytest.raises(InfraFailed, match="no GPU is visible"):
        plan_gpus([], 1, 1, 0.3)


def test_command_and_scrubbed_environment(gpu_bundle: Any, gpu_settings: Any,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("AIT_SECRETS_FILE", "/secret/seeds.json")
    monkeypatch.setenv("HF_HOME", "/cache/hf")
    bundle = gpu_bundle()
    settings = gpu_settings(dry_run=False, primerl_cmd=["/opt/prime-rl/.venv/bin/rl"], gpus=[0, 1],
                            policy_port=None)
    ex = PrimeRLExecutor(bundle, settings, log=lambda _: None, progress=False)
    root = bundle.root.resolve()
    assert ex.primerl_command() == ["/opt/prime-rl/.venv/bin/rl", "@", str(root / "rl.toml"),
                                    "--output-dir", str(root / "outputs"), "--weight-broadcast.type",
                                    "filesystem", "--inference.model.max-model-len",
                                    str(bundle.job.prime_rl.seq_len)]
    env = ex.child_env(CUDA_VISIBLE_DEVICES="0,1")
    readable, writable = ex.jail_paths(env)    # what the training jail may read and write
    assert {str(root), "/opt/prime-rl/.venv", "/cache/hf"} <= set(readable)
    assert writable == [str(root / "outputs")]
    assert "OPENAI_API_KEY" not in env and "AIT_SECRETS_FILE" not in env
    assert env["HF_HOME"] == "/cache/hf" and env["PYTHONPATH"] == str(root / "src")
    assert env["WANDB_MODE"] == "disabled" and env["CUDA_VISIBLE_DEVICES"] == "0,1"
    # the launcher starts its children by name
    assert env["PATH"].split(os.pathsep)[0] == "/opt/prime-rl/.venv/bin"
    assert env["FAKE_PRIMERL_SCENARIO"] == "success"  # options.env
    with pytest.raises(InfraFailed, match="serve_trained before a successful train"):
        ex.serve_trained()
    ex.close()


def test_weights_identity(tmp_path: Path, micro_dirs: dict[str, str]) -> None:
    assert dir_hash(Path(micro_dirs[MODEL])) == dir_hash(Path(micro_dirs[OTHER]))  # same bytes, same hash
    ref = tmp_path / "hub" / "models--Qwen--Qwen3-1.7B" / "refs" / "main"
    ref.parent.mkdir(parents=True)
    ref.write_text("abc123\n")
    assert hf_revision("Qwen/Qwen3-1.7B", {"HF_HUB_CACHE": str(tmp_path / "hub")}) == "hf:abc123"
    assert hf_revision("Qwen/Qwen3-1.7B", {"HF_HOME": str(tmp_path)}) == "hf:abc123"
    assert hf_revision("Qwen/Qwen3-0.6B", {"HF_HOME": str(tmp_path)}) == ""


def test_wall_clock_comes_from_the_bounds(gpu_bundle: Any, gpu_settings: Any) -> None:
    settings = gpu_settings(dry_run=False)
    settings.bounds = BackendBounds(wall_clock_minutes=7)
    assert settings.options.get("wall_clock_s") is None
    ex = PrimeRLExecutor(gpu_bundle(), settings, log=lambda _: None, progress=False)
    assert (ex.opts.wall_clock_s or ex.backend.bounds.wall_clock_minutes * 60.0) == 420.0
    ex.close()


# ----------------------------------------------------------------------------- the training jail

HOSTILE_ENV = '''

def _attack(secret, port):
    import json, os, socket, time
    report = {"uid": os.getuid(), "credentials": sorted(k for k in os.environ if "TOKEN" in k or "KEY" in k)}
    try:
        report["secret"] = open(secret).read()
    except OSError as exc:
        report["secret"] = type(exc).__name__
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        report["socket"] = "connected"
    except OSError as exc:
        report["socket"] = type(exc).__name__
    with open(os.path.join(os.environ["HOME"], "attack.json"), "w") as f:
        json.dump(report, f)
    pid = os.fork()
    if pid == 0:   # a daemon: its own session, orphaned
        os.setsid()
        if os.fork() == 0:
            time.sleep(600)
        os._exit(0)
    os.waitpid(pid, 0)


_attack(SECRET, PORT)
'''


@pytest.mark.skipif(os.getuid() != 0, reason="the jail's own uid needs root")
def test_the_training_tree_runs_in_the_bwrap_jail(gpu_bundle: Any, gpu_settings: Any, pinned: Path,
                                                  tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """prime-rl starts in the worker's jail: the agent's environment module (imported by the orchestrator's
    env server) runs as the jail's uid, cannot read a root-only secret or reach a socket on the host, gets
    no credentials, and its daemon does not outlive the run; the job still trains and is scored."""
    import socket

    from gpu.isolation import JAIL_ENV, JailConfig, bwrap_works

    if not bwrap_works()[0]:
        pytest.skip("bubblewrap cannot run here")
    secret = tmp_path / "private" / "seeds.json"
    secret.parent.mkdir(mode=0o700)
    secret.write_text('{"arithmetic": 27182818}')
    secret.chmod(0o600)
    listener = socket.create_server(("127.0.0.1", 0))
    monkeypatch.setenv("HF_TOKEN", "hf_not_for_the_job")
    bundle = gpu_bundle(lambda t: t + HOSTILE_ENV.replace("SECRET", repr(str(secret)))
                        .replace("PORT", str(listener.getsockname()[1])))
    # nothing of this checkout is named readable: the fake rl is an editable install in a venv of its own
    # (gpu_fixtures.fake_primerl), which the jail must resolve itself (issue 31, item 1); its launcher
    # resolves localhost and its orchestrator reports over a multiprocessing queue (items 2 and 3)
    settings = gpu_settings("success", measure_pre=False, wall_clock_s=120)
    monkeypatch.setenv(JAIL_ENV, JailConfig(mode="bwrap", uid=UID).model_dump_json())
    try:
        res = _run(bundle, settings, baselines_dir=pinned)   # _run: no process of the run is left
    finally:
        listener.close()
    assert res.status == "succeeded", res.error + res.log_tail
    assert f"training jail bwrap (uid {UID})" in (bundle.root / "job.log").read_text()
    report = json.loads((bundle.root / "home" / "attack.json").read_text())
    assert report == {"uid": UID, "credentials": [], "secret": "FileNotFoundError",
                      "socket": "ConnectionRefusedError"}, report
    assert res.post_score is not None


@pytest.mark.skipif(os.getuid() != 0, reason="the jail's own uid needs root")
def test_a_job_folder_the_jails_uid_cannot_reach_is_infra_failed(gpu_bundle: Any, gpu_settings: Any,
                                                                 pinned: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu.isolation import JAIL_ENV, JailConfig

    bundle = gpu_bundle()
    settings = gpu_settings("success", measure_pre=False, dry_run=False)
    monkeypatch.setenv(JAIL_ENV, JailConfig(mode="user", uid=UID).model_dump_json())
    tmp_path.chmod(0o700)
    res = _run(bundle, settings, baselines_dir=pinned)
    assert res.status == "infra_failed"
    assert "the training jail cannot be set up" in res.error and "chmod o+x" in res.error


# ----------------------------------------------------------------------------- issue 31

def _stamp(log: str, needle: str) -> int:
    """Seconds of day of the first job.log line holding ``needle`` (lines start ``[HH:MM:SS]``)."""
    line = next(x for x in log.splitlines() if needle in x)
    h, m, sec = (int(v) for v in line[1:9].split(":"))
    return h * 3600 + m * 60 + sec


@pytest.mark.parametrize("edit,expected", [
    # load_environment raises (verifiers: "Failed to load environment ...")
    (lambda t: t.replace("    dataset = build_dataset(num_examples, seed)\n",
                         "    raise ValueError('agent bug: no dataset today')\n"),
     ("failed to load under prime-rl (load_environment raised)", "agent bug: no dataset today")),
    # the module's own import fails: verifiers turns any ImportError into "Could not import"
    (lambda t: t.replace("from __future__ import annotations\n", "from __future__ import annotations\n"
                         "import ait_no_such_dependency_31  # an import prime-rl's venv lacks\n", 1),
     ("failed to import under prime-rl", "No module named 'ait_no_such_dependency_31'")),
], ids=["load_raises", "import_fails"])
def test_an_environment_that_fails_to_start_is_job_failed_within_seconds(
        edit: Any, expected: tuple[str, str], gpu_bundle: Any, gpu_settings: Any, pinned: Path) -> None:
    """Issue 31, item 5: the orchestrator waits for a dead env server without end; the run is stopped within
    30 s of the dry run, job_failed, with the agent's traceback (what the agent reads: redacted)."""
    from ait_env.hidden.redact import for_agent

    bundle = gpu_bundle(edit)
    res = _run(bundle, gpu_settings("success", measure_pre=False, wall_clock_s=90.0), pinned)
    assert res.status == "job_failed", res.error + res.log_tail
    assert res.error.startswith(f"your environment {expected[0]}") and expected[1] in res.error
    assert "Traceback (most recent call last)" in res.error
    log = (bundle.root / "job.log").read_text()
    assert _stamp(log, "stopping prime-rl") - _stamp(log, "prime-rl dry run passed") <= 30
    seen = for_agent(res.error)
    assert expected[1] in seen and "environment.py" in seen and str(bundle.root) not in seen


def test_a_missing_job_package_is_ours(gpu_bundle: Any, gpu_settings: Any, pinned: Path) -> None:
    """The job's own package not importable where prime-rl runs (PYTHONPATH, the jail's binds) is ours."""
    bundle = gpu_bundle()
    pkg = next(p for p in (bundle.root / "src").iterdir() if p.is_dir())
    settings = gpu_settings("success", measure_pre=False, dry_run=False, wall_clock_s=90.0,
                            env={"PYTHONPATH": str(bundle.root / "elsewhere")})   # as a wrong bind would
    res = _run(bundle, settings, pinned)
    assert res.status == "infra_failed", res.error + res.log_tail
    assert "prime-rl's env server failed on our side before training started" in res.error
    assert f"No module named '{pkg.name}'" in res.error


def test_an_oom_in_shared_mode_within_the_bounds_is_ours(gpu_bundle: Any, gpu_settings: Any,
                                                         pinned: Path) -> None:
    """Issue 31, item 8: one GPU shared with vLLM; a job within the backend's bounds that runs out of memory
    was given too little by us, and the message says which share was in force."""
    res = _run(gpu_bundle(), gpu_settings("oom", measure_pre=False, colocated_gpu_memory_utilization=0.3),
               pinned)
    assert res.status == "infra_failed", res.error + res.log_tail
    assert res.error.startswith("the trainer ran out of GPU memory after 1 of 3 steps in shared mode: vLLM "
                                "held 0.3 of GPU 0's memory")
    assert "is within this backend's bounds" in res.error


def test_max_model_len_and_the_shared_gpu_share(gpu_bundle: Any, gpu_settings: Any,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 31, item 6: the policy server's max_model_len is the job's seq_len, and vLLM's share of a
    shared GPU follows gpu.gpu_share's rule (model size x GPU memory) unless the option fixes it."""
    import gpu.primerl_executor as pe
    from gpu.gpu_share import colocated_share, vllm_need_gib

    bundle = gpu_bundle()
    seq_len = bundle.job.prime_rl.seq_len
    monkeypatch.setattr(pe, "gpu_memory_gib", lambda index: 24.0)
    ex = PrimeRLExecutor(bundle, gpu_settings(dry_run=False), log=lambda _: None, progress=False)
    cmd = ex.primerl_command()
    assert cmd[cmd.index("--inference.model.max-model-len") + 1] == str(seq_len)
    rule = colocated_share(MODEL, seq_len, 24.0)
    assert ex.plan.share == rule and cmd[cmd.index("--inference.gpu-memory-utilization") + 1] == f"{rule:g}"
    ex.close()
    # the rule: weights + 8 full-length sequences of KV cache + 2 GiB, over the GPU, within [0.1, 0.5]
    assert vllm_need_gib("Qwen/Qwen3-1.7B", 4096) == pytest.approx(1.7e9 * 2 / 2**30 + 8 * 4096 * 114688 / 2**30
                                                                 + 2.0)
    assert colocated_share("Qwen/Qwen3-1.7B", 4096, 24.0) == 0.37
    assert colocated_share("Qwen/Qwen3-0.6B", 2048, 80.0) == 0.1
    assert colocated_share("Qwen/Qwen3-1.7B", 40960, 24.0) == 0.5
    assert colocated_share("some/other-model", 2048, 24.0) is None
    monkeypatch.setattr(pe, "gpu_memory_gib", lambda index: None)   # unknown GPU: the stated fallback
    ex = PrimeRLExecutor(bundle, gpu_settings(dry_run=False), log=lambda _: None, progress=False)
    assert ex.plan.share == pe.COLOCATED_FALLBACK
    ex.close()


# ----------------------------------------------------------------------------- issue 48: env liveness
#: the liveness bound of each case: 6 s where the verdict's text does not depend on what the env server wrote by
#: then; 30 s where it must hold the server's last words (a spawned child importing verifiers took over 6 s on
#: a loaded 2-core machine, CI of 2026-12-05), so no verdict rests on a margin of seconds
@pytest.mark.parametrize("edit,expected,bound", [
    (lambda t: t.replace("    dataset = build_dataset(num_examples, seed)\n",
                         "    import os\n    os._exit(1)\n"), "(its log is empty)|exited", 6),
    (lambda t: t.replace("    dataset = build_dataset(num_examples, seed)\n",
                         "    import sys\n    sys.exit('dataset not found')\n"), "dataset not found", 30),
    (lambda t: t.replace("from __future__ import annotations\n", "from __future__ import annotations\n"
                         "import time as _t\n_t.sleep(3600)  # slow work at import\n", 1), "still importing", 6),
], ids=["os_exit", "sys_exit", "hangs_at_import"])
def test_an_env_server_that_dies_or_hangs_without_a_traceback_is_job_failed_at_the_liveness_bound(
        edit: Any, expected: str, bound: int, gpu_bundle: Any, gpu_settings: Any, pinned: Path) -> None:
    """Issue 48: multiprocessing prints no traceback for SystemExit, os._exit leaves nothing, a hang at import
    says nothing; prime-rl would wait 600 s, then without end. No ``Env <name> ready`` from the orchestrator
    within env_ready_timeout_s of the env log's start ends the job job_failed with the log's end."""
    import re

    bundle = gpu_bundle(edit)
    res = _run(bundle, gpu_settings("success", measure_pre=False, wall_clock_s=120.0,
                                    env_ready_timeout_s=float(bound)), pinned)
    assert res.status == "job_failed", res.error + res.log_tail
    assert res.error.startswith(f"your environment's server did not become ready within {bound} s of its start")
    assert re.search(expected, res.error), res.error
    log = (bundle.root / "job.log").read_text()
    assert _stamp(log, "stopping prime-rl") - _stamp(log, "prime-rl dry run passed") <= 60 + bound


def test_a_rollout_error_after_the_env_is_ready_does_not_stop_the_run(gpu_bundle: Any, gpu_settings: Any,
                                                                      pinned: Path) -> None:
    """Issue 48 item 4: prime-rl tolerates failed rollouts; a traceback in an env server's log after the
    orchestrator reported it ready (before the first trainer step) is a rollout's, not a load failure."""
    bundle = gpu_bundle()
    res = _run(bundle, gpu_settings("rollout_error", measure_pre=False, env={"FAKE_STEP_SECONDS": "1"}), pinned)
    assert res.status == "succeeded", res.error + res.log_tail
    log = (bundle.root / "job.log").read_text()
    assert "ZeroDivisionError: division by zero" in log and "stopping prime-rl" not in log
