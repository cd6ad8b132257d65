"""Property: nothing an agent writes can raise inside our code (issue 46, item 5).

Hypothesis feeds hostile values (:mod:`tests.hostile_values`: integers past Python's int-string limit and a
float's range, nesting past the recursion limit, NaN and infinities, lone surrogates, enormous strings,
millions of tiny objects, odd types where strings or lists belong) through **every entry point where our code
parses agent-controlled data**, each as its caller meets it, and asserts that the outcome is the agent's —
an observation, a refused call, a probe failure, ``job_failed`` — never an uncaught exception and never
``infra_failed``:

- the tool-call readers and the outer loops' action writer (``ait_env/jobs/toolcalls.py``,
  ``ait_env/episode/messages.py``), the verifiers env (``ait_env/integrations/verifiers_env.py``), the TRL and
  Tinker adapters, the LLM runner (``ait_env/agents/llm/``): the env's step answers every call;
- the hidden-eval harness (``ait_env/hidden/evaluation.py``): a model's hostile calls and answers are its
  score, never an error record (errors fail the eval: ``infra_failed``);
- the probe (``ait_env/probe/dynamic.py``: what the sandbox reports; ``leak.py``: the texts it reads), the
  training audit, prime-rl's traces on a GPU (``gpu/primerl_traces.py``), the local trainer's step results
  (``cpu/trainer.py``) and the model endpoint's step channel
  (``cpu/tiny_models/endpoint.py``).

The env-level property over whole submissions is ``tests/test_never_infra_failed.py``; the step fuzz,
``tests/test_fuzz.py``; the guard itself, ``tests/jobs/test_guard.py``.
"""

from __future__ import annotations

import asyncio
import json
import math
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cpu.trainer import RolloutWorkerError, step_results
from ait_env.episode.messages import action_text, call_block, env_arguments
from ait_env.jobs import guard
from ait_env.jobs.failures import JobFailed
from ait_env.jobs.toolcalls import (decode_arguments, parse_action, parse_text_tool_calls, split_completion,
                                    structured_tool_calls)
from cpu.tiny_models.endpoint import StepChannel
from task_families import get_family
from tests.hostile_values import build, json_object_text, json_text, python_values

