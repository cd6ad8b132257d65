"""Hidden-eval seeds private per installation (issue 46, item 2): the first use makes them (random, mode 0600,
outside the checkout and anything the sandbox sees), the published ones are chosen explicitly, every result
names which scored it. (Agent code in the sandbox cannot read them: tests/probe/test_confinement.py.)"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ait_env.hidden import secrets as S
from task_families import FAMILY_NAMES

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def private(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """This test's process (and the processes it starts) on private seeds kept under ``tmp_path``."""
    path = tmp_path / "config" / "ai-trains-ai" / "secrets.json"
    monkeypatch.setenv("AIT_SECRETS_FILE", str(path))
    monkeypatch.setenv("AIT_HIDDEN_SEEDS", "private")
    return path


def test_the_first_use_creates_random_private_seeds_for_every_family(private: Path) -> None:
    assert not private.exists()
    seeds = S.current()
    assert seeds.source == "private" and private.is_file()
    assert stat.S_IMODE(private.stat().st_mode) == 0o600 and stat.S_IMODE(private.parent.stat().st_mode) == 0o700
    data = json.loads(private.read_text())
    assert set(data) == set(FAMILY_NAMES) and all(0 <= v < 2**63 for v in data.values())
    assert not set(data.values()) & set(S.DEFAULT_SEEDS.values())
    assert S.current() == seeds and S.hidden_seeds_label() == seeds.label        # stable once made
    assert seeds.label.startswith("private:") and len(seeds.label) == len("private:") + 8
    assert str(data["arithmetic"]) not in seeds.label
    for family in ("arithmetic", "warehouse"):   # other sets than the published ones
        assert S.hidden_set_hash(family) != S.hidden_set_hash(family, S.PUBLISHED)
    assert json.loads(S.worker_secrets_json() or "{}") == data and S.worker_secrets_json(S.PUBLISHED) is None


def test_two_installations_draw_different_seeds(tmp_path: Path) -> None:
    a, b = S.private_seeds(tmp_path / "a" / "s.json"), S.private_seeds(tmp_path / "b" / "s.json")
    assert a.seeds != b.seeds and a.label != b.label


def test_processes_starting_at_once_share_one_set(private: Path) -> None:
    code = "from ait_env.hidden.secrets import current; print(current().label)"
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True, cwd=ROOT) for _ in range(4)]
    labels = {p.communicate(timeout=120)[0].strip() for p in procs}
    assert len(labels) == 1 and labels == {S.current().label}


def test_a_family_the_file_lacks_gets_a_seed_and_the_others_stay(private: Path) -> None:
    private.parent.mkdir(parents=True)
    private.write_text(json.dumps({"arithmetic": 123456789}))
    private.chmod(0o600)
    seeds = S.current()
    assert seeds.seed("arithmetic") == 123456789 and set(dict(seeds.seeds)) == set(FAMILY_NAMES)
    assert json.loads(private.read_text())["arithmetic"] == 123456789


def test_the_published_seeds_are_an_explicit_choice(monkeypatch: pytest.MonkeyPatch, private: Path) -> None:
    monkeypatch.delenv("AIT_HIDDEN_SEEDS")
    assert S.current().source == "private"                       # unset: private
    monkeypatch.setenv("AIT_HIDDEN_SEEDS", "published")
    assert S.current() is S.PUBLISHED and S.hidden_seeds_label() == "published"
    assert S.hidden_set_hash("arithmetic") == "3533a68ee85abdcb"  # what the pinned baselines were measured on
    monkeypatch.setenv("AIT_HIDDEN_SEEDS", "public")
    with pytest.raises(S.SecretsError, match="use 'private' .* or 'published'"):
        S.current()
    # an entry point's default yields to the command line, then to the environment
    monkeypatch.setenv("AIT_HIDDEN_SEEDS", "published")
    assert S.default_hidden_seeds("private").source == "published"
    assert S.default_hidden_seeds("published", "private").source == "private"
    assert os.environ["AIT_HIDDEN_SEEDS"] == "private"          # children inherit the choice


@pytest.mark.parametrize("where", ["checkout", "python"])
def test_a_file_the_sandbox_could_read_is_refused_with_the_fix(monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    inside = (ROOT / "runs" if where == "checkout" else Path(sys.prefix)) / "ait-secrets-test" / "s.json"
    monkeypatch.setenv("AIT_SECRETS_FILE", str(inside))
    monkeypatch.setenv("AIT_HIDDEN_SEEDS", "private")
    with pytest.raises(S.SecretsError, match="the sandbox binds read-only.*Set AIT_SECRETS_FILE to a path in your home"):
        S.current()
    assert not inside.parent.exists()


def test_a_file_others_may_read_is_refused_with_the_fix(private: Path) -> None:
    S.current()
    private.chmod(0o644)
    with pytest.raises(S.SecretsError, match=f"chmod 600 {private}"):
        S.private_seeds(private)


def test_a_broken_file_is_refused_with_the_fix(private: Path) -> None:
    private.parent.mkdir(parents=True)
    private.write_text('{"arithmetic": "x"}')
    private.chmod(0o600)
    with pytest.raises(S.SecretsError, match="must be a JSON object"):
        S.current()


def test_the_local_models_build_keeps_the_published_sets(private: Path) -> None:
    """The pinned weights match whatever a run scores with: the fingerprint hashes the published sets."""
    from cpu.tiny_models import catalog

    mine = {name: catalog.fingerprint(name) for name in catalog.CATALOG}
    os.environ["AIT_HIDDEN_SEEDS"] = "published"   # restored by the private fixture's monkeypatch
    assert {name: catalog.fingerprint(name) for name in catalog.CATALOG} == mine


def test_every_episode_and_every_result_names_its_seeds(make_env, monkeypatch: pytest.MonkeyPatch,
                                                        private: Path) -> None:
    from ait_env.backends.stub import StubBackend
    from ait_env.config import compose
    from ait_env.jobs.result import JobResult

    env = make_env(family="arithmetic")
    _, info = env.reset(seed=0)
    assert info["hidden_seeds"] == S.current().label
    monkeypatch.setenv("AIT_HIDDEN_SEEDS", "published")
    _, info = env.reset(seed=0)
    assert info["hidden_seeds"] == "published"
    # a result scored with other seeds than the run's (a GPU worker given none) is ours, with the fix
    backend = StubBackend(compose(backend="stub").backend)
    ok = JobResult(job_id="j", backend="gpu", status="succeeded", post_score=0.5, hidden_seeds="published")
    assert backend.check_hidden_seeds(ok) == ok
    monkeypatch.setenv("AIT_HIDDEN_SEEDS", "private")
    lost = backend.check_hidden_seeds(ok)
    assert lost.status == "infra_failed" and "scored with the published hidden-eval seeds" in lost.error
    assert "AIT_SECRETS_JSON" in lost.error and "ait_seeds" in lost.error
    assert backend.check_hidden_seeds(ok.model_copy(update={"hidden_seeds": ""})).status == "succeeded"
