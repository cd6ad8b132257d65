"""The sandbox's resident process (a "zygote"). It runs INSIDE the sandbox and never imports ait_env.

Protocol: one JSON request per line on stdin, one JSON response per line on stdout.

- The zygote imports verifiers and datasets once (slow: seconds), then for each request forks a
  child. The child lowers its limits (CPU seconds, address space, file size), confines itself
  (:mod:`ait_env.sandbox.confine`: a fresh scratch space, no capabilities, the uid drop when the
  zygote runs as root, a seccomp filter), caps its process count, changes into the request's folder,
  runs the requested job and writes JSON lines (``{"confinement": ...}``, ``{"stage": ...}``
  progress markers, then ``{"result": ...}``) into a pipe.
- The zygote enforces the wall-clock timeout (and, where the scratch space is a plain folder, its
  size), then kills the child and every other process below it (fork bombs, daemonised
  grandchildren), and answers with the child's result or with ``{"status": "timeout" | "disk_limit" |
  "crashed" | "no_result", "stage": <last stage>, ...}``.

Jobs are modules loaded from files given as ``--job name=path``, each with ``run(req, adapter, ctx)``
(:class:`Context`): the validation probe's ``inspect`` (:mod:`ait_env.probe.inspect_job`) and the
local executor's ``rollout_worker`` (:mod:`cpu.rollout_worker`). The verifiers-specific
calls come from the adapter file passed as ``--adapter`` (``ait_env/integrations/verifiers_v0.py``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import select
import signal
import sys
import time
import traceback
from typing import Any

MAX_RESULT_BYTES = 16 * 1024 * 1024
UNPRIVILEGED = 65534


def _load_adapter(path: str, name: str = "ait_adapter") -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _tail(limit: int = 2500) -> str:
    text = traceback.format_exc()
    return text[-limit:]


def _vm_bytes() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _apply_limits(limits: dict[str, Any]) -> None:
    cpu = int(limits.get("cpu_seconds", 30))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    mem = int(limits.get("memory_mb", 2048)) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (_vm_bytes() + mem, _vm_bytes() + mem))
    fsize = int(limits.get("file_size_mb", 64)) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _limit_processes(limits: dict[str, Any]) -> None:
    """The process-count cap: the host's pids cgroup when it holds this sandbox (``pids_cgroup``), else
    RLIMIT_NPROC, which counts every process and thread of the (shared) sandbox uid machine-wide."""
    if limits.get("pids_cgroup"):
        return
    nproc = int(limits.get("max_processes", 32))
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))


def _install_audit_hook(workdir: str, scratch: str, allow_uds: str | None = None) -> None:
    """Fallback-mode guard (no namespaces): refuse sockets, new processes and files outside the
    work folder, the scratch folder and the Python installation. Audit hooks cannot be removed once
    installed."""
    allowed = tuple(os.path.realpath(p) + os.sep for p in {sys.prefix, sys.base_prefix, sys.exec_prefix,
                                                           os.path.dirname(os.path.dirname(sys.executable)),
                                                           scratch})
    work = os.path.realpath(workdir) + os.sep
    blocked_events = {"socket.connect", "socket.bind", "socket.sendto", "socket.getaddrinfo", "os.fork",
                      "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "subprocess.Popen",
                      "os.kill", "os.killpg", "ctypes.dlopen", "os.chmod", "os.chown"}

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == "socket.connect" and allow_uds and len(args) > 1 and args[1] == allow_uds:
            return
        if event in blocked_events:
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "open" and args and isinstance(args[0], (str, bytes)):
            path = os.path.realpath(os.fsdecode(args[0]))
            if path.startswith(("/proc/self/", f"/proc/{os.getpid()}/", "/dev/null", "/dev/urandom")):
                return
            if not (path + os.sep).startswith(work) and not path.startswith(work) and not path.startswith(allowed):
                raise PermissionError(f"sandbox: opening {path} is not allowed")

    sys.addaudithook(hook)


class _Reporter:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def send(self, obj: dict[str, Any]) -> None:
        data = (json.dumps(obj, default=str) + "\n").encode()
        view = memoryview(data)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]


class Context:
    """What a job module gets besides the request and the adapter: the progress channel to the zygote
    and the traceback of the exception being handled, cut to its tail."""

    def __init__(self, reporter: _Reporter) -> None:
        self.send = reporter.send

    @staticmethod
    def traceback(limit: int = 2500) -> str:
        return _tail(limit)


JOBS: dict[str, Any] = {}  # job name -> module with run(req, adapter, ctx) -> result dict (--job name=path)


def _child(req: dict[str, Any], adapter: Any, confine: Any, wfd: int, drop_to: int | None) -> None:
    rep = _Reporter(wfd)
    try:
        os.setpgid(0, 0)
        limits = req.get("limits", {})
        _apply_limits(limits)
        scratch = req["scratch"]
        held = confine.confine(scratch, int(limits.get("scratch_mb", 256)), int(limits.get("scratch_inodes", 20000)),
                               drop_to, tmpfs=bool(limits.get("scratch_tmpfs", True)))
        rep.send({"confinement": held})
        _limit_processes(limits)
        os.chdir(req["dir"])
        fallback = os.environ.get("AIT_SANDBOX_FALLBACK") == "1"
        os.environ.clear()
        os.environ.update({"HOME": scratch, "TMPDIR": scratch, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                           "HF_HOME": os.path.join(scratch, ".hf")})
        if fallback:
            _install_audit_hook(req["dir"], scratch, req.get("uds"))
        job = JOBS.get(str(req.get("job")))
        if job is None:
            raise KeyError(f"no job {req.get('job')!r} in this sandbox (it runs: {', '.join(sorted(JOBS))})")
        result = job.run(req, adapter, Context(rep))
        rep.send({"result": result})
    except BaseException as exc:  # noqa: BLE001
        try:
            rep.send({"result": {"status": "error", "stage": "runner", "kind": "exception",
                                 "error": f"{type(exc).__name__}: {exc}", "traceback": _tail()}})
        except BaseException:  # noqa: BLE001
            pass
    finally:
        os._exit(0)


def _usage(paths: list[str], stop_bytes: int, stop_entries: int) -> tuple[int, int]:
    """Bytes and entries below ``paths`` (no recursion, no symlinks followed); stops counting once a
    limit is passed, so a hostile tree costs a bounded scan."""
    total, entries = 0, 0
    todo = list(paths)
    while todo and total <= stop_bytes and entries <= stop_entries:
        try:
            it = os.scandir(todo.pop())
        except OSError:
            continue
        with it:
            for e in it:
                entries += 1
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += st.st_blocks * 512
                if e.is_dir(follow_symlinks=False):
                    todo.append(e.path)
    return total, entries


def _wipe(folder: str) -> None:
    """Empty ``folder`` (any depth, any permissions; bounded in time). Never raises."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    if not names:
        return
    import subprocess

    try:
        subprocess.run(["rm", "-rf", "--one-file-system", "--", *[os.path.join(folder, n) for n in names]],
                       timeout=60, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.SubprocessError):
        pass


