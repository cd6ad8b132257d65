"""The worker end to end with the local tiny-model executor: bundle in, result.json out, and hostile
environment modules contained (the secret seed, the hidden set, the network, the eval's files, a daemon)."""

from __future__ import annotations

import json
import re
import shutil
import threading
import time

import pytest

from gpu.isolation import bwrap_works
from tests.gpu.helpers import (
    CANARY,
    FAKE_KEY,
    ROOT,
    Listener,
    local_settings,
    make_job,
    needs_tiny_model,
    path_without_bwrap,
    pids_with,
    run_worker,
    worker_env,
)

pytest.importorskip("verifiers")
pytestmark = needs_tiny_model

@pytest.fixture
def wenv(tmp_path):
    """:func:`tests.gpu.helpers.worker_env`, its short TMPDIR removed afterwards."""
    env = worker_env(tmp_path)
    yield env
    shutil.rmtree(env["TMPDIR"], ignore_errors=True)


LOAD = "def load_environment(num_examples: int = 4000, seed: int = 12345, **kwargs) -> vf.Environment:\n"

#: tried inside load_environment, i.e. where prime-rl's orchestrator imports the agent's module; every
#: outcome goes into the error of a job that then fails on purpose
ATTACKS = '''    import glob, json, os, socket
    report = {}

    def attempt(name, fn):
        try:
            report[name] = "LEAKED: " + repr(fn())[:300]
        except BaseException as exc:
            report[name] = "blocked: " + type(exc).__name__

    attempt("env_secret_seed_file", lambda: os.environ["AIT_SECRETS_FILE"])
    attempt("env_credentials", lambda: [k for k in os.environ if "KEY" in k or "TOKEN" in k] or 1 / 0)
    attempt("read_secret_seed_file", lambda: open(%(secrets)r).read())
    attempt("read_worker_copy", lambda: [open(p).read() for p in glob.glob(%(copies)r)] or 1 / 0)
    attempt("list_worker_tmp", lambda: os.listdir(%(wtmp)r))
    attempt("hidden_set", lambda: __import__("ait_env.hidden.secrets").secrets.hidden_questions("arithmetic")[:2])
    attempt("other_processes_env", lambda: [p for p in os.listdir("/proc") if p.isdigit() and
                                           "AIT_SECRETS" in open("/proc/%%s/environ" %% p).read()] or 1 / 0)
    attempt("connect_loopback_listener", lambda: socket.create_connection(("127.0.0.1", %(port)d), timeout=2))
    attempt("connect_outside", lambda: socket.create_connection(("10.255.255.1", 80), timeout=2))
    attempt("tamper_bundle_manifest", lambda: open(%(manifest)r, "a").write(" "))
    attempt("tamper_family_checker", lambda: open(%(family)r, "a").write("# tampered"))
    raise RuntimeError("ATTACK REPORT " + json.dumps(report))
'''

#: a daemon that outlives load_environment (double fork, new session) and keeps trying, through training and
#: the post eval, to read the secret seeds and the eval's records and to get them out (a file the test can
#: see, the listener)
DAEMON = '''    import os, sys
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            code = ("import glob, socket, time\\n"
                    "while True:\\n"
                    "    for path in [%(secrets)r, *glob.glob(%(records)r), *glob.glob(%(copies)r)]:\\n"
                    "        try:\\n"
                    "            data = open(path).read()\\n"
                    "            open(%(leak)r, 'a').write(data)\\n"
                    "        except OSError:\\n            pass\\n"
                    "    try:\\n        socket.create_connection(('127.0.0.1', %(port)d), timeout=1)\\n"
                    "    except OSError:\\n        pass\\n"
                    "    time.sleep(0.1)  # %(marker)s\\n")
            os.execv(sys.executable, [sys.executable, "-c", code])
        os._exit(0)
    os.wait()
'''


def _hostile(template: str, **values: object):
    return lambda text: text.replace(LOAD, LOAD + template % values)


def test_worker_runs_a_job_and_reports_itself(tmp_path, wenv):
    env = wenv
    b = make_job(tmp_path)
    (tmp_path / "s.json").write_text(local_settings().model_dump_json())
    out = run_worker([str(b.root), "--backend", "local", "--settings", str(tmp_path / "s.json")], env)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads((b.root / "result.json").read_text())
    assert res["status"] == "succeeded" and 0.0 <= res["post_score"] <= 1.0
    w = res["worker"]
    assert w["selfcheck"] == "ok" and w["executor"] == "local" and w["versions"]["ai-trains-ai"]
    assert w["image_revision"] == "unknown" and "sandbox" in w["isolation"]["agent_code_runs_in"]
    assert w["training_tree"]["after training, before the post eval"]["survivors"] == []
    log = res["log_tail"]
    assert log.index("training tree: ") < log.index("post-eval")   # the guard ran before the post eval
    assert json.loads(out.stdout.strip().splitlines()[-1])["status"] == "succeeded"

    # the same job through the runner as backend=local runs it: the same result.json, field for field
    import subprocess
    import sys

    twin = make_job(tmp_path, job_id="job-2")
    direct = subprocess.run([sys.executable, "-m", "ait_env.runner", str(twin.root), "--backend-settings",
                             str(tmp_path / "s.json"), "--no-progress"], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=300, check=False)
    assert direct.returncode == 0, direct.stderr[-3000:]
    ref = json.loads((twin.root / "result.json").read_text())
    assert set(ref) == set(res) and ref["worker"] == {}
    for key in ("status", "backend", "post_score", "post_ci95", "baselines", "error"):
        assert res[key] == ref[key], key
    assert set(res["curves"]) == set(ref["curves"])   # timings and float noise (grad_norm) aside:
    for curve in ("train_reward", "eval_step", "eval_score"):   # a mean's last bit depends on the order
        assert res["curves"][curve] == pytest.approx(ref["curves"][curve], rel=1e-12, abs=1e-15), curve


