"""The TRL environment class (ait_env.integrations.trl) without TRL: the contract TRL's ``GRPOTrainer``
relies on (reserved methods, tools with schemas, reset from a dataset row, get_reward), driven directly."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest

from task_families import reference_files
from ait_env.backends import make_backend
from ait_env.config import compose
from ait_env.integrations.trl import EnvironmentFactory, JobWritingToolEnv, prepare_tokenizer
from ait_env.episode.spec import strip_tool_sections, system_prompt
from ait_env.episode.tools import tool_schemas


def _factory(runs: Path, backend_overrides: dict[str, Any] | None = None, **env: Any) -> EnvironmentFactory:
    settings = compose(backend="stub", overrides={"backend": backend_overrides or {}})
    backend = make_backend(settings.backend, runs)
    overrides = {"env": {"runs_dir": str(runs), "probe": {"enabled": False}, **env}}
    return EnvironmentFactory(backend, family="arithmetic", overrides=overrides)


def _tools(env: JobWritingToolEnv) -> list[Any]:
    """The methods TRL exposes as tools: public functions of the class but ``reset`` and ``get_reward``."""
    return [getattr(env, n) for n, _ in inspect.getmembers(type(env), predicate=inspect.isfunction)
            if n not in ("reset", "get_reward") and not n.startswith("_")]


def _write_reference(env: JobWritingToolEnv) -> None:
    for path, content in reference_files("arithmetic", "Qwen/Qwen3-0.6B").items():
        assert env.write_file(path=path, content=content).startswith("wrote ")


def test_tools_are_the_envs_six_with_its_schemas(tmp_path: Path) -> None:
    get_json_schema = pytest.importorskip("transformers.utils").get_json_schema
    with _factory(tmp_path) as factory:
        schemas = {s["function"]["name"]: s["function"] for s in map(get_json_schema, _tools(factory()))}
    for want in tool_schemas():
        f = want["function"]
        got = schemas.pop(f["name"])
        assert got["description"] == f["description"]
        assert got["parameters"]["properties"] == f["parameters"]["properties"]
        assert got["parameters"].get("required", []) == f["parameters"]["required"]
    assert not schemas, f"tools the env does not have: {sorted(schemas)}"


def test_a_scored_episode_through_the_tools(tmp_path: Path) -> None:
    with _factory(tmp_path) as factory:
        env = factory()
        row = factory.dataset(1, seed=3)[0]
        task = env.reset(**row)
        assert task == env.info["messages"][1]["content"] and env.info["family"] == "arithmetic"
        assert "job.toml" in env.list_files()
        _write_reference(env)
        result = env.submit_job()
        assert "SURROGATE" in result and not result.startswith("<tool_response>")
        assert env.info["reward"]["status"] == "scored"
        assert env.get_reward() == pytest.approx(env.info["reward"]["total"]) and env.get_reward() > 0.5
        with pytest.raises(ValueError, match="episode is over"):
            env.list_files()
        assert env.info["turn"] == 4  # one env turn per tool call


def test_an_episode_trl_ends_early_is_scored_by_the_env(tmp_path: Path) -> None:
    with _factory(tmp_path, max_turns=5) as factory:
        env = factory()
        env.reset(family="arithmetic", instance=1, prompt=[])
        env.read_file(path="job.toml")
        assert env.get_reward() == pytest.approx(-0.1)  # no submission at all: unparsable
        assert env.info["reward"]["status"] == "unparsable" and env.info["turn"] == 5
        env.reset(family="arithmetic", instance=1, prompt=[])
        assert "validation failed" in env.submit_job()  # the template's placeholder model
        assert env.get_reward() == 0.0 and env.info["reward"]["status"] == "invalid"


def test_infra_failed_is_none_never_zero(tmp_path: Path) -> None:
    with _factory(tmp_path, {"cost_usd_per_job": 2.0}, ledger={"global_budget_usd": 1.0}) as factory:
        env = factory()
        env.reset(family="arithmetic", instance=2, prompt=[])
        _write_reference(env)
        assert "could not be dispatched" in env.submit_job()
        assert env.info["reward"]["drop"] and env.get_reward() is None


def test_reset_and_dataset(tmp_path: Path) -> None:
    with _factory(tmp_path, max_turns=7) as factory:
        rows = factory.dataset(6, seed=0)
        assert rows.column_names == ["prompt", "family", "instance"]
        assert rows["prompt"][0] == [{"role": "system", "content": strip_tool_sections(system_prompt(7, 3))},
                                     {"role": "user", "content": ""}]
        assert set(rows["family"]) == {"arithmetic"}
        assert rows["instance"] == factory.dataset(6, seed=0)["instance"]
        a, b = factory(), factory()
        assert a.reset(**rows[0]) == b.reset(**rows[0])  # a GRPO group shares the row's instance
        alone = a.reset()  # no dataset: the system prompt and a sampled task in one text
        assert alone.startswith(strip_tool_sections(system_prompt(7, 3))) and "# Tools" not in alone


def test_factory_shares_and_keeps_the_backend(tmp_path: Path) -> None:
    factory = _factory(tmp_path)
    envs = [factory(), factory()]
    assert all(e.env.unwrapped.backend is factory.backend for e in envs)
    for e in envs:
        e.reset(prompt=[])
    roots = [e.env.unwrapped.workspace.root for e in envs]
    factory.close()
    assert not any(r.exists() for r in roots) and not factory.backend.closed
    factory.backend.close()
    with pytest.raises(TypeError, match="make_backend"):
        EnvironmentFactory("stub")  # type: ignore[arg-type]


def test_prepare_tokenizer_only_touches_the_local_chat_format() -> None:
    from cpu.tiny_models.chat import CHAT_TEMPLATE

    class Tok:
        def __init__(self, template: str) -> None:
            self.chat_template = template
            self.response_template = None

    assert prepare_tokenizer(Tok(CHAT_TEMPLATE)).response_template is not None
    assert prepare_tokenizer(Tok("{{ messages }}")).response_template is None


def test_a_venv_without_verifiers_gets_the_static_probe_without_a_warning_per_env(tmp_path: Path,
                                                                                   monkeypatch) -> None:
    """TRL's venv cannot have verifiers: the factory asks for the static probe stage by setting, so no env
    warns that the `inner` extra (which cannot be installed there) is missing."""
    import importlib.util
    import warnings

    from ait_env.integrations.trl import static_probe_without_verifiers

    assert static_probe_without_verifiers(["env.max_turns=8"], has_verifiers=False) == \
        ["env.max_turns=8", "env.probe.enabled=false"]
    assert static_probe_without_verifiers({"env": {"runs_dir": "r"}}, has_verifiers=False) == \
        {"env": {"runs_dir": "r", "probe": {"enabled": False}}}
    assert static_probe_without_verifiers(["x=1"], has_verifiers=True) == ["x=1"]
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "verifiers" else real(name, *a))
    settings = compose(backend="stub")
    backend = make_backend(settings.backend, tmp_path)
    with warnings.catch_warnings(record=True) as caught, \
            EnvironmentFactory(backend, family="arithmetic", overrides={"env": {"runs_dir": str(tmp_path)}}) as factory:
        warnings.simplefilter("always")
        env = factory()
        env.reset(family="arithmetic", instance=1, prompt=[])
        _write_reference(env)
        assert "SURROGATE" in env.submit_job()  # the static stage validated it; the stub scored it
    backend.close()
    assert not [w for w in caught if "verifiers is not installed" in str(w.message)], [str(w.message) for w in caught]


def test_a_chatml_template_without_tools_gets_one_trl_can_train_and_parse() -> None:
    """SmolLM2-135M-Instruct's template renders no tools, so GRPOTrainer refuses it; the adapter gives it ChatML
    with Hermes tool calls, which TRL parses. Needs TRL and the agent model in the model cache (the main suite
    obtains it: python -m ait_env.agent_models.obtain)."""
    pytest.importorskip("trl")
    transformers = pytest.importorskip("transformers")
    from trl.chat_template_utils import add_response_schema, supports_tool_calling

    from ait_env.agent_models.catalog import model_dir

    folder = model_dir("smollm2-135m")
    if not (folder / "tokenizer.json").is_file():
        pytest.skip(f"the agent model is not in the model cache ({folder}): python -m ait_env.agent_models.obtain")
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert not supports_tool_calling(tok)
    tok = add_response_schema(prepare_tokenizer(tok))
    assert supports_tool_calling(tok)
    schema = {"type": "function", "function": {"name": "read_file", "description": "Read a file.", "parameters": {
        "type": "object", "properties": {"path": {"type": "string", "description": "a path"}}, "required": ["path"]}}}
    text = tok.apply_chat_template([{"role": "system", "content": "You write jobs."}, {"role": "user", "content": "Go."}],
                                   tools=[schema], tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nYou write jobs.") and '"name": "read_file"' in text
    reply = '<tool_call>\n{"name": "read_file", "arguments": {"path": "job.toml"}}\n</tool_call><|im_end|>'
    parsed = tok.parse_response(reply, prefix=text)
    assert parsed["tool_calls"][0]["function"] == {"name": "read_file", "arguments": {"path": "job.toml"}}
    assert prepare_tokenizer(tok).chat_template == tok.chat_template   # idempotent
