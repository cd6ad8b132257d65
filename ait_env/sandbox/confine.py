"""Confinement of one sandbox request, applied by the request's child process before agent code runs.

Runs INSIDE the sandbox (copied next to ``inside.py``; standard library only, never imports ait_env).
:func:`confine` is called once per request, in the forked child, in this order:

1. **Fresh scratch space** (:func:`private_scratch`): the child enters a mount namespace of its own
   and mounts a new size- and inode-limited tmpfs at the request's scratch folder. It is the only
   place the agent's code can write; it disappears with the request's last process, so nothing
   survives into a later request or episode. Where mounts are not permitted (no CAP_SYS_ADMIN: an
   unprivileged bubblewrap, or the fallback sandbox as a normal user) the scratch folder is a plain
   folder that the zygote bounds by polling its size and wipes after the request; the child reports
   which of the two it got.
2. **No privileges left**: every capability leaves the bounding set and the ambient set (a
   ``setuid`` to the unprivileged uid follows in the caller), ``no_new_privs`` is set.
3. **Seccomp filter** (:func:`install_seccomp`, x86-64): new namespaces (``unshare``, ``setns``,
   ``clone`` with a namespace flag), mounts (``mount``, ``umount2``, ``pivot_root``, the new mount
   API), ``chroot``, ``ptrace``, ``bpf``, ``perf_event_open``, ``userfaultfd``, io_uring, keyrings,
   kernel modules, kexec and other host administration calls fail with ``EPERM``; ``clone3`` fails with
   ``ENOSYS`` so that the C library falls back to ``clone`` (whose flags a filter can read). A
   syscall from another ABI (x32, i386) kills the process. On other architectures no filter is
   installed and :func:`confine` says so (the namespaces and the dropped capabilities still hold).

Every step is best effort where the kernel refuses it, and :func:`confine` returns a description of
what holds, which the sandbox reports with each result.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import platform
import struct
from typing import Any

CLONE_NEWNS = 0x00020000
NAMESPACE_FLAGS = (0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000
                   | 0x40000000)  # NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
MS_NOSUID, MS_NODEV, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x4000, 0x40000

PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, PR_CAP_AMBIENT = 24, 38, 22, 47
PR_CAP_AMBIENT_CLEAR_ALL, SECCOMP_MODE_FILTER = 4, 2

#: x86-64 syscall numbers (``asm/unistd_64.h``) refused with EPERM.
X86_64_DENY: dict[str, int] = {
    "ptrace": 101, "syslog": 103, "uselib": 134, "vhangup": 153, "pivot_root": 155, "_sysctl": 156,
    "adjtimex": 159, "chroot": 161, "acct": 163, "settimeofday": 164, "mount": 165, "umount2": 166,
    "swapon": 167, "swapoff": 168, "reboot": 169, "sethostname": 170, "setdomainname": 171, "iopl": 172,
    "ioperm": 173, "create_module": 174, "init_module": 175, "delete_module": 176, "get_kernel_syms": 177,
    "query_module": 178, "quotactl": 179, "nfsservctl": 180, "lookup_dcookie": 212, "clock_settime": 227,
    "kexec_load": 246, "add_key": 248, "request_key": 249, "keyctl": 250, "unshare": 272,
    "perf_event_open": 298, "fanotify_init": 300, "name_to_handle_at": 303, "open_by_handle_at": 304,
    "clock_adjtime": 305, "setns": 308, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312,
    "finit_module": 313, "kexec_file_load": 320, "bpf": 321, "userfaultfd": 323, "io_uring_setup": 425,
    "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428, "move_mount": 429, "fsopen": 430,
    "fsconfig": 431, "fsmount": 432, "fspick": 433, "pidfd_getfd": 438, "mount_setattr": 442,
}
X86_64_CLONE, X86_64_CLONE3 = 56, 435
AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000

# classic BPF opcodes and seccomp return values (linux/filter.h, linux/seccomp.h)
_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_ALLOW, _RET_KILL_PROCESS, _RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000


@functools.cache
def _libc() -> Any:
    # the interpreter's own symbols include libc's (ctypes.util.find_library would run a compiler and
    # write temporary files, which is not possible after the uid drop)
    libc = ctypes.CDLL(None, use_errno=True)
    # every prctl argument is an unsigned long (a pointer for PR_SET_SECCOMP): never let ctypes pass a C int
    libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    return libc


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def private_scratch(path: str, size_mb: int, max_inodes: int, uid: int | None) -> bool:
    """Mount a fresh tmpfs of ``size_mb`` MB and ``max_inodes`` inodes at ``path`` in a new mount
    namespace of this process (owned by ``uid`` when given). Returns False, changing nothing, when the
    kernel refuses (no CAP_SYS_ADMIN)."""
    libc = _libc()
    if libc.unshare(CLONE_NEWNS) != 0:
        return False
    # keep every later mount of this namespace away from the zygote's (and the host's) namespaces
    _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make mounts private")
    opts = f"size={int(size_mb)}m,nr_inodes={int(max_inodes)},mode=0700"
    if uid is not None:
        opts += f",uid={uid},gid={uid}"
    _check(libc.mount(b"tmpfs", path.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, opts.encode()),
           f"mount a tmpfs at {path}")
    return True


def drop_capabilities() -> bool:
    """Empty the capability bounding set and the ambient set; set no_new_privs. True when every
    capability left the bounding set (False without CAP_SETPCAP, e.g. as a normal user, where the
    process has no capabilities to lose)."""
    libc = _libc()
    try:
        last = int(open("/proc/sys/kernel/cap_last_cap").read())
    except (OSError, ValueError):
        last = 63
    dropped = True
    for cap in range(last + 1):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            dropped = False
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "set no_new_privs")
    return dropped


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def seccomp_program() -> bytes:
    """The filter as classic BPF instructions (x86-64)."""
    eperm = _RET_ERRNO | errno.EPERM
    prog = [_insn(_LD_W_ABS, 0, 0, 4),                        # seccomp_data.arch
            _insn(_JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
            _insn(_RET_K, 0, 0, _RET_KILL_PROCESS),
            _insn(_LD_W_ABS, 0, 0, 0),                         # seccomp_data.nr
            _insn(_JGE_K, 0, 1, X32_SYSCALL_BIT),
            _insn(_RET_K, 0, 0, _RET_KILL_PROCESS)]
    for nr in sorted(set(X86_64_DENY.values())):
        prog += [_insn(_JEQ_K, 0, 1, nr), _insn(_RET_K, 0, 0, eperm)]
    prog += [_insn(_JEQ_K, 0, 1, X86_64_CLONE3), _insn(_RET_K, 0, 0, _RET_ERRNO | errno.ENOSYS),
             _insn(_JEQ_K, 0, 3, X86_64_CLONE),
             _insn(_LD_W_ABS, 0, 0, 16),                       # low 32 bits of args[0]: clone flags
             _insn(_JSET_K, 0, 1, NAMESPACE_FLAGS),
             _insn(_RET_K, 0, 0, eperm),
             _insn(_RET_K, 0, 0, _RET_ALLOW)]
    return b"".join(prog)


def install_seccomp() -> bool:
    """Install :func:`seccomp_program` for this process and its future children (needs no_new_privs).
    False on an architecture the filter does not cover."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return False
    code = seccomp_program()
    buf = ctypes.create_string_buffer(code, len(code))

    class _Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = _Prog(len(code) // 8, ctypes.addressof(buf))
    _check(_libc().prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(prog), 0, 0), "install seccomp")
    return True


def drop_to_user(uid: int) -> None:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


def confine(scratch: str, scratch_mb: int, max_inodes: int, drop_to: int | None,
            tmpfs: bool = True) -> dict[str, Any]:
    """Steps 1-3 of the module docstring, then the ``setuid`` to ``drop_to``. ``tmpfs=False`` skips the
    private tmpfs (the scratch space is then the plain folder the zygote bounds and wipes, as where
    mounts are not permitted). Returns what holds:
    ``{"scratch": "tmpfs" | "folder", "capabilities": "dropped" | "none held", "seccomp": bool}``."""
    mounted = tmpfs and private_scratch(scratch, scratch_mb, max_inodes, drop_to)
    if not mounted and drop_to is not None and os.getuid() == 0:
        os.chown(scratch, drop_to, drop_to)  # the folder is the request's to write (the zygote wipes it)
        os.chmod(scratch, 0o700)
    caps = drop_capabilities()
    if drop_to is not None:
        drop_to_user(drop_to)
    seccomp = install_seccomp()
    return {"scratch": "tmpfs" if mounted else "folder", "capabilities": "dropped" if caps else "none held",
            "seccomp": seccomp}