EARNED = ("scored", "job_failed", "invalid", "unparsable")
FAST = settings(max_examples=40, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
TOOLS = ["write_file", "read_file", "edit_file", "submit_jobs", "calculator", "nope"]


def _call_text(name: str, arguments: str) -> str:
    return '<tool_call>{"name": "%s", "arguments": %s}</tool_call>' % (name, arguments)


# ------------------------------------------------------------------ tool-call readers and the action writer
@FAST
@given(text=json_text, name=st.sampled_from(TOOLS))
def test_tool_call_readers_answer_every_text(text, name):
    for raw in (text, _call_text(name, text), "<think>x</think>" + _call_text(name, text) + " tail"):
        for call in parse_action(raw).calls:
            guard.check(call.arguments)  # what the env runs is within the bounds
        for attempt in parse_text_tool_calls(raw):
            assert (attempt.arguments is None) == (attempt.error is not None)
            json.dumps(attempt.raw_arguments)
        content, calls = split_completion(raw)
        assert isinstance(content, str) and all(isinstance(c["function"]["arguments"], str) for c in calls)
    args, why = decode_arguments(text)
    assert (args is None) != (why is None)
    fn = SimpleNamespace(name=name, arguments=text)
    assert len(structured_tool_calls(SimpleNamespace(tool_calls=[SimpleNamespace(id="c", function=fn)]))) == 1


@FAST
@given(recipe=python_values, name=st.sampled_from(TOOLS))
def test_the_action_writer_writes_every_value(recipe, name):
    value = build(recipe)
    for raw in (value, {"path": value, "content": "x"}):
        block = call_block(name, env_arguments(raw))
        assert isinstance(block, str)
        parse_action(block)
    fn = SimpleNamespace(name=name, arguments=value)
    structured_tool_calls(SimpleNamespace(tool_calls=[SimpleNamespace(id="c", function=fn)]))
    assert isinstance(action_text(value, [(name, value)], [value, "x"]), str)


# ------------------------------------------------------------------ the env and its outer loops
@FAST
@given(arguments=json_object_text, name=st.sampled_from(TOOLS))
def test_the_env_answers_hostile_arguments_from_every_outer_loop(make_env, arguments, name):
    """The verifiers env, the LLM runner and the Tinker adapter hand a model's arguments (JSON text) to
    :func:`action_text`; the env's step answers with an observation."""
    env = make_env(family="arithmetic", overrides={"env": {"max_turns": 4}})
    env.reset(seed=0)
    for action in (action_text("text", [(name, arguments)]), action_text(None, [], [_call_text(name, arguments)])):
        obs, reward, terminated, truncated, info = env.step(action)
        assert isinstance(obs, str) and isinstance(reward, float)
        if terminated or truncated:
            assert info["reward"]["status"] in EARNED
            break


@pytest.fixture(scope="module")
def verifiers_env(tmp_path_factory: pytest.TempPathFactory) -> Any:
    pytest.importorskip("verifiers")
    from ait_env.integrations import verifiers_env as V

    env = V.load_environment(backend="stub", families="arithmetic", eval_families="arithmetic", num_examples=1,
                             num_eval_examples=0, overrides={"env": {
                                 "runs_dir": str(tmp_path_factory.mktemp("vf-runs")), "max_turns": 4}})
    yield env
    asyncio.run(env.close_backend())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arguments=json_text, content=st.sampled_from(["", "ok", "9" * 5000, "\ud800"]),
       name=st.sampled_from(TOOLS))
def test_verifiers_env_answers_hostile_tool_calls(verifiers_env, arguments, content, name):
    """Issue 46: a 5,000-digit argument and deep nesting raised out of ``env_response`` (the LLM runner
    exited 1; verifiers' evaluate failed 6 of 6 rollouts)."""
    import verifiers as vf

    async def turn() -> Any:
        state = await verifiers_env.setup_state({"info": {"family": "arithmetic", "instance": 0}})
        try:
            msg = vf.AssistantMessage(content=content, tool_calls=[vf.ToolCall(id="c1", name=name,
                                                                             arguments=arguments)])
            return await verifiers_env.env_response([msg], state)
        finally:
            await verifiers_env.close_episode(state)

    replies = asyncio.run(turn())
    assert replies and all(isinstance(r.content, str) for r in replies)


@pytest.fixture(scope="module")
def trl_factory(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from ait_env.backends import make_backend
    from ait_env.config import compose
    from ait_env.integrations.trl import EnvironmentFactory

    runs = tmp_path_factory.mktemp("trl-runs")
    overrides = {"env": {"runs_dir": str(runs), "max_turns": 4, "max_jobs_per_episode": 2}}
    backend = make_backend(compose(backend="stub", overrides=overrides).backend, runs)
    with EnvironmentFactory(backend, family="arithmetic", overrides=overrides) as factory:
        yield factory
    backend.close()


@FAST
@given(recipe=python_values, which=st.sampled_from(["path", "content", "folders"]))
def test_trl_tools_answer_hostile_values(trl_factory, recipe, which):
    """TRL hands a tool method whatever values it parsed from the model's call."""
    env = trl_factory()
    env.reset()
    value = build(recipe)
    out = env.submit_jobs(value) if which == "folders" else \
        env.write_file(**{"path": "a.txt", "content": "x", which: value})
    assert isinstance(out, str)


def test_tinker_adapter_writes_hostile_calls_as_actions():
    renderers = pytest.importorskip("tinker_cookbook.renderers")
    from tinker_cookbook.renderers.base import ToolCall

    from ait_env.integrations.tinker import message_to_action

    for arguments in ("9" * 5000, '{"path": ' + "9" * 5000 + "}", "[" * 5000, '{"a": NaN}', '{"p": "\\ud800"}'):
        msg = renderers.Message(role="assistant", content="x", tool_calls=[ToolCall(
            function=ToolCall.FunctionBody(name="write_file", arguments=arguments))])
        action = message_to_action(msg)
        assert parse_action(action).errors and not parse_action(action).calls


class _FakeChat:
    """An OpenAI client whose model answers each turn with the next of ``replies`` (content, calls)."""

    def __init__(self, replies: list[tuple[Any, list[tuple[str, Any]]]]) -> None:
        self.replies = replies
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))

    def create(self, **_: Any) -> Any:
        content, calls = self.replies.pop(0) if self.replies else ("done", [])
        message = SimpleNamespace(content=content, tool_calls=[
            SimpleNamespace(id=f"c{i}", function=SimpleNamespace(name=n, arguments=a)) for i, (n, a) in enumerate(calls)])
        return SimpleNamespace(choices=[SimpleNamespace(message=message)],
                               usage=SimpleNamespace(prompt_tokens=3, completion_tokens=2))


