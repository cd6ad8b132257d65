"""The bubblewrap command: an interpreter under /tmp (a checkout's .venv there) stays visible."""

from __future__ import annotations

from pathlib import Path

import ait_env.sandbox.jail as sb


def test_an_interpreter_under_tmp_is_bound_after_the_private_tmp(tmp_path: Path) -> None:
    venv = Path("/tmp/some-checkout/.venv")
    argv = sb.bwrap_argv(tmp_path / "work", tmp_path / "runtime", roots=[str(venv)])
    tmpfs = argv.index("--tmpfs")
    assert argv[tmpfs + 1] == "/tmp"
    bind = next(i for i in range(len(argv) - 2) if argv[i:i + 3] == ["--ro-bind", str(venv), str(venv)])
    # mounted after the tmpfs, so the tmpfs does not hide it (bwrap applies mounts in order)
    assert tmpfs < bind
    assert ["--dir", "/tmp"] != argv[tmpfs + 2:tmpfs + 4] and "/tmp" not in [argv[i + 1] for i, a in enumerate(argv)
                                                                             if a == "--dir"]
    assert ["--perms", "0755", "--dir", "/tmp/some-checkout"] == argv[bind - 4:bind]
