"""Isolation on the GPU worker: what the **training tree** (every process that imports or runs the agent's
environment module: prime-rl's orchestrator and env servers on a GPU, the rollout worker of the local
executor) may see and do, and how the worker makes sure none of it outlives training.

The rules (``gpu/README.md``, "Isolation", says which hold where):

1. **No credentials, no secret seed.** The worker's own environment (Runpod's ``RUNPOD_AI_API_KEY``,
   webhook URLs, ``HF_TOKEN``, ``WANDB_API_KEY``, ...) never reaches the runner: :func:`runner_env` keeps an
   allow-list of names and drops anything that looks like a credential. The runner keeps
   ``AIT_SECRETS_FILE`` (it builds the hidden set for the eval phase); :func:`training_env` drops it too.
2. **A jail for the training tree** (:class:`TrainingJail`, chosen once per worker by :func:`probe`):
   ``bwrap``: bubblewrap with new pid, network, IPC and UTS namespaces, read-only binds of the system and of
   the paths the executor names, a private ``/tmp``, the executor's writable folders only, and (as root) a
   dedicated uid; ``user``: no namespaces (a Docker container without ``CAP_SYS_ADMIN`` refuses them, as on
   Runpod), but a dedicated uid with ``no_new_privs`` and a session of its own, so the tree cannot read
   the runner's files (the secret seed copy, the eval's records: mode 0700 and 0600, owned by root),
   cannot read or signal the runner's processes, and can be killed as a whole; ``none``: neither (not
   root, no bubblewrap): the scrubbed environment and the process guard only.
3. **Nothing of the tree outlives training** (:func:`kill_all`, :func:`processes_of_uid`): the runner
   is a child subreaper (orphans stay below it); after ``train`` the worker kills every process that
   appeared below the runner during training and every process of the jail's uid, and checks that none
   is left before the post eval starts (``gpu/child.py``, ``GuardedExecutor``).

Contract for trainer executors that start processes (the prime-rl executor): build the jail with
:meth:`TrainingJail.from_env` (the worker passes its choice in ``$AIT_TRAINING_JAIL``), start every process
that loads agent code with :meth:`TrainingJail.popen` (or :meth:`TrainingJail.command` +
:meth:`TrainingJail.env`), name the folders it reads and writes, start those processes inside ``train``
only, and serve the post eval from a process started after ``train`` returned (the guard kills whatever
``train`` left). Linux only (``/proc``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from ait_env.jobs.settings import DEFAULT_TRAINING_UID, TRAINING_UID_ENV
from ait_env.processes import kill_all, live_descendants, python_roots

JailMode = Literal["bwrap", "user", "none"]
#: the variable that carries the worker's :class:`JailConfig` (JSON) to the runner and its executor
JAIL_ENV = "AIT_TRAINING_JAIL"


def training_uid() -> int:
    """This worker's training uid: ``$AIT_TRAINING_UID``, else :data:`DEFAULT_TRAINING_UID`."""
    raw = os.environ.get(TRAINING_UID_ENV, "")
    if not raw:
        return DEFAULT_TRAINING_UID
    if not raw.isdigit() or int(raw) < 1000:
        raise ValueError(f"{TRAINING_UID_ENV}={raw!r}: give an unused uid >= 1000 (default "
                         f"{DEFAULT_TRAINING_UID})")
    return int(raw)

#: variables the runner may inherit from the worker (exact names)
SAFE_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TERM", "SHELL", "PWD",
    "PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE", "VIRTUAL_ENV",
    "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
    "TOKENIZERS_PARALLELISM", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
    "HF_DATASETS_OFFLINE", "TRITON_CACHE_DIR",
})
#: ... and by prefix (configuration of the inner stack and of this project)
SAFE_PREFIXES = ("LC_", "NVIDIA_", "NCCL_", "VLLM_", "TORCH_", "CUDA_", "UV_", "AIT_")
#: never passed on, whatever the name's prefix (``HF_TOKEN``, ``AIT_..._KEY``, ``NCCL_..._PASSWORD``)
CREDENTIAL = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION|WEBHOOK|PRIVATE", re.I)
#: the worker's private settings: the runner gets the secret seed file explicitly, the tree never
WORKER_ONLY = frozenset({"AIT_SECRETS_FILE", "AIT_SECRETS_JSON"})