@FAST
@given(arguments=st.lists(json_text, min_size=1, max_size=3), name=st.sampled_from(TOOLS))
def test_llm_runner_plays_on_through_hostile_arguments(make_env, arguments, name):
    from ait_env.agents.llm import KEPT, AgentSettings, play_episode

    env = make_env(family="arithmetic", overrides={"env": {"max_turns": 3}})
    client = _FakeChat([("x", [(name, a)]) for a in arguments])
    rec = play_episode(env, client, AgentSettings(base_url="http://127.0.0.1:1/v1", model="m", tool_mode="native"),
                       "arithmetic", 0)
    assert rec.status in KEPT and rec.turns >= 1, rec


# ------------------------------------------------------------------ the hidden-eval harness
class _FakeServer:
    """An async OpenAI client for the harness: turn 1 makes the hostile calls, turn 2 gives the answer."""

    def __init__(self, calls: list[tuple[str, Any]], content: str, answer: str) -> None:
        self.turns = [(content, calls), (answer, [])]

    async def post(self, path: str, **_: Any) -> Any:
        content, calls = self.turns.pop(0) if self.turns else ("Answer: 0", [])
        message = SimpleNamespace(content=content, tool_calls=[
            SimpleNamespace(id=f"c{i}", function=SimpleNamespace(name=n, arguments=a)) for i, (n, a) in enumerate(calls)])
        return SimpleNamespace(choices=[SimpleNamespace(message=message)], usage=None)


@FAST
@given(arguments=json_text, calls_as_text=st.booleans(),
       answer=st.sampled_from(["Answer: " + "9" * 5000, "Answer: " + "0" * 5000 + "7", "Answer: 1e999",
                               "Answer: " + "7" * 400 + ".5 hours", "[" * 5000, "Answer: 12"]),
       family=st.sampled_from(["arithmetic", "units", "calendar", "inventory", "warehouse"]))
def test_the_harness_scores_hostile_replies_and_never_records_an_error(arguments, calls_as_text, answer, family):
    """An error record counts against the eval (too many fail it: ``infra_failed``); whatever the trained model
    writes must be its score. Issue 46: deeply nested tool arguments failed the harness on 6 of 6."""
    from ait_env.hidden.evaluation import _run_instance, _Settings
    from ait_env.hidden.secrets import hidden_set

    fam = get_family(family)
    name = fam.tool_names[0]
    content = _call_text(name, arguments) if calls_as_text else ""
    calls = [] if calls_as_text else [(name, arguments)]
    s = _Settings(model="m", max_turns=3, max_tokens=8, temperature=0.0, request_timeout=5, max_retries=0,
                  retry_backoff=0.0, extra_body=None, tool_choice=None, keep_messages=False)
    rec = asyncio.run(_run_instance(_FakeServer(calls, content, answer), fam, hidden_set(family)[0], 0, s,
                                    fam.tool_schemas(), asyncio.Event()))
    assert rec.error is None and 0.0 <= rec.score <= 1.0, rec.error


