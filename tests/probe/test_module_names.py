"""The code that trains is the code that was validated: an agent module named like an installed one is
refused, and the probe imports the agent's package exactly the way prime-rl imports the bundle
(issue: untrusted submissions, item 5)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("verifiers")

from ait_env.jobs.bundle import build_bundle, write_env_package  # noqa: E402
from ait_env.jobs.schema import parse_job  # noqa: E402
from hostile import bundle_of, reference, submit, with_job  # noqa: E402
from task_families import get_family  # noqa: E402

SHADOWING = ["verifiers.py", "datasets.py", "json.py", "typing.py", "torch.py", "vllm.py", "prime_rl.py",
             "numpy.py", "openai.py", "ait_env.py"]


def _as(name: str) -> dict[str, str]:
    files = with_job('environment = "environment.py"', f'environment = "{name}"')
    files[name] = files.pop("environment.py")
    return files


@pytest.mark.parametrize("name", SHADOWING)
def test_an_environment_file_named_like_an_installed_module_is_refused(make_env, name):
    obs, info = submit(make_env(family="arithmetic"), _as(name))
    assert "[module_name]" in obs and f"'{name[:-3]}' is also the name of an installed module" in obs, obs


def test_a_helper_package_named_like_an_installed_one_is_refused(make_env):
    files = reference()
    files["datasets/__init__.py"] = "X = 1\n"
    obs, info = submit(make_env(family="arithmetic"), files)
    assert "[module_name] datasets/" in obs, obs


def test_an_unusual_but_free_name_validates(make_env):
    obs, info = submit(make_env(family="arithmetic"), _as("my_arith_env.py"))
    assert info["reward"]["status"] == "scored", obs


def _load_like_primerl(src_parent, env_id: str, preload: str) -> str:
    """Import ``env_id`` the way prime-rl does (verifiers.load_environment) after ``preload`` was imported,
    in a fresh interpreter; returns the file of the load_environment it got."""
    code = (f"import sys; sys.path.insert(0, {str(src_parent)!r})\nimport {preload}\n"
            "from verifiers.utils.env_utils import import_env_module\n"
            f"m = import_env_module({env_id!r})\nprint(m.load_environment.__code__.co_filename)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]


def test_even_a_shadowing_name_resolves_to_the_agents_file_in_the_bundle(tmp_path):
    """Defence in depth: the generated package imports the agent's module relatively, so even a
    name the static check missed cannot resolve to an installed module under prime-rl."""
    bundle = bundle_of(_as("verifiers.py"), tmp_path)
    got = _load_like_primerl(bundle.root / "src", bundle.manifest.env_id, preload="verifiers")
    assert got == str(bundle.package_dir / "verifiers.py")


def test_the_probe_and_the_bundle_lay_out_the_same_package(tmp_path):
    files = reference()
    ws = tmp_path / "ws"
    ws.mkdir()
    for k, v in files.items():
        (ws / k).write_text(v)
    job, _ = parse_job(files["job.toml"])
    fam = get_family("arithmetic")
    bundle = build_bundle(ws, job, fam, tmp_path / "jobs")
    probe_pkg = write_env_package(ws, job, fam, tmp_path / "probe", "ait_job_probe")
    listing = lambda root: sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())  # noqa: E731
    assert listing(probe_pkg) == listing(bundle.package_dir)
    for rel in listing(probe_pkg):
        if rel != "__init__.py":  # the package's own name appears in its docstring
            assert (probe_pkg / rel).read_bytes() == (bundle.package_dir / rel).read_bytes()


@pytest.mark.parametrize("path", ["\uff46amily_tools.py", "\uff56erifiers/__init__.py", "helpers/\ufb01le.py"])
def test_a_name_that_aliases_another_module_under_nfkc_is_refused(make_env, path):
    """Python normalises identifiers (NFKC): a file named with a full-width letter or a ligature is imported
    under another name, the family's tool module's, an installed package's or another file's (issue 46)."""
    files = reference()
    files[path] = "from family_tools import TOOLS\n"
    obs, info = submit(make_env(family="arithmetic"), files)
    assert "[module_name]" in obs and "NFKC" in obs, obs


def test_an_environment_named_to_alias_the_tool_module_is_refused(make_env):
    obs, info = submit(make_env(family="arithmetic"), _as("\uff46amily_tools.py"))
    assert "[module_name]" in obs and "'family_tools'" in obs, obs
