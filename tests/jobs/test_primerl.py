"""The prime-rl v0.7.0 adapter: golden rl.toml files, prime-rl's rules, invalid jobs.

Goldens: ``tests/golden/rl_toml/`` (regenerate with ``python tests/golden/regen.py`` and review the
diff). Invalid jobs: ``tests/jobs/invalid/*.toml``; each names what it must be rejected with in
comment lines::

    # expect-field: prime_rl.batch_size      (in the issue's location or message)
    # expect: divisible by group_size (8)    (in the issue's message or fix; repeatable)
    # prompt-tokens: 300                     (for check_primerl_rules; default 200)
    # max-turns: 4                           (default 4)

The cross-check against prime-rl's own config loader runs only when ``AIT_PRIMERL_CONFIGS_PYTHON``
is the python of a venv with prime-rl v0.7.0's ``packages/prime-rl-configs`` installed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import tomllib
from pathlib import Path

import pytest
import tomli_w

from ait_env.jobs import primerl
from ait_env.jobs.primerl import (
    MODEL_RENDERER_MAP,
    OPTIM_PARAMS,
    PrimeRLRenderError,
    RenderOptions,
    config_rules,
    final_weights_dir,
    render_rl_toml,
    token_budget_rule,
)
from ait_env.jobs.schema import Job, JobIssue, check_bounds, parse_job
from task_families import FAMILY_NAMES
from task_families.base import Bounds

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
INVALID_DIR = HERE / "invalid"
VALIDATOR = HERE / "primerl_validate.py"

_spec = importlib.util.spec_from_file_location("ait_golden_regen", ROOT / "tests" / "golden" / "regen.py")
regen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(regen)

#: The stub backend's bounds (conf/backend/stub.yaml).
BOUNDS = Bounds(base_models=["Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B"], max_steps=200, max_batch_size=512,
                max_group_size=32, max_seq_len=8192, max_tokens=2048)


def check_primerl_rules(job: Job, *, prompt_tokens: int, max_turns: int) -> list[JobIssue]:
    """Every prime-rl rule on a parsed job, as the probe applies them (static, then dynamic stage)."""
    return config_rules(job) + token_budget_rule(job, prompt_tokens=prompt_tokens, max_turns=max_turns)


def _job(text: str) -> Job:
    job, issues = parse_job(text)
    assert job is not None, issues
    return job


def _arith_text(**subs: str) -> str:
    text = regen.family_job_text("arithmetic")
    for old, new in subs.items():
        assert old in text
        text = text.replace(old, new, 1)
    return text


# ----------------------------------------------------------------------------- goldens

@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_family_reference_golden(family: str) -> None:
    text = regen.family_job_text(family)
    if text is None:
        pytest.skip(f"task_families/{family}/reference/job.toml does not exist yet")
    golden = regen.golden_path(family)
    if not golden.is_file():
        pytest.fail(f"no golden for family {family!r}: run `python tests/golden/regen.py` "
                    f"and review {golden}")
    assert regen.render_case(family, text) == golden.read_text(encoding="utf-8"), (
        f"rendered rl.toml for {family!r} differs from {golden}; if the change is intended, "
        "run `python tests/golden/regen.py` and review the diff")


VARIANTS = sorted(p.stem for p in regen.VARIANTS_DIR.glob("*.toml"))


@pytest.mark.parametrize("variant", VARIANTS)
def test_variant_golden(variant: str) -> None:
    name = f"variant_{variant}"
    text = (regen.VARIANTS_DIR / f"{variant}.toml").read_text(encoding="utf-8")
    assert regen.render_case(name, text) == regen.golden_path(name).read_text(encoding="utf-8")


def test_goldens_have_cases() -> None:
    """No stale golden files: each one belongs to a family reference or a variant."""
    names = set(regen.cases())
    stale = [p.name for p in regen.GOLDEN_DIR.glob("*.toml") if p.stem not in names]
    assert not stale, f"golden files without a case (delete them): {stale}"


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_family_reference_passes_rules(family: str) -> None:
    text = regen.family_job_text(family)
    if text is None:
        pytest.skip(f"task_families/{family}/reference/job.toml does not exist yet")
    job = _job(text)
    assert check_bounds(job, BOUNDS, family) == []
    assert check_primerl_rules(job, prompt_tokens=0, max_turns=1) == []


@pytest.mark.parametrize("variant", VARIANTS)
def test_variants_pass_rules(variant: str) -> None:
    job = _job((regen.VARIANTS_DIR / f"{variant}.toml").read_text(encoding="utf-8"))
    assert check_bounds(job, BOUNDS, "arithmetic") == []
    assert check_primerl_rules(job, prompt_tokens=200, max_turns=2) == []


# ----------------------------------------------------------------------------- mapping details

def test_every_prime_rl_field_is_mapped() -> None:
    text = (regen.VARIANTS_DIR / "muon_linear_ipo_maxrl.toml").read_text(encoding="utf-8")
    job = _job(text)
    cfg = tomllib.loads(render_rl_toml(job, env_id="ait_job_x", output_dir="/o"))
    assert cfg["max_steps"] == 40 and cfg["seq_len"] == 4096 and cfg["output_dir"] == "/o"
    assert cfg["model"] == {"name": "Qwen/Qwen3-0.6B"}
    o = cfg["orchestrator"]
    assert (o["batch_size"], o["group_size"]) == (256, 16)
    assert o["train"]["sampling"] == {"temperature": 0.8, "max_completion_tokens": 512}
    assert o["algo"] == {"type": "max_rl"}
    assert o["renderer"] == {"name": "qwen3"}
    assert o["train"]["env"] == [{"id": "ait_job_x", "name": "arithmetic",
                                  "args": {"num_examples": 3000, "seed": 7, "difficulty": [0.2, 0.9]}}]
    assert "eval" not in o
    t = cfg["trainer"]
    assert t["optim"] == {"type": "muon", "lr": 2e-5, "weight_decay": 0.01, "max_norm": 1.0,
                          "mu": 0.9, "betas1": 0.9, "betas2": 0.95}   # prime-rl's muon betas2 default
    assert t["scheduler"] == {"type": "linear", "warmup_steps": 4, "decay_steps": 20, "min_lr": 1e-6}
    assert t["loss"] == {"type": "ipo", "ipo_threshold": 0.2, "adv_tau": 1.0, "kl_tau": 1e-3}
    assert cfg["ckpt"] == {} and t["ckpt"] == {"weights_only": True}
    assert "wandb" not in cfg and "wandb" not in t and "wandb" not in o
    assert cfg["inference"] == {}


def test_weights_location() -> None:
    job = _job(_arith_text())
    assert final_weights_dir(job, "/runs/j1/outputs") == Path("/runs/j1/outputs/weights/step_60")


def test_render_options_for_eval_and_thinking() -> None:
    job = _job(_arith_text())
    cfg = tomllib.loads(render_rl_toml(job, env_id="e", output_dir="o", options=RenderOptions(
        eval_env=True, enable_thinking=False, renderer="prime-qwen3")))
    o = cfg["orchestrator"]
    assert o["eval"]["env"] == [{"id": "e", "name": "arithmetic",
                                 "args": {"num_examples": 4000, "seed": 12345}}]
    assert o["eval"]["sampling"]["temperature"] == 0.0
    # enable_thinking only exists on the qwen3 renderer config
    assert o["renderer"] == {"name": "prime-qwen3"}


def test_render_refuses_an_invalid_job() -> None:
    job = _job(_arith_text(**{'base_model = "Qwen/Qwen3-1.7B"': 'base_model = "my-org/my-model"'}))
    with pytest.raises(PrimeRLRenderError) as exc:
        render_rl_toml(job, env_id="e", output_dir="o")
    assert exc.value.issues[0].where == "job.toml: job.base_model"
    # an explicit renderer makes any model renderable (prime-rl only rejects renderer "auto")
    out = render_rl_toml(job, env_id="e", output_dir="o", options=RenderOptions(renderer="qwen3"))
    assert 'name = "my-org/my-model"' in out


def test_rules_are_silent_on_a_good_job_and_budget_boundary() -> None:
    job = _job(_arith_text())   # seq_len 2048, max_tokens 256
    assert check_primerl_rules(job, prompt_tokens=2048 - 6 * 256, max_turns=6) == []
    issues = check_primerl_rules(job, prompt_tokens=2048 - 6 * 256 + 1, max_turns=6)
    assert [i.where for i in issues] == ["job.toml: prime_rl.seq_len"]
    assert "2049 tokens exceeds seq_len (2048)" in issues[0].message
    with pytest.raises(ValueError):
        check_primerl_rules(job, prompt_tokens=-1, max_turns=1)


def test_prompt_alone_too_long() -> None:
    job = _job(_arith_text())
    (issue,) = check_primerl_rules(job, prompt_tokens=5000, max_turns=2)
    assert "shorten the prompt" in issue.fix


def test_optimizer_table_defaults_follow_type() -> None:
    for kind, params in OPTIM_PARAMS.items():
        text = _arith_text(**{'type = "adamw"': f'type = "{kind}"'})
        cfg = tomllib.loads(render_rl_toml(_job(text), env_id="e", output_dir="o"))
        assert set(cfg["trainer"]["optim"]) == {"type", "lr", "weight_decay", "max_norm", *params}
        for k, v in params.items():
            assert cfg["trainer"]["optim"][k] == v


def test_renderer_map_covers_allowed_models() -> None:
    for model in BOUNDS.base_models:
        assert MODEL_RENDERER_MAP[model] == "qwen3"


# ----------------------------------------------------------------------------- invalid jobs

def _directives(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.startswith("# ") and ":" in line:
            key, value = line[2:].split(":", 1)
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def _all_issues(text: str, prompt_tokens: int, max_turns: int) -> list[JobIssue]:
    job, issues = parse_job(text)
    if job is None:
        return issues
    return check_bounds(job, BOUNDS, "arithmetic") + check_primerl_rules(
        job, prompt_tokens=prompt_tokens, max_turns=max_turns)


INVALID = sorted(p.name for p in INVALID_DIR.glob("*.toml"))


def test_enough_invalid_cases() -> None:
    assert len(INVALID) >= 10


@pytest.mark.parametrize("name", INVALID)
def test_invalid_job_is_rejected_with_field_and_range(name: str) -> None:
    text = (INVALID_DIR / name).read_text(encoding="utf-8")
    d = _directives(text)
    assert d.get("expect-field") and d.get("expect"), f"{name}: needs '# expect-field:' and '# expect:' lines"
    issues = _all_issues(text, int(d.get("prompt-tokens", ["200"])[0]), int(d.get("max-turns", ["4"])[0]))
    assert issues, f"{name} was accepted"
    field = d["expect-field"][0]
    matching = [i for i in issues
                if field in i.where + " " + i.message
                and all(e.lower() in (i.message + " " + i.fix).lower() for e in d["expect"])]
    assert matching, f"{name}: no issue names {field!r} with {d['expect']}; got:\n" + "\n".join(
        f"  {i.where}: {i.message} | {i.fix}" for i in issues)


# ----------------------------------------------------------------------------- cross-check with prime-rl

PRIMERL_PY = os.environ.get("AIT_PRIMERL_CONFIGS_PYTHON", "")
crosscheck = pytest.mark.skipif(
    not PRIMERL_PY or not Path(PRIMERL_PY).is_file(),
    reason="set AIT_PRIMERL_CONFIGS_PYTHON to a python with prime-rl v0.7.0 prime-rl-configs installed")


def _run_validator(*args: str) -> list[dict]:
    proc = subprocess.run([PRIMERL_PY, str(VALIDATOR), *args], capture_output=True, text=True, timeout=600,
                          cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


@crosscheck
def test_goldens_validate_with_prime_rl() -> None:
    paths = sorted(str(p) for p in regen.GOLDEN_DIR.glob("*.toml"))
    assert paths
    results = _run_validator("validate", *paths)
    assert len(results) == len(paths)
    failed = [(r["path"], r["error"]) for r in results if not r["ok"]]
    assert not failed, failed
    for r in results:
        res = r["resolved"]
        assert res["trainer.ckpt.weights"] is True and res["wandb"] is False
        assert res["trainer.model.seq_len"] == res["orchestrator.seq_len"]


def _mutate(cfg: dict, path: str, value: object) -> dict:
    cfg = json.loads(json.dumps(cfg))
    node = cfg
    *parents, last = path.split(".")
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node.setdefault(p, {})
    if value is _DELETE:
        node.pop(last, None)
    else:
        node[last] = value
    return cfg


_DELETE = object()

#: (name, [(dotted path, value)], expected: None = accepted, else a substring of prime-rl's error)
PRIMERL_CASES: list[tuple[str, list[tuple[str, object]], str | None]] = [
    ("batch_not_divisible", [("orchestrator.batch_size", 100)], "divisible"),
    ("temperature_above_2", [("orchestrator.train.sampling.temperature", 2.5)], "less than or equal to 2"),
    ("temperature_negative", [("orchestrator.train.sampling.temperature", -0.1)],
     "greater than or equal to 0"),
    ("unknown_key", [("trainer.optim.learning_rate", 1e-6)], "Extra inputs are not permitted"),
    ("sgd_with_betas", [("trainer.optim.type", "sgd")], "Extra inputs are not permitted"),
    ("adamw_with_mu", [("trainer.optim.mu", 0.9)], "Extra inputs are not permitted"),
    ("bad_optimizer_type", [("trainer.optim.type", "adam")], "adam"),
    ("bad_scheduler_type", [("trainer.scheduler.type", "step")], "step"),
    ("bad_algo_type", [("orchestrator.algo.type", "ppo")], "ppo"),
    ("negative_lr", [("trainer.optim.lr", -1.0)], "greater than or equal to 0"),
    ("auto_renderer_unknown_model", [("orchestrator.renderer", {"name": "auto"}),
                                     ("model.name", "Qwen/Qwen2.5-1.5B-Instruct")], "MODEL_RENDERER_MAP"),
    # accepted by prime-rl's config loader:
    ("auto_renderer_qwen3_0.6b", [("orchestrator.renderer", {"name": "auto"}),
                                  ("model.name", "Qwen/Qwen3-0.6B")], None),
    ("auto_renderer_qwen3_1.7b", [("orchestrator.renderer", {"name": "auto"})], None),
    ("max_tokens_alias", [("orchestrator.train.sampling.max_completion_tokens", _DELETE),
                          ("orchestrator.train.sampling.max_tokens", 256)], None),
    ("rollouts_per_example_alias", [("orchestrator.group_size", _DELETE),
                                    ("orchestrator.rollouts_per_example", 8)], None),
    # scheduler rules are runtime asserts in src/prime_rl/trainer/scheduler.py, not config errors:
    ("cosine_warmup_ge_max_steps", [("trainer.scheduler.warmup_steps", 60)], None),
]


@crosscheck
def test_prime_rl_rejects_what_we_reject(tmp_path: Path) -> None:
    base = tomllib.loads((regen.GOLDEN_DIR / "arithmetic.toml").read_text(encoding="utf-8"))
    paths: dict[str, tuple[str, str | None]] = {}
    for name, edits, expected in PRIMERL_CASES:
        cfg = base
        for path, value in edits:
            cfg = _mutate(cfg, path, value)
        p = tmp_path / f"{name}.toml"
        p.write_text(tomli_w.dumps(cfg), encoding="utf-8")
        paths[str(p)] = (name, expected)
    results = _run_validator("validate", *paths)
    wrong = []
    for r in results:
        name, expected = paths[r["path"]]
        if expected is None and not r["ok"]:
            wrong.append(f"{name}: rejected: {r['error'][:500]}")
        if expected is not None and (r["ok"] or expected not in r["error"]):
            wrong.append(f"{name}: expected an error containing {expected!r}, "
                         f"got ok={r['ok']} {r['error'][:500]}")
    assert not wrong, "\n".join(wrong)


@crosscheck
def test_our_v070_facts_match_prime_rl() -> None:
    """Our mirrored key names and defaults equal prime-rl v0.7.0's config classes."""
    (facts,) = _run_validator("facts")
    for model, renderer in MODEL_RENDERER_MAP.items():
        assert facts["renderer_map"].get(model) == renderer, model
    common = {"lr", "weight_decay", "max_norm", "type"}
    for kind, params in OPTIM_PARAMS.items():
        theirs = facts["optim"][kind]
        for k, v in params.items():
            assert theirs[k] == v, (kind, k)
        # the optimizer fields we do not expose (sgd nesterov/momentum) keep prime-rl's defaults
        assert set(params) <= set(theirs) - common
    from ait_env.jobs import schema

    assert schema.Optim().lr == facts["optim"]["adamw"]["lr"]
    assert schema.Optim().weight_decay == facts["optim"]["adamw"]["weight_decay"]
    assert schema.Optim().max_norm == facts["optim"]["adamw"]["max_norm"]
    assert schema.DefaultLoss().model_dump() == facts["loss"]["default"]
    assert schema.IPOLoss().model_dump() == facts["loss"]["ipo"]
    assert schema.LinearScheduler().model_dump() == facts["scheduler"]["linear"]
    assert schema.CosineScheduler().model_dump() == facts["scheduler"]["cosine"]
    assert set(primerl.ALGO_TYPES.values()) <= set(facts["algo_types"])
    assert facts["temperature"] == {"default": 1.0, "ge": 0, "le": 2.0}
    wanted = {"batch_size", "group_size", "algo", "renderer", "train", "eval"}
    assert wanted <= set(facts["orchestrator_fields"])


def test_validator_script_is_standalone() -> None:
    """primerl_validate.py runs in prime-rl's venv: it must not import this project."""
    src = VALIDATOR.read_text(encoding="utf-8")
    assert "import ait_env" not in src and "from ait_env" not in src and "task_families" not in src