# ------------------------------------------------------------------ validation and training
def _probe_report(family: str) -> dict[str, Any]:
    """What the sandbox reports for an honest job (the shape :meth:`DynamicProbe.interpret` reads)."""
    fam = get_family(family)
    inst = fam.generate(3, 20)
    return {"status": "ok", "is_tool_env": True, "columns": ["question", "answer"], "rows": 20,
            "questions": [i.question for i in inst], "empty_answers": 0, "prompt_texts": [], "max_turns": 6,
            "system_prompt": "Solve it.", "longest_prompt": json.dumps([{"role": "user", "content": "q"}]),
            "tools": {n: {"module": "family_tools", "not_own": ""} for n in fam.tool_names},
            "tool_defs": json.dumps(fam.tool_schemas()),
            "scores": [{"good": {"reward": 1.0, "errors": []}, "bad": {"reward": 0.0, "errors": []}}] * 2}


@FAST
@given(recipe=python_values, field=st.sampled_from(["rows", "questions", "max_turns", "system_prompt", "prompt_texts",
                                                   "longest_prompt", "tool_defs", "tools", "scores", "columns",
                                                   "empty_answers", "error", "traceback"]),
       as_list=st.booleans(), status=st.sampled_from(["ok", "error"]))
def test_the_probe_reads_any_sandbox_report(recipe, field, as_list, status):
    from ait_env.jobs.schema import parse_job
    from ait_env.probe.dynamic import DynamicProbe
    from task_families import reference_files
    from task_families.base import Bounds

    fam = get_family("calendar")
    job, _ = parse_job(reference_files("calendar", "Qwen/Qwen3-1.7B")["job.toml"])
    value = build(recipe)
    resp = {**_probe_report("calendar"), "status": status, field: [value, "x"] if as_list else value}
    probe = DynamicProbe(hidden_questions=lambda f: [i.question for i in fam.generate(11, 30)])
    bounds = Bounds(base_models=[job.job.base_model], max_steps=200, max_batch_size=512, max_group_size=16,
                    max_seq_len=8192, max_tokens=2048)
    failures = probe.interpret(resp, job, fam.make_task(5, bounds), fam)
    assert isinstance(failures, list)


@pytest.fixture(scope="module")
def audit_index() -> Any:
    from ait_env.hidden.secrets import hidden_questions
    from ait_env.probe.training_audit import TrainingAudit

    return TrainingAudit(get_family("arithmetic"), hidden_questions("arithmetic")[:50]).index


def test_a_sandbox_answer_too_deep_to_parse_here_is_the_codes_error(tmp_path):
    """The zygote parses a request's result high on its stack; this process parses the zygote's answer from
    deeper in its own (a trainer's, a test's), so a result nested ~960 levels deep raised ``RecursionError`` out of
    ``submit_job`` (``infra_failed``). It is an error answer to the request instead (the probe: a load error)."""
    from ait_env.sandbox.host import Sandbox, unreadable_answer

    deep = '{"id": 7, "response": {"status": "ok", "system_prompt": ' + "[" * 5000 + "]" * 5000 + "}}\n"
    sb = Sandbox()
    sb._lines.put(deep)
    answer = sb._readline(5)
    assert answer is not None and answer["id"] == 7 and answer["response"]["status"] == "error"
    assert "nested hundreds of levels" in answer["response"]["error"]
    assert unreadable_answer("[" * 5000) is None  # not an answer of the protocol: ignored as before


@FAST
@given(recipe=python_values, where=st.sampled_from(["content", "tool_calls", "arguments", "tools", "result",
                                                   "messages"]))
