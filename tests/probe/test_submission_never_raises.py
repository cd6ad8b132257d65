"""No submission, however hostile, makes ``env.step`` raise; cleanup survives any tree agent code
leaves behind (issue: untrusted submissions, item 1)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("verifiers")

from ait_env.sandbox import remove_tree  # noqa: E402
from hostile import OS, call, reference, submit, with_env, with_job  # noqa: E402

DEPTH = 3000  # deeper than Python's recursion limit and than PATH_MAX allows as one path


def _deep_tree(root: Path, depth: int = DEPTH) -> None:
    """A chain of ``depth`` nested folders (made with relative paths, as agent code would)."""
    code = (f"import os\nos.chdir({str(root)!r})\n"
            f"for _ in range({depth}):\n    os.mkdir('d')\n    os.chdir('d')\nopen('leaf', 'w').write('x')\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_remove_tree_survives_a_tree_deeper_than_recursion_and_path_limits(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    _deep_tree(tree)
    with pytest.raises((RecursionError, OSError)):
        shutil.rmtree(tree)  # what cleanup used: it fails on such a tree and leaves it on the host
    assert remove_tree(tree, timeout_s=120)
    assert not tree.exists()


def test_a_folder_without_permissions_is_removed(tmp_path):
    tree = tmp_path / "locked"
    (tree / "inner").mkdir(parents=True)
    (tree / "inner" / "f").write_text("x")
    (tree / "inner").chmod(0)
    assert remove_tree(tree) and not tree.exists()


DEEP_TREE_IN_WORKDIR = (f"    _here = os.getcwd()\n    for _ in range({DEPTH}):\n        os.mkdir('d')\n"
                        "        os.chdir('d')\n    os.chdir(_here)\n")


@pytest.mark.parametrize("mode", ["auto", "fallback"])
def test_agent_code_that_leaves_a_deep_tree_does_not_break_the_episode(make_env, mode):
    """In the fallback sandbox the request folder is writable: the tree lands on the host and the
    cleanup must remove it; in bubblewrap mode the folder is read-only and the tree cannot be made."""
    env = make_env(family="arithmetic", overrides={"env": {"max_attempts": 1, "probe": {"sandbox": {"mode": mode}}}})
    obs, info = submit(env, with_env(prefix=OS, before_load=DEEP_TREE_IN_WORKDIR))
    assert info["reward"]["status"] in ("scored", "invalid"), obs
    sandbox = env.unwrapped.probe.dynamic.sandbox
    assert not sandbox.request_folders(), "the request folder was left on the host"


@pytest.mark.parametrize("value", ["1979-05-27T07:32:00Z", "1979-05-27", "07:32:00", "nan", "inf", "-inf",
                                   "[1, 2, [3, 1979-05-27]]", "{ when = 07:32:00 }"])
def test_env_values_json_cannot_carry_are_a_schema_failure(make_env, value):
    env = make_env(family="arithmetic")
    obs, info = submit(env, with_job("[env]\n", f"[env]\nwhen = {value}\n"))
    assert "reward" not in info, "a schema failure costs an attempt, it does not end the episode"
    assert "validation failed" in obs and "job.toml: env" in obs
    assert "JSON" in obs or "finite" in obs


def test_job_toml_nested_past_the_parsers_recursion_is_a_schema_failure(make_env):
    env = make_env(family="arithmetic")
    obs, info = submit(env, with_job("[env]\n", "[env]\nx = " + "[" * 600 + "]" * 600 + "\n"))
    assert "validation failed" in obs and "nests too deeply" in obs


def test_an_unexpected_error_in_submit_is_infra_failed_not_an_exception(make_env, monkeypatch):
    env = make_env(family="arithmetic")
    probe = env.unwrapped.probe

    def broken(*a, **kw):
        raise KeyError("a bug of ours")

    monkeypatch.setattr(probe, "run", broken)
    obs, info = submit(env, reference())
    assert info["reward"]["status"] == "infra_failed" and info["reward"]["drop"] is True
    assert "internal error on our side" in obs and "not counted against you" in obs


# ---------------------------------------------------------------- fuzz: hostile workspaces and job files
TOML_VALUES = st.sampled_from([
    "1979-05-27T07:32:00Z", "nan", "inf", "-0.0", "9223372036854775807", '"\\u0000"', "[]", "{}",
    '"' + "x" * 3000 + '"', "[" * 40 + "]" * 40, "{ a = { b = { c = 1 } } }", "true", '"\U0001F600"',
    "1979-05-27", "[1, 'a', 2.5]", "-9223372036854775808",
])
ENV_SNIPPETS = st.sampled_from([
    "",
    DEEP_TREE_IN_WORKDIR,
    "    os.write(os.open(os.environ.get('TMPDIR', '.') + '/big', os.O_WRONLY | os.O_CREAT), b'x' * 50_000_000)\n",
    "    [os.close(os.open(os.environ.get('TMPDIR', '.') + f'/f{i}', os.O_WRONLY | os.O_CREAT)) for i in range(50_000)]\n",
    "    os.symlink('/etc/passwd', 'link')\n",
    "    os.chmod('.', 0)\n",
    "    import sys as _s; _s.stdout.write('\\x00\\xff' * 1000); _s.stdout.flush()\n",
    "    raise RecursionError('deep')\n",
    "    def _r(n): return _r(n + 1)\n    _r(0)\n",
    "    os.kill(os.getppid(), 9)\n",
    "    os.setsid()\n    os.fork()\n",
    "    raise SystemExit(0)\n",
    "    os._exit(0)\n",
])
RUBRICS = st.sampled_from(["1.0 if 'x' else 0.0", "float('nan')", "float('inf')", "'text'", "None", "[1]",
                           "1e308 * 10", "(_ for _ in ()).throw(ValueError('x'))"])
FILE_NAMES = st.sampled_from(["environment.py"] * 6 + ["verifiers.py", "json.py", "__init__.py", "a/b/c.py",
                              "x.y.py", "éñv.py", "family_tools.py", "env.txt", "-.py"])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=TOML_VALUES, snippet=ENV_SNIPPETS, rubric=RUBRICS, name=FILE_NAMES, use_rubric=st.booleans())
def test_hostile_submissions_never_raise(make_env, value, snippet, rubric, name, use_rubric):
    env = make_env(family="arithmetic", overrides={"env": {"max_attempts": 1}})
    env.reset(seed=0)
    files = with_env(prefix=OS, before_load=snippet)
    if use_rubric:
        files["environment.py"] = files["environment.py"].replace(
            "rubric = vf.Rubric(funcs=[correct_answer, calculator_use], weights=[0.9, 0.1])",
            f"rubric = vf.Rubric(funcs=[lambda completion, **kw: {rubric}], weights=[1.0])")
    files["job.toml"] = files["job.toml"].replace("[env]\n", f"[env]\nhostile = {value}\n") \
        .replace('environment = "environment.py"', f'environment = "{name}"')
    if name != "environment.py":
        files[name] = files.pop("environment.py")
    for path, text in files.items():
        env.step(call("write_file", path=path, content=text))
    obs, reward, terminated, truncated, info = env.step(call("submit_job"))
    assert isinstance(obs, str) and isinstance(reward, float)
    assert terminated and info["reward"]["status"] in ("scored", "invalid", "unparsable"), obs[-600:]
    sandbox = env.unwrapped.probe.dynamic.sandbox
    assert not sandbox.request_folders(), "a request folder was left on the host"


def test_reference_still_validates_after_the_fuzz(make_env):
    env = make_env(family="arithmetic")
    obs, info = submit(env, reference())
    assert info["reward"]["status"] == "scored", obs