def runner_env(base: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
    """The runner's environment: the allow-listed variables of ``base`` (default ``os.environ``) without
    credentials or the worker's secrets, plus ``extra`` (e.g. ``AIT_SECRETS_FILE`` for the eval phase)."""
    base = os.environ if base is None else base
    env = {k: v for k, v in base.items() if (k in SAFE_NAMES or k.startswith(SAFE_PREFIXES))
           and not CREDENTIAL.search(k) and k not in WORKER_ONLY}
    env.update(extra)
    return env


def training_env(base: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
    """The training tree's environment: :func:`runner_env` of ``base`` without the secret seed file and the
    jail setting, plus ``extra`` (``HOME``, ``TMPDIR``, the executor's own variables)."""
    env = runner_env(base)
    env.pop(JAIL_ENV, None)
    env.update(extra)
    return env


def secret_values(base: Mapping[str, str] | None = None, min_len: int = 8) -> set[str]:
    """The values of the credential-looking variables of ``base`` (scrubbed from text leaving the worker)."""
    base = os.environ if base is None else base
    return {v for k, v in base.items() if (CREDENTIAL.search(k) or k in WORKER_ONLY) and len(v) >= min_len}


# ------------------------------------------------------------------------------------------------- the jail
class JailConfig(BaseModel):
    """How the training tree runs on this worker (:func:`probe` decides; ``reason`` says why not stronger)."""

    mode: JailMode
    uid: int | None = None
    reason: str = ""

    def guarantees(self) -> dict[str, bool]:
        """What holds for the training tree under this mode (``gpu/README.md``, "Isolation")."""
        separate = self.uid is not None
        return {"scrubbed_env": True, "killed_after_training": True, "separate_uid": separate,
                "runner_files_unreadable": separate or self.mode == "bwrap",
                "pid_namespace": self.mode == "bwrap", "no_network": self.mode == "bwrap",
                "private_filesystem": self.mode == "bwrap"}

    def describe(self) -> str:
        held = [k for k, v in self.guarantees().items() if v]
        missing = [k for k, v in self.guarantees().items() if not v]
        return (f"training jail {self.mode}" + (f" (uid {self.uid})" if self.uid is not None else "")
                + f": {', '.join(held)}" + (f"; NOT: {', '.join(missing)}" if missing else "")
                + (f" [{self.reason}]" if self.reason else ""))


def bwrap_works(timeout_s: float = 15.0) -> tuple[bool, str]:
    """Whether bubblewrap can create the namespaces here (a Docker container without CAP_SYS_ADMIN and
    with the default seccomp profile refuses them); ``(ok, why not)``."""
    exe = shutil.which("bwrap")
    if exe is None:
        return False, "bubblewrap (bwrap) is not installed"
    try:
        out = subprocess.run([exe, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--die-with-parent",
                              "--ro-bind", "/", "/", "--proc", "/proc", "true"],
                             capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"bwrap did not run: {exc}"
    return out.returncode == 0, (out.stderr.strip()[-300:] or f"exit code {out.returncode}")


def probe(requested: Literal["auto", "bwrap", "user", "none"] = "auto",
          uid: int | None = None) -> JailConfig:
    """The strongest jail this machine allows (``auto``), or the one ``requested`` (an error when it is
    not available here, never a silent downgrade). ``uid``: default :func:`training_uid`."""
    uid = training_uid() if uid is None else uid
    root = os.getuid() == 0
    if requested in ("auto", "bwrap"):
        ok, why = bwrap_works()
        if ok:
            return JailConfig(mode="bwrap", uid=uid if root else None,
                              reason="" if root else "not root: same uid as the worker inside the namespaces")
        if requested == "bwrap":
            raise RuntimeError(f"isolation 'bwrap' requested but bubblewrap cannot run here ({why}); "
                               "install it (apt-get install bubblewrap) or allow user namespaces, or pick "
                               "isolation=user")
        reason = f"no bubblewrap: {why}"
    else:
        reason = f"isolation={requested} requested"
    if requested in ("auto", "user"):
        if root:
            return JailConfig(mode="user", uid=uid, reason=reason)
        if requested == "user":
            raise RuntimeError("isolation 'user' needs root (to switch the training tree to its own uid): "
                               "run the worker as root (the image does) or pick isolation=none")
        reason += "; not root: no separate uid"
    return JailConfig(mode="none", reason=reason)


#: system folders bound read-only into the bubblewrap jail (those that exist), and the /etc files a
#: Python/CUDA process reads: the dynamic linker's cache (``ldconfig -p``, which torch and triton call),
#: user names, the time zone, and name resolution (``localhost``: prime-rl's ``--rdzv-endpoint`` and the
#: orchestrator's ``base_url``; glibc reads nsswitch.conf, host.conf, hosts and gai.conf)
_SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/opt/conda")
_ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/passwd", "/etc/group",
              "/etc/nsswitch.conf", "/etc/host.conf", "/etc/hosts", "/etc/gai.conf", "/etc/localtime",
              "/etc/alternatives")
#: GPU device nodes (bound into the jail's /dev when present)
_GPU_DEVICES = ("/dev/nvidia*", "/dev/nvidia-caps", "/dev/dri")
#: Unix socket paths are limited to 107 bytes (``sun_path``); vLLM puts its IPC sockets at
#: ``$VLLM_RPC_BASE_PATH/<uuid4>`` (vllm 0.24.0 ``envs.py`` ``VLLM_RPC_BASE_PATH``, default
#: ``tempfile.gettempdir()``; ``utils/network_utils.py`` ``get_open_zmq_ipc_path``) and Python's
#: multiprocessing its listeners below ``$TMPDIR``: the tree gets a short private folder for both
SHORT_TMP_PREFIX = "/tmp/ait-t-"


class TrainingJail:
    """Starts the training tree's processes under a :class:`JailConfig` (see the module docstring)."""

    def __init__(self, config: JailConfig) -> None:
        self.config = config
        self.started: list[subprocess.Popen[Any]] = []
        self._short_tmp: Path | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "TrainingJail":
        """The jail the worker chose (``$AIT_TRAINING_JAIL``); without it (the runner started by hand),
        :func:`probe`'s choice."""
        raw = (os.environ if env is None else env).get(JAIL_ENV)
        return cls(JailConfig.model_validate_json(raw) if raw else probe())

    def short_tmp(self) -> str:
        """The tree's temporary folder, short enough for Unix socket paths (:data:`SHORT_TMP_PREFIX`):
        ``/tmp`` inside bubblewrap (a private tmpfs), else a private folder below ``/tmp`` (mode 0700, owned
        by the jail's uid), made on first use and removed by :meth:`cleanup`."""
        if self.config.mode == "bwrap":
            return "/tmp"
        if self._short_tmp is None:
            import tempfile

            self._short_tmp = Path(tempfile.mkdtemp(prefix=Path(SHORT_TMP_PREFIX).name, dir="/tmp"))
            if self.config.uid is not None and os.getuid() == 0:
                os.chown(self._short_tmp, self.config.uid, self.config.uid)
        return str(self._short_tmp)

    def cleanup(self) -> None:
        """Remove what :meth:`short_tmp` made (after the tree is gone)."""
        if self._short_tmp is not None:
            shutil.rmtree(self._short_tmp, ignore_errors=True)
            self._short_tmp = None

    def env(self, home: Path | str, base: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
        """The tree's environment (:func:`training_env`) with ``HOME`` = ``home`` and ``TMPDIR`` and
        ``VLLM_RPC_BASE_PATH`` = :meth:`short_tmp`."""
        home = str(home)
        user = {"USER": "ait-train", "LOGNAME": "ait-train"} if self.config.uid is not None else {}
        tmp = self.short_tmp()
        return training_env(base, HOME=home, TMPDIR=tmp, VLLM_RPC_BASE_PATH=tmp, **user, **extra)

    def prepare(self, writable: Sequence[Path | str], home: Path | str | None = None,
                readable: Sequence[Path | str] = ()) -> None:
        """Create ``writable`` folders (and ``home``/tmp) and give them to the jail's uid. Without bubblewrap
        (the paths are the host's), every folder above them must let others pass (mode ``o+x``): an error
        names the first that does not."""
        dirs = [Path(d) for d in writable] + ([Path(home), Path(home) / "tmp"] if home else [])
        if self.config.mode == "user":
            for d in [*dirs, *map(Path, readable)]:
                for parent in reversed(Path(d).absolute().parents):
                    if parent.exists() and not parent.stat().st_mode & 0o001:
                        raise RuntimeError(f"the training uid {self.config.uid} cannot reach {d}: {parent} "
                                           f"is mode {parent.stat().st_mode & 0o777:o}; give others passage "
                                           f"(chmod o+x {parent}) or put the job elsewhere")
        uid = self.config.uid
        for d in dirs:
            d.mkdir(parents=True, exist_ok=True)
            if uid is not None and os.getuid() == 0:
                for sub, _, files in os.walk(d):
                    os.chown(sub, uid, uid)
                    for name in files:
                        os.chown(os.path.join(sub, name), uid, uid, follow_symlinks=False)

    def _drop(self) -> list[str]:
        uid = self.config.uid
        if uid is None or os.getuid() != 0:
            return []
        if shutil.which("setpriv"):
            return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs", "--"]
        shim = ("import ctypes, os, sys; ctypes.CDLL(None).prctl(38, 1, 0, 0, 0); os.setgroups([]); "
                "os.setgid(int(sys.argv[1])); os.setuid(int(sys.argv[1])); "
                "os.execvp(sys.argv[2], sys.argv[2:])")
        return [sys.executable, "-I", "-c", shim, str(uid)]

    def command(self, argv: Sequence[str], *, writable: Sequence[Path | str] = (),
                readable: Sequence[Path | str] = (), cwd: Path | str | None = None,
                env: Mapping[str, str] | None = None) -> list[str]:
        """``argv`` wrapped for this jail. ``readable``: folders the tree reads (its venv, the model files,
        the job's package); ``writable``: folders it writes (its output folder, its ``HOME``). In ``bwrap``
        mode nothing else of the filesystem is visible; ``env`` is then passed with ``--setenv``."""
        argv = [str(a) for a in argv]
        if self.config.mode != "bwrap":
            return self._drop() + argv
        import glob

        from gpu.venv_paths import program_paths

        out = [shutil.which("bwrap") or "bwrap", "--new-session", "--die-with-parent", "--unshare-pid",
               "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--clearenv"]
        for k, v in (env or {}).items():
            out += ["--setenv", k, v]
        for d in _SYSTEM_DIRS:
            if os.path.exists(d):
                out += ["--ro-bind", d, d]
        # bwrap makes the parent of a bound file 0700 root unless told otherwise: /etc would then be
        # unreadable to the tree's uid (no /etc/hosts, no localhost, no ldconfig -p)
        out += ["--perms", "0755", "--dir", "/etc"]
        for d in _ETC_FILES:
            if os.path.exists(d):
                out += ["--ro-bind", d, d]
        # /dev/shm and /tmp sticky and writable for every uid (multiprocessing queues and semaphores,
        # shared_memory, NCCL and vLLM use /dev/shm)
        out += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/dev/shm",
                "--ro-bind", "/sys", "/sys", "--perms", "1777", "--tmpfs", "/tmp"]
        for pattern in _GPU_DEVICES:
            for dev in sorted(glob.glob(pattern)):
                out += ["--dev-bind", dev, dev]
        # the program's venv, its interpreter and its editable installs (gpu/venv_paths.py); this
        # worker's own interpreter only where the uid drop needs it (no setpriv)
        pythons = program_paths(argv[0]) if os.path.isabs(argv[0]) else []
        drop = self._drop()
        if drop and drop[0] == sys.executable:
            pythons += python_roots(sys.executable)
        ro = dict.fromkeys([*pythons, *map(str, readable)])
        binds = [("--ro-bind", d) for d in ro if os.path.exists(d)]
        binds += [("--bind", str(d)) for d in writable]
        made = {"/", "/tmp", "/dev", "/proc", "/sys", "/etc", *_SYSTEM_DIRS}
        system = tuple(x + "/" for x in _SYSTEM_DIRS)
        for kind, d in binds:
            # parents bwrap would create with mode 0700 (unreadable after the uid drop) are made 0755 first
            for parent in reversed(Path(d).parents):
                if str(parent) not in made and not str(parent).startswith(system):
                    out += ["--perms", "0755", "--dir", str(parent)]
                    made.add(str(parent))
            out += [kind, d, d]
        if cwd is not None:
            out += ["--chdir", str(cwd)]
        return out + drop + argv

    def popen(self, argv: Sequence[str], *, home: Path | str, writable: Sequence[Path | str] = (),
              readable: Sequence[Path | str] = (), cwd: Path | str | None = None,
              env: Mapping[str, str] | None = None, **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` in the jail, in a session of its own, with :meth:`env` (``HOME`` = ``home``) plus
        ``env``; the folders are prepared (:meth:`prepare`)."""
        self.prepare(writable, home, readable)
        full_env = {**self.env(home), **(env or {})}
        writable = [*writable, home]
        cmd = self.command(argv, writable=writable, readable=readable, cwd=cwd, env=full_env)
        proc = subprocess.Popen(cmd, cwd=cwd, env=full_env, start_new_session=True, **kwargs)
        self.started.append(proc)
        return proc

    def reap(self, timeout_s: float = 10.0) -> set[int]:
        """Kill every process this jail started, everything below them and every process of its uid;
        returns the survivors (empty: all gone)."""
        pids = {p.pid for p in self.started}
        for p in self.started:
            pids |= live_descendants(p.pid)
        _, survivors = kill_all(pids, uid=self.config.uid if os.getuid() == 0 else None, timeout_s=timeout_s)
        for p in self.started:
            try:
                p.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass
        if not survivors:
            self.cleanup()
        return survivors


def main(argv: list[str] | None = None) -> int:
    """``python -m gpu.isolation``: print the jail this machine allows (JSON) and what it guarantees."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m gpu.isolation", description=main.__doc__)
    ap.add_argument("--mode", default="auto", choices=["auto", "bwrap", "user", "none"])
    args = ap.parse_args(argv)
    cfg = probe(args.mode)
    print(json.dumps({**cfg.model_dump(), "guarantees": cfg.guarantees()}, indent=1))
    return 0


if __name__ == "__main__":
    # the canonical module's main, not this __main__ copy's: one class object per exception and type
    from gpu.isolation import main as _main

    raise SystemExit(_main())