def test_the_training_audit_fails_the_job_or_passes_it(audit_index, recipe, where):
    from ait_env.probe.training_audit import TrainingAudit

    fam = get_family("arithmetic")
    value = build(recipe)
    call = {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "3+4"}'}}
    messages: Any = [{"role": "user", "content": "What is 3+4?"},
                     {"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": "c1", "content": "7"}]
    tools: Any = fam.tool_schemas()
    if where == "content":
        messages[0]["content"] = value
    elif where == "tool_calls":
        messages[1]["tool_calls"] = value
    elif where == "arguments":
        call["function"]["arguments"] = value if not isinstance(value, str) else '{"expression": %s}' % value
    elif where == "tools":
        tools = [*tools, value]
    elif where == "result":
        messages[2]["content"] = value
    else:
        messages = value
    audit = TrainingAudit(fam, [])
    audit.index = audit_index  # the hidden set's index is built once for the test
    try:
        audit.review([(messages, tools)])
    except JobFailed as exc:
        assert str(exc)


@FAST
@given(text=json_text)
def test_gpu_trace_and_log_lines_are_read_or_fail_the_job(tmp_path_factory, text):
    """prime-rl's traces and logs on a GPU carry what the agent's environment wrote."""
    from gpu.primerl_logs import clean
    from gpu.primerl_traces import conversations

    for line in (text, '{"message": %s, "timestamp": %s}' % (text, text)):
        assert isinstance(clean(line), str)

    path = tmp_path_factory.mktemp("traces") / "traces.jsonl"
    path.write_text('{"nodes": [{"message": %s}]}\n%s\n' % (text, text), encoding="utf-8", errors="surrogatepass")
    try:
        for messages, _ in conversations([path]):
            guard.check(messages)
    except JobFailed as exc:
        assert "training audit cannot read" in str(exc)


@FAST
@given(recipe=python_values, where=st.sampled_from(["body", "groups", "reward", "error", "rollout", "ids"]))
def test_the_trainer_reads_any_step_result(recipe, where):
    value = build(recipe)
    rollout = {"reward": 1.0, "response_ids": ["r1"], "error": None}
    res: Any = {"step": 0, "groups": [[dict(rollout), dict(rollout)]]}
    if where == "body":
        res = value
    elif where == "groups":
        res["groups"] = value
    elif where == "reward":
        res["groups"][0][0]["reward"] = value
    elif where == "error":
        res = {"step": 0, "error": value, "traceback": value}
    elif where == "rollout":
        res["groups"][0][1] = value
    else:
        res["groups"][0][0]["response_ids"] = value
    try:
        out = step_results(res, 0, 1, 2)
    except RolloutWorkerError as exc:
        assert str(exc)
        return
    assert all(math.isfinite(r["reward"]) and abs(r["reward"]) <= guard.MAX_MAGNITUDE for g in out for r in g)


def test_rewards_that_overflow_fail_the_job_in_the_agents_terms():
    """Issue 46: rewards of ±1e308 passed the finite check and overflowed the step's statistics
    (``OverflowError``: ``infra_failed``)."""
    rollouts = [{"reward": r, "response_ids": ["x"]} for r in (1e308, -1e308)]
    with pytest.raises(RolloutWorkerError, match="within ±1e"):
        step_results({"step": 0, "groups": [rollouts]}, 0, 1, 2)


@FAST
@given(text=json_text, step=st.sampled_from(["-1", "0", "7", "9" * 400, '"0"', "null"]))
def test_the_step_channel_takes_only_awaited_bounded_results(text, step):
    channel = StepChannel()
    for body in (text, '{"step": %s, "groups": %s}' % (step, text)):
        status, why = channel.post_json(body.encode("utf-8", "surrogatepass"))
        assert status in (200, 400, 409, 413) and why
    assert len(channel._results) <= 1  # only the hello (step -1) is awaited before any work is published
