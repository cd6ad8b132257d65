"""The training jail (gpu/isolation.py) against a hostile training process, mode by mode, and the guard
that kills what training left before the post eval. Which rule holds in which mode is the table in
gpu/README.md ("Isolation"): the network and the filesystem are closed only with bubblewrap."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from gpu import isolation
from ait_env import processes
from gpu.isolation import JailConfig, TrainingJail, training_uid
from tests.gpu.helpers import FAKE_KEY, ROOT, Listener, pids_with

UID = training_uid()   # $AIT_TRAINING_UID: suites running side by side must not share one

#: an interpreter any uid may execute (this checkout's may live under a 0700 home)
SYSTEM_PYTHON = "/usr/bin/python3"
root_only = pytest.mark.skipif(os.getuid() != 0 or not os.path.exists(SYSTEM_PYTHON),
                               reason="needs root and /usr/bin/python3 (a separate uid)")
with_bwrap = pytest.mark.skipif(not isolation.bwrap_works()[0], reason="bubblewrap cannot run here")

HOSTILE = textwrap.dedent('''
    import json, os, socket, sys
    secret, port, runner_pid, marker, out = sys.argv[1], int(sys.argv[2]), *sys.argv[3:6]
    report = {"uid": os.getuid(), "env": sorted(os.environ)}
    def attempt(name, fn):
        try:
            report[name] = "LEAKED: " + repr(fn())[:200]
        except BaseException as exc:
            report[name] = "blocked: " + type(exc).__name__
    attempt("read_secret", lambda: open(secret).read())
    attempt("runner_environ", lambda: open("/proc/%s/environ" % runner_pid).read())
    attempt("connect", lambda: socket.create_connection(("127.0.0.1", port), timeout=2))
    attempt("write_outside", lambda: open(os.path.join(os.path.dirname(secret), "planted"), "w").write("x"))
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(600)  # " + marker])
        os._exit(0)
    os.wait()
    with open(out, "w") as f:
        json.dump(report, f)
''')


@pytest.fixture
def open_tmp():
    """A folder others may pass through (a pytest tmp_path sits below a 0700 one), removed afterwards."""
    d = Path(tempfile.mkdtemp(prefix="aitj-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def secret_dir(open_tmp):
    """A root-owned 0700 folder holding a 0600 secret, like the worker's private copy."""
    d = open_tmp / "private"
    d.mkdir(mode=0o700)
    (d / "secrets.json").write_text('{"canary": 31415926535}')
    (d / "secrets.json").chmod(0o600)
    return d


