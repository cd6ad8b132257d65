"""Inside the sandbox no privilege is left to escalate with: no new user namespaces, no capabilities,
no mounts, no chroot (issue: untrusted submissions, item 7)."""

from __future__ import annotations

import ast

import pytest

pytest.importorskip("verifiers")

from ait_env.sandbox.confine import X86_64_DENY, seccomp_program  # noqa: E402
from ait_env.probe.dynamic import probe_sandbox  # noqa: E402
from ait_env.sandbox import SandboxLimits, SandboxSettings  # noqa: E402

ATTEMPTS = '''
import ctypes, os, subprocess
R = {}
libc = ctypes.CDLL(None, use_errno=True)
for name, flag in (("user", 0x10000000), ("mount", 0x00020000), ("net", 0x40000000), ("pid", 0x20000000)):
    R["unshare_" + name] = libc.unshare(flag) == 0
R["mount_tmpfs"] = libc.mount(b"tmpfs", b"/scratch", b"tmpfs", 0, None) == 0
try:
    os.chroot("/scratch")
    R["chroot"] = True
except OSError:
    R["chroot"] = False
R["unshare_cmd"] = subprocess.run(["unshare", "-r", "-m", "true"], capture_output=True).returncode == 0
status = dict(l.split(":", 1) for l in open("/proc/self/status") if ":" in l)
R["cap_bounding"] = int(status["CapBnd"], 16)
R["cap_effective"] = int(status["CapEff"], 16)
R["no_new_privs"] = int(status["NoNewPrivs"])
R["seccomp"] = int(status["Seccomp"])
pid = os.fork()
if pid == 0:
    os._exit(7)
R["fork_still_works"] = os.WEXITSTATUS(os.waitpid(pid, 0)[1]) == 7
raise RuntimeError("RESULT" + repr(R))
'''


STATUS_ONLY = '''
status = dict(l.split(":", 1) for l in open("/proc/self/status") if ":" in l)
raise RuntimeError("RESULT" + repr({k: int(status[k], 16) for k in ("CapBnd", "NoNewPrivs", "Seccomp")}))
'''


def _run(mode: str, code: str) -> dict:
    sb = probe_sandbox(SandboxSettings(mode=mode, limits=SandboxLimits(wall_seconds=30)))
    try:
        outside, inside = sb.new_workdir()
        (outside / "pkg").mkdir()
        (outside / "pkg" / "__init__.py").write_text(code)
        resp = sb.run({"job": "inspect", "dir": inside, "package": "pkg", "args": {}, "dev": []}, outside)
        sb.release(outside)
    finally:
        sb.destroy()
    assert "RESULT" in resp.get("error", ""), resp
    assert resp["confinement"]["seccomp"] is True
    return ast.literal_eval(resp["error"].split("RESULT", 1)[1])


def test_agent_code_cannot_gain_privileges(tmp_path, monkeypatch):
    """... nor read this installation's private hidden-eval seeds (issue 46: the seeds never reach a process
    that runs agent code; the file, made here as a run makes it, is neither bound nor named in the env)."""
    from ait_env.hidden.secrets import current

    monkeypatch.setenv("AIT_SECRETS_FILE", str(tmp_path / "config" / "secrets.json"))
    monkeypatch.setenv("AIT_HIDDEN_SEEDS", "private")
    path = current().path
    snoop = (f"R['ait_env'] = sorted(k for k in os.environ if k.startswith('AIT_'))\n"
             f"try:\n    R['seeds'] = open({str(path)!r}).read()\nexcept Exception as exc:\n"
             f"    R['seeds'] = type(exc).__name__\n")
    r = _run("auto", ATTEMPTS.replace('raise RuntimeError("RESULT"', snoop + 'raise RuntimeError("RESULT"'))
    escalations = {k: v for k, v in r.items() if k.startswith(("unshare", "mount", "chroot")) and v}
    assert not escalations, escalations
    assert r["no_new_privs"] == 1 and r["seccomp"] == 2
    assert r["cap_bounding"] == 0 and r["cap_effective"] == 0
    assert r["fork_still_works"]
    assert r["ait_env"] == [] and r["seeds"] in ("FileNotFoundError", "PermissionError"), r   # bwrap, fallback


def test_the_fallback_sandbox_is_confined_too():
    """The fallback's audit hook refuses ctypes and processes, so only the kernel's view is read here."""
    r = _run("fallback", STATUS_ONLY)
    assert r == {"CapBnd": 0, "NoNewPrivs": 1, "Seccomp": 2}


def test_the_filter_covers_what_it_says():
    prog = seccomp_program()
    assert len(prog) % 8 == 0 and len(prog) // 8 < 4096  # the kernel's BPF_MAXINSNS
    for name in ("unshare", "setns", "mount", "chroot", "pivot_root", "bpf", "ptrace", "keyctl", "io_uring_setup"):
        assert name in X86_64_DENY
