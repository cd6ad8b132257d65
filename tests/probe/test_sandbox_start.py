"""A sandbox falls back to its weaker mode only when bubblewrap itself refuses, and always says why;
a start interrupted by close() or a zygote that fails is an error, never a weaker sandbox (issue:
untrusted submissions, item 6)."""

from __future__ import annotations

import stat
import time

import pytest

pytest.importorskip("verifiers")

import ait_env.sandbox.jail as sandbox_mod  # noqa: E402  (where the launch looks bubblewrap up)
from ait_env.sandbox import Sandbox, SandboxError, bwrap_path  # noqa: E402


def _fake_bwrap(tmp_path, stderr: str):
    script = tmp_path / "bwrap"
    script.write_text(f"#!/bin/sh\necho '{stderr}' >&2\nexit 1\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


@pytest.mark.skipif(bwrap_path() is None, reason="needs bubblewrap")
@pytest.mark.parametrize("delay", [0.0, 0.3, 1.0])
def test_close_while_starting_never_falls_back(capfd, delay):
    sb = Sandbox()
    thread = sb.warm()
    time.sleep(delay)
    sb.destroy()  # what the interpreter's exit does while an env's sandbox is still warming up
    thread.join(60)
    assert not thread.is_alive()
    assert sb.settings.mode == "auto" and sb.mode != "fallback"
    assert "FALLING BACK" not in capfd.readouterr().err


def test_bubblewraps_refusal_falls_back_and_says_why(tmp_path, monkeypatch, capfd):
    reason = "bwrap: Creating new namespace failed: Operation not permitted"
    fake = _fake_bwrap(tmp_path, reason)
    monkeypatch.setattr(sandbox_mod, "bwrap_path", lambda: fake)
    sb = Sandbox()
    try:
        sb.new_workdir()
        assert sb.mode == "fallback"
        assert reason in sb.description and reason in sb.fallback_reason
        err = capfd.readouterr().err
        assert f"bubblewrap failed to start ({reason})" in err and "WEAKER MODE" in err
    finally:
        sb.destroy()


def test_a_failing_zygote_is_an_error_not_a_fallback(tmp_path, monkeypatch, capfd):
    fake = _fake_bwrap(tmp_path, "Traceback (most recent call last): ImportError: no module named verifiers")
    monkeypatch.setattr(sandbox_mod, "bwrap_path", lambda: fake)
    sb = Sandbox()
    try:
        with pytest.raises(SandboxError, match="did not start"):
            sb.new_workdir()
        assert sb.mode != "fallback" and sb.settings.mode == "auto"
        assert "FALLING BACK" not in capfd.readouterr().err
    finally:
        sb.destroy()



def test_the_agents_code_runs_under_the_interpreter_the_settings_name(tmp_path, make_env):
    """``probe.sandbox.python``: the interpreter with the inner stack (an outer loop on another verifiers names
    the project's venv); the jail binds its roots. The reference job validates under it; an interpreter that is
    not an executable is refused, saying what to set."""
    import sys
    from pathlib import Path

    from ait_env.agents.reference import ScriptedReferenceAgent
    from ait_env.sandbox import SandboxSettings
    from tests.helpers import play

    venv_python = str(Path(sys.prefix) / "bin" / "python")   # as a user names it, not resolved
    env = make_env(family="arithmetic", overrides={"env": {"probe": {"sandbox": {"python": venv_python}}}})
    *_, info = play(env, ScriptedReferenceAgent(), seed=0)
    assert info["reward"]["status"] == "scored" and info["reward"]["validated_attempt"] == 1, info["reward"]
    bad = Sandbox(SandboxSettings(python=str(tmp_path / "no-python")))
    try:
        with pytest.raises(SandboxError, match="probe.sandbox.python"):
            bad.new_workdir()
    finally:
        bad.destroy()