def _attack(tmp_path: Path, jail: TrainingJail, secret_dir: Path) -> tuple[dict, set[int], int]:
    """Run the hostile script in ``jail``; (its report, the daemons left after reap, connections seen)."""
    marker = f"ait-jail-daemon-{time.time_ns()}"
    script = tmp_path / "code" / "hostile.py"
    script.parent.mkdir()
    script.write_text(HOSTILE)
    script.parent.chmod(0o755)
    home, out = tmp_path / "home", tmp_path / "home" / "report.json"
    listener = Listener()
    os.environ["RUNPOD_AI_API_KEY"] = FAKE_KEY
    os.environ["AIT_SECRETS_FILE"] = str(secret_dir / "secrets.json")
    try:
        proc = jail.popen([SYSTEM_PYTHON, str(script), str(secret_dir / "secrets.json"), str(listener.port),
                           str(os.getpid()), marker, str(out)], home=home, readable=[script.parent],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        proc.wait(timeout=60)
        time.sleep(0.3)
        survivors = jail.reap()
        assert not survivors
        left = pids_with(marker)
    finally:
        del os.environ["RUNPOD_AI_API_KEY"], os.environ["AIT_SECRETS_FILE"]
        listener.close()
    for pid in left:   # never leave one behind, whatever the assertion says
        os.kill(pid, 9)
    return json.loads(out.read_text()), left, listener.accepted


def test_runner_and_training_environments_drop_credentials():
    base = {"PATH": "/usr/bin", "HOME": "/root", "HF_HOME": "/hf", "HF_TOKEN": "hf_x",
            "RUNPOD_AI_API_KEY": "k", "RUNPOD_WEBHOOK_GET_JOB": "https://x", "WANDB_API_KEY": "w",
            "AIT_SECRETS_FILE": "/s",
            "AIT_SECRETS_JSON": "{}", "AIT_CACHE_DIR": "/c", "AIT_DB_PASSWORD": "p", "NCCL_DEBUG": "INFO",
            "AWS_SECRET_ACCESS_KEY": "a", "CUDA_VISIBLE_DEVICES": "0,1", isolation.JAIL_ENV: "{}"}
    runner = isolation.runner_env(base, AIT_SECRETS_FILE="/private/secrets.json")
    assert set(runner) == {"PATH", "HOME", "HF_HOME", "AIT_CACHE_DIR", "NCCL_DEBUG", "CUDA_VISIBLE_DEVICES",
                           isolation.JAIL_ENV, "AIT_SECRETS_FILE"}
    assert runner["AIT_SECRETS_FILE"] == "/private/secrets.json"
    train = isolation.training_env(runner, HOME="/job/home")
    assert "AIT_SECRETS_FILE" not in train and isolation.JAIL_ENV not in train
    assert train["HOME"] == "/job/home"
    assert isolation.secret_values(base, min_len=1) >= {"hf_x", "k", "w", "/s", "p", "a"}


def test_probe_never_downgrades_a_requested_mode(monkeypatch):
    monkeypatch.setattr(isolation, "bwrap_works", lambda: (False, "bwrap: Creating new namespace failed"))
    cfg = isolation.probe("auto")
    assert cfg.mode == ("user" if os.getuid() == 0 else "none") and "no bubblewrap" in cfg.reason
    with pytest.raises(RuntimeError, match="bubblewrap cannot run here"):
        isolation.probe("bwrap")
    g = JailConfig(mode="user", uid=UID).guarantees()
    assert g["separate_uid"] and g["runner_files_unreadable"]
    assert not g["no_network"] and not g["pid_namespace"]


@root_only
@with_bwrap
def test_bwrap_jail_closes_files_network_and_processes(open_tmp, secret_dir):
    report, left, accepted = _attack(open_tmp, TrainingJail(JailConfig(mode="bwrap", uid=UID)), secret_dir)
    assert report["uid"] == UID
    assert "RUNPOD_AI_API_KEY" not in report["env"] and "AIT_SECRETS_FILE" not in report["env"]
    assert all(report[k].startswith("blocked") for k in ("read_secret", "runner_environ", "connect",
                                                          "write_outside")), report
    assert accepted == 0 and not left


@root_only
def test_user_jail_closes_files_and_processes_but_not_the_network(open_tmp, secret_dir):
    """What a Runpod container allows (no namespaces): another uid, no_new_privs, killed as a whole. The
    network stays open: the tree has no credential to use on it, and nothing secret to send."""
    report, left, accepted = _attack(open_tmp, TrainingJail(JailConfig(mode="user", uid=UID)), secret_dir)
    assert report["uid"] == UID and "RUNPOD_AI_API_KEY" not in report["env"]
    closed = ("read_secret", "runner_environ", "write_outside")
    assert all(report[k].startswith("blocked") for k in closed), report
    assert report["connect"] == "LEAKED: " + report["connect"][8:] and accepted == 1   # only bwrap closes it
    assert not left


@pytest.mark.skipif(not os.path.exists(SYSTEM_PYTHON), reason="needs /usr/bin/python3")
def test_no_jail_still_kills_the_tree_from_a_subreaper(tmp_path):
    """Without a separate uid (not root, no bubblewrap) the guard relies on the runner being a child
    subreaper: a daemonised grandchild stays below it and is killed with the rest."""
    code = textwrap.dedent(f'''
        import json, os, subprocess, sys, time
        from ait_env import processes
        assert processes.become_subreaper()
        keep = processes.live_descendants(os.getpid())
        marker = "ait-none-daemon-{time.time_ns()}"
        sleeper = "[sys.executable, '-c', 'import time; time.sleep(600)  # ' + sys.argv[1]]"
        subprocess.run([sys.executable, "-c", "import os, sys\\nif os.fork() == 0:\\n    os.setsid()\\n"
                        "    os.execv(sys.executable, " + sleeper + ")", marker], check=True)
        time.sleep(0.3)
        from tests.gpu.helpers import pids_with
        before = pids_with(marker)
        killed, survivors = processes.kill_all(below=os.getpid(), keep=keep)
        print(json.dumps({{"before": len(before), "killed": len(killed), "survivors": len(survivors),
                           "after": len(pids_with(marker))}}))
    ''')
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"before": 1, "killed": 1, "survivors": 0, "after": 0}