@pytest.mark.parametrize("sandbox", ["bwrap", "fallback"])
def test_hostile_environment_module_is_contained(tmp_path, wenv, sandbox):
    env = wenv
    if sandbox == "bwrap" and not bwrap_works()[0]:
        pytest.skip("bubblewrap cannot run here")
    if sandbox == "fallback":   # the same worker where bubblewrap is not installed
        env = {**env, "PATH": path_without_bwrap(tmp_path / "bin")}
    family_file = ROOT / "task_families" / "arithmetic" / "family.py"
    before = family_file.read_bytes()
    listener = Listener()
    try:
        jobs = tmp_path / "jobs" / "hostile-a"
        b = make_job(tmp_path, "hostile-a", _hostile(
            ATTACKS, secrets=env["AIT_SECRETS_FILE"], copies=f"{env['TMPDIR']}/ait-worker-*/secrets.json",
            wtmp=env["TMPDIR"], port=listener.port, manifest=str(jobs / "manifest.json"),
            family=str(family_file)))
        manifest = (b.root / "manifest.json").read_bytes()
        (tmp_path / "s.json").write_text(local_settings().model_dump_json())
        out = run_worker([str(b.root), "--backend", "local", "--settings", str(tmp_path / "s.json")], env)
    finally:
        listener.close()
    res = json.loads((b.root / "result.json").read_text())
    assert res["status"] == "job_failed", res["error"]
    report = json.loads(re.search(r"ATTACK REPORT (\{.*?\})", res["error"]).group(1))
    assert len(report) == 11, report
    # how it was refused says which sandbox ran: absent from its filesystem, or refused by its audit hook
    assert report["read_secret_seed_file"] == ("blocked: FileNotFoundError" if sandbox == "bwrap"
                                               else "blocked: PermissionError")
    if sandbox == "fallback":
        # without bubblewrap the sandbox's audit hook refuses opening files, not listing folders: the
        # names of the worker's private folders show, never their content
        report.pop("list_worker_tmp")
    assert all(v.startswith("blocked") for v in report.values()), report
    assert listener.accepted == 0
    assert (b.root / "manifest.json").read_bytes() == manifest and family_file.read_bytes() == before
    # nothing secret in what leaves the worker: the result, the job's log, the worker's own output
    texts = [(b.root / "result.json").read_text(), (b.root / "job.log").read_text(), out.stdout, out.stderr]
    for secret in [str(CANARY), FAKE_KEY]:
        assert not any(secret in t for t in texts), secret


@pytest.mark.skipif(not bwrap_works()[0], reason="without bubblewrap the sandbox refuses os.fork outright "
                                                   "(docs/security.md), so no daemon can start")
def test_daemon_left_by_the_environment_is_gone_before_the_post_eval(tmp_path, wenv):
    env = wenv
    marker = f"ait-hostile-daemon-{time.time_ns()}"
    listener = Listener()
    seen: list[float] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            if pids_with(marker):
                seen.append(time.time())
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        attack = _hostile(DAEMON, port=listener.port, secrets=env["AIT_SECRETS_FILE"], marker=marker,
                          records=f"{env['TMPDIR']}/ait-worker-*/tmp/ait-eval-*/records.jsonl",
                          copies=f"{env['TMPDIR']}/ait-worker-*/secrets.json", leak=str(tmp_path / "leaked"))
        b = make_job(tmp_path, "hostile-b", attack)
        (tmp_path / "s.json").write_text(local_settings().model_dump_json())
        out = run_worker([str(b.root), "--backend", "local", "--settings", str(tmp_path / "s.json")], env)
    finally:
        stop.set()
        watcher.join(timeout=5)
        listener.close()
    res = json.loads((b.root / "result.json").read_text())
    assert res["status"] == "succeeded", res["error"] + out.stderr[-2000:]
    assert seen, "the daemon never ran (the attack did not happen)"
    assert not pids_with(marker), "the daemon outlived the job"
    assert listener.accepted == 0 and not (tmp_path / "leaked").exists()
    log = (b.root / "job.log").read_text()
    guard = re.search(r"\[(\d\d:\d\d:\d\d)\] training tree: .*after training, before the post eval.*", log)
    post = re.search(r"\[(\d\d:\d\d:\d\d)\] training done .*post-eval", log)
    assert guard and post and guard.start() < post.start(), log
    assert res["worker"]["training_tree"]["after training, before the post eval"]["survivors"] == []
