"""gymnasium's own checker, run from a script outside the repository (as a user would)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


@pytest.mark.parametrize("family", ["train", "warehouse"])
def test_check_env_outside_repo(tmp_path, family):
    script = textwrap.dedent(f"""
        import warnings
        import gymnasium as gym
        from gymnasium.utils.env_checker import check_env
        import ait_env
        assert ait_env.__file__ and gym.spec("AIT/JobWriting-v0").nondeterministic
        env = gym.make("AIT/JobWriting-v0", backend="stub", family={family!r}, overrides={{"env": {{"runs_dir": {str(tmp_path / 'runs')!r}}}}})
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_env(env.unwrapped)
        bad = [str(w.message) for w in caught if "precision" not in str(w.message)]
        print("WARNINGS", bad)
        print("CHECK_ENV_OK")
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "CHECK_ENV_OK" in proc.stdout
    assert "WARNINGS []" in proc.stdout, proc.stdout  # check_env warns about nothing (float precision aside)