def test_guard_kills_what_training_left_before_the_post_eval(tmp_path):
    """GuardedExecutor around an executor whose train() leaves a daemon (as a prime-rl tree could): the
    daemon is gone when train() returns, and the log says so before anything else runs."""
    code = textwrap.dedent(f'''
        import json, os, subprocess, sys, time
        from ait_env import processes
        from gpu.isolation import JailConfig
        from gpu.child import GuardedExecutor
        from tests.gpu.helpers import pids_with
        processes.become_subreaper()
        marker = "ait-guard-daemon-{time.time_ns()}"
        class Leaky:
            def train(self, eval_point):
                subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)  # " + marker],
                                 start_new_session=True)
                time.sleep(0.3)
                return "trained"
            def close(self):
                pass
        lines = []
        ex = GuardedExecutor(Leaky(), lines.append, JailConfig(mode="none"), None)
        out = ex.train(lambda step: None)
        alive_after_train = len(pids_with(marker))
        ex.close()
        print(json.dumps({{"out": out, "alive": alive_after_train, "log": lines}}))
    ''')
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["out"] == "trained" and data["alive"] == 0
    assert data["log"][0] == ("training tree: 1 leftover process(es) killed after training, before the post "
                               "eval; none left")
    assert data["log"][1] == "training tree: no process left after the job"


def test_jail_command_binds_only_what_it_is_given(tmp_path):
    if not shutil.which("bwrap"):
        pytest.skip("no bubblewrap")
    jail = TrainingJail(JailConfig(mode="bwrap", uid=UID))
    out = tmp_path / "out"
    cmd = jail.command(["/usr/bin/python3", "-c", "pass"], writable=[out], readable=[tmp_path / "pkg"],
                       cwd=out, env={"HOME": "/h"})
    assert cmd[:2] == [shutil.which("bwrap"), "--new-session"]
    assert "--unshare-net" in cmd and "--unshare-pid" in cmd
    i = cmd.index("--bind")
    assert cmd[i:i + 3] == ["--bind", str(out), str(out)]
    sources = {cmd[i + 1] for i, c in enumerate(cmd) if c in ("--ro-bind", "--bind", "--dev-bind")}
    assert not {"/", "/etc", "/root", "/home", "/tmp", str(ROOT)} & sources   # no checkout, home or /tmp
    assert str(tmp_path / "pkg") not in sources  # a readable folder that does not exist is not bound
    if os.getuid() == 0:
        i = cmd.index("--no-new-privs") if "--no-new-privs" in cmd else cmd.index("-I")
        assert cmd[-3:] == ["/usr/bin/python3", "-c", "pass"] and i < len(cmd) - 3


# ----------------------------------------------------------------------------- issue 31: what prime-rl needs

NEEDS = textwrap.dedent('''
    import json, multiprocessing as mp, os, socket, subprocess, sys
    report = {}
    try:
        report["localhost"] = sorted({a[4][0] for a in socket.getaddrinfo("localhost", 80)})
    except OSError as exc:
        report["localhost"] = "FAILED: " + str(exc)
    try:
        q = mp.get_context("spawn").Queue(); q.put(1); report["mp_queue"] = q.get(timeout=20)
    except Exception as exc:
        report["mp_queue"] = "FAILED: " + type(exc).__name__ + ": " + str(exc)
    out = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True)
    report["ldconfig"] = out.returncode == 0 and "libc.so" in out.stdout
    report["shm_mode"] = oct(os.stat("/dev/shm").st_mode & 0o7777)
    report["etc_hosts"] = os.access("/etc/hosts", os.R_OK)
    json.dump(report, open(sys.argv[1], "w"))
''')