def _descendants() -> set[int]:
    """Every process below this one (the zygote is a child subreaper, so orphans stay below it). A copy of
    :func:`ait_env.processes.live_descendants`, kept here on purpose: the zygote runs inside the
    jail as a file of its own and imports nothing from the project."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            parent[int(entry)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            continue
    me, out, frontier = os.getpid(), set(), [os.getpid()]
    while frontier:
        cur = frontier.pop()
        for pid, ppid in parent.items():
            if ppid == cur and pid not in out and pid != me:
                out.add(pid)
                frontier.append(pid)
    return out


def _kill_strays() -> None:
    """Kill every process left below the zygote (fork bombs, daemonised grandchildren) and reap them."""
    for _ in range(20):
        strays = _descendants()
        if not strays:
            break
        for pid in strays:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
        time.sleep(0.01)


def _become_subreaper() -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


_PROTO_FD: int | None = None  # the zygote's channel to the orchestrator (never visible to children)


def _serve(req: dict[str, Any], adapter: Any, confine: Any, drop_to: int | None) -> dict[str, Any]:
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rfd)
        if _PROTO_FD is not None:
            os.close(_PROTO_FD)  # agent code must not be able to forge the zygote's answers
        _child(req, adapter, confine, wfd, drop_to)
    os.close(wfd)
    limits = req.get("limits", {})
    deadline = time.monotonic() + float(limits.get("wall_seconds", 30))
    disk_cap = int(limits.get("scratch_mb", 256)) * 1024 * 1024
    inode_cap = int(limits.get("scratch_inodes", 20000))
    buf = b""
    stage = "start"
    result: dict[str, Any] | None = None
    held: dict[str, Any] = {}
    timed_out = over_disk = False
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        ready, _, _ = select.select([rfd], [], [], min(left, 0.5))
        if held.get("scratch") == "folder":
            # no private tmpfs (no mount permission here): bound what the request can write by polling
            used, entries = _usage([req["scratch"], req["dir"]], disk_cap, inode_cap)
            if used > disk_cap or entries > inode_cap:
                over_disk = True
                break
        if not ready:
            continue
        chunk = os.read(rfd, 1 << 16)
        if not chunk:
            break
        buf += chunk
        if len(buf) > MAX_RESULT_BYTES:
            break
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if not isinstance(msg, dict):
                continue
            if "stage" in msg:
                stage = str(msg["stage"])
            if "confinement" in msg and not held and isinstance(msg["confinement"], dict):
                held = msg["confinement"]  # sent before any agent code runs
            if "result" in msg:
                result = msg["result"]
    os.close(rfd)
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    status = 0
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:
        pass
    _kill_strays()
    if held.get("scratch") != "tmpfs":
        _wipe(req["scratch"])  # a private tmpfs went with the request's processes; a folder is emptied
    out = _outcome(result, status, stage, timed_out, over_disk)
    if isinstance(out, dict):
        out["confinement"] = held
    return out


def _outcome(result: Any, status: int, stage: str, timed_out: bool, over_disk: bool) -> dict[str, Any]:
    if timed_out:
        return {"status": "timeout", "stage": stage}
    if over_disk:
        return {"status": "disk_limit", "stage": stage}
    if isinstance(result, dict):
        return result
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return {"status": "crashed", "stage": stage, "signal": signal.Signals(sig).name}
    return {"status": "no_result", "stage": stage, "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--adapter", required=True)
    ap.add_argument("--confine", required=True)
    ap.add_argument("--job", action="append", default=[], help="name=path of a job module (repeatable)")
    ap.add_argument("--preload", default="verifiers,datasets")
    args = ap.parse_args()
    _become_subreaper()
    adapter = _load_adapter(args.adapter)
    confine = _load_adapter(args.confine, "ait_confine")
    for spec in args.job:
        name, _, path = spec.partition("=")
        JOBS[name] = _load_adapter(path, f"ait_job_{name}")
    for name in filter(None, args.preload.split(",")):
        __import__(name)
    if "datasets" in sys.modules:
        sys.modules["datasets"].disable_progress_bars()
    drop_to = UNPRIVILEGED if os.getuid() == 0 and os.environ.get("AIT_SANDBOX_NO_SETUID") != "1" else None
    # Keep the protocol on a private descriptor; anything printed (by libraries or agent code) goes
    # to stderr (the sandbox log) instead of corrupting the JSON lines.
    global _PROTO_FD
    sys.stdout.flush()
    _PROTO_FD = os.dup(1)
    os.dup2(2, 1)
    out = os.fdopen(_PROTO_FD, "w", buffering=1, closefd=False)
    out.write(json.dumps({"ready": True, "uid": os.getuid(), "drop_to": drop_to}) + "\n")
    out.flush()
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            req = json.loads(line)
            resp = _serve(req, adapter, confine, drop_to)
        except Exception as exc:  # noqa: BLE001
            resp = {"status": "error", "stage": "zygote", "kind": "exception", "error": f"{type(exc).__name__}: {exc}"}
        out.write(json.dumps({"id": req.get("id") if isinstance(req, dict) else None, "response": resp},
                             default=str) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