@root_only
@with_bwrap
def test_bwrap_jail_gives_localhost_ldconfig_and_a_writable_dev_shm(open_tmp):
    """Issue 31, items 2 and 3, as the jail's uid: bwrap would make /etc 0700 (no /etc/hosts: localhost does
    not resolve, ``ldconfig -p`` fails) and /dev/shm 0755 root (no multiprocessing queue, no NCCL/vLLM)."""
    script = open_tmp / "code" / "needs.py"
    script.parent.mkdir()
    script.write_text(NEEDS)
    script.parent.chmod(0o755)
    jail = TrainingJail(JailConfig(mode="bwrap", uid=UID))
    out = open_tmp / "home" / "report.json"
    proc = jail.popen([SYSTEM_PYTHON, str(script), str(out)], home=open_tmp / "home", readable=[script.parent],
                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    log = proc.communicate(timeout=60)[0]
    assert not jail.reap()
    report = json.loads(out.read_text())
    assert report == {"localhost": ["127.0.0.1"], "mp_queue": 1, "ldconfig": True, "shm_mode": "0o1777",
                      "etc_hosts": True}, (report, log)


@root_only
def test_the_trees_temporary_folder_is_short_and_private(tmp_path):
    """Issue 31, item 7: vLLM's IPC sockets live at ``$VLLM_RPC_BASE_PATH/<uuid4>``, and a Unix socket path
    has at most 107 bytes: under a long job folder ``$HOME/tmp`` would pass it."""
    import uuid

    home = tmp_path / ("a-rather-long-job-folder-name-" * 4) / "home"
    for mode, uid in (("user", UID), ("none", None)):
        jail = TrainingJail(JailConfig(mode=mode, uid=uid))
        env = jail.env(home, base={})
        tmp = Path(env["VLLM_RPC_BASE_PATH"])
        assert env["TMPDIR"] == str(tmp) and tmp.is_dir() and str(home) not in str(tmp)
        assert len(f"{tmp}/{uuid.uuid4()}".encode()) <= 107 - 20   # room to spare
        assert tmp.stat().st_mode & 0o777 == 0o700 and tmp.stat().st_uid == (uid if uid is not None else 0)
        jail.cleanup()
        assert not tmp.exists()
    env = TrainingJail(JailConfig(mode="bwrap", uid=UID)).env(home, base={})
    assert env["TMPDIR"] == env["VLLM_RPC_BASE_PATH"] == "/tmp"   # the jail's private tmpfs


def test_editable_installs_are_found_wherever_they_live(tmp_path):
    """Issue 31, item 1: prime-rl's lock installs prime-rl, its configs package, verifiers, renderers and
    pydantic-config editable; a venv holds only pointers to them (.pth folders, setuptools' finder,
    direct_url.json), so the jail reads those to bind what the interpreter imports."""
    from gpu.venv_paths import editable_roots, program_paths

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    a, b, c, d = (tmp_path / x for x in ("checkout/src", "checkout/deps/verifiers", "elsewhere/pkg", "gone"))
    for folder in (a, b, c):
        folder.mkdir(parents=True)
    (site / "_editable_impl_prime_rl.pth").write_text(f"{a}\n")        # uv + hatchling
    (site / "_editable_impl_verifiers.pth").write_text(f"{b}\nimport sys\n{d}\n")
    (site / "__editable___pkg_finder.py").write_text(                   # setuptools PEP 660
        f"MAPPING: dict[str, str] = {{'pkg': {str(c)!r}}}\nNAMESPACES: dict[str, list[str]] = {{}}\n")
    (site / "inside.pth").write_text(f"{site / 'sub'}\n")
    (site / "sub").mkdir()
    assert set(editable_roots(venv)) == {a.resolve(), b.resolve(), c.resolve()}
    paths = program_paths(venv / "bin" / "python")
    assert {str(a.resolve()), str(b.resolve()), str(c.resolve()), str(venv)} <= set(paths)
    assert str(Path(sys.base_prefix).resolve()) in paths             # the interpreter the venv points to
    assert str(d) not in paths and str(site / "sub") not in paths
