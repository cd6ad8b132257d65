"""The hidden-eval harness, end to end against the scripted OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from ait_env.hidden.evaluation import (
    EvalInfraError, EvalRecord, confidence_interval, evaluate, evaluate_async, evaluate_subprocess, final_text,
    main,
    parse_text_tool_calls, wilson_interval,
)
from ait_env.hidden.secrets import hidden_set, hidden_set_hash
from task_families import FAMILY_NAMES, get_family
from tests.fakes.openai_server import (
    PolicyHTTPError, ScriptedOpenAIServer, correct_policy, error_policy, malformed_tool_policy,
    no_tool_policy, openai_server, slow_policy, think_policy,
)

LIMIT = 50
FAST = {"retry_backoff": 0.01, "request_timeout": 10.0}


def _wilson_ok(res) -> None:
    k = sum(r.score for r in res.records)
    lo, hi = wilson_interval(k, res.n)
    assert res.ci_method == "wilson"
    assert (res.ci_low, res.ci_high) == pytest.approx((lo, hi))
    assert res.ci95 == pytest.approx((hi - lo) / 2)
    assert res.ci_low <= res.score <= res.ci_high


# ------------------------------------------------------------------------------------------ scoring
@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_correct_policy_scores_one(name):
    fam = get_family(name)
    extra = {"chat_template_kwargs": {"enable_thinking": False}}
    with ScriptedOpenAIServer(correct_policy(fam)) as server:
        res = evaluate(name, base_url=server.base_url, model="m", limit=LIMIT, extra_body=extra, **FAST)
    assert not res.failed and res.n_errors == 0
    assert res.n == res.n_scored == LIMIT == len(res.records)
    assert res.score == 1.0 and res.score_excluding_errors == 1.0
    assert res.family == name and res.model == "m"
    assert res.hidden_set_hash == hidden_set_hash(name)
    assert res.seconds_per_instance == pytest.approx(res.wall_seconds / LIMIT)
    _wilson_ok(res)
    hidden = hidden_set(name)[:LIMIT]
    for rec, inst in zip(res.records, hidden):
        assert (rec.index, rec.key, rec.question, rec.answer) == (hidden.index(inst), inst.key, inst.question,
                                                                   inst.answer)
        plan = fam.solution(inst)
        assert rec.stop_reason == "answer" and rec.turns == len(plan) + 1
        assert [c.name for c in rec.tool_calls] == [s.name for s in plan]
        assert all(c.error is None and c.source == "structured" for c in rec.tool_calls)
        assert rec.score == 1.0 and rec.error is None
    body = server.requests[0]
    assert body["temperature"] == 0 and body["max_tokens"] == fam.eval_max_tokens
    assert body["tools"] == fam.tool_schemas() and body["model"] == "m"
    prompts = [fam.eval_messages(inst) for inst in hidden]
    first_turns = [b["messages"] for b in server.requests if len(b["messages"]) == len(prompts[0])]
    assert sorted(map(json.dumps, first_turns)) == sorted(map(json.dumps, prompts))
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert "tool_choice" not in body
    assert set(server.status_counts) == {200}


def test_no_tool_policy_scores_low():
    with openai_server(no_tool_policy) as url:
        res = evaluate("arithmetic", base_url=url, model="m", limit=LIMIT, **FAST)
    assert not res.failed and res.n_errors == 0
    assert res.score < 0.1
    assert all(r.turns == 1 and not r.tool_calls and r.stop_reason == "answer" for r in res.records)
    _wilson_ok(res)


def test_malformed_tool_calls_become_error_messages():
    fam = get_family("arithmetic")
    policy = malformed_tool_policy(then=correct_policy(fam))
    with ScriptedOpenAIServer(policy) as server:
        res = evaluate(fam, base_url=server.base_url, model="m", limit=20, max_turns=fam.eval_max_turns + 4,
                       keep_messages=True, **FAST)
    # vLLM json-decodes echoed tool-call arguments: the harness must never send invalid JSON back.
    assert set(server.status_counts) == {200}
    assert not res.failed and res.n_errors == 0
    assert res.score == 1.0
    for rec in res.records:
        bad = rec.tool_calls[:4]
        assert [c.source for c in bad] == ["structured", "structured", "structured", "text"]
        assert all(c.error and c.result.startswith("error:") for c in bad)
        assert "not valid JSON" in bad[0].error
        assert "unknown tool 'no_such_tool'" in bad[1].error and "calculator" in bad[1].result
        assert "must be a JSON object" in bad[2].error
        assert "invalid JSON in <tool_call>" in bad[3].error
        assert all(c.error is None for c in rec.tool_calls[4:])
        assert rec.n_tool_errors == 4
        tool_msgs = [m for m in rec.messages if m["role"] == "tool"]
        assert len(tool_msgs) == len(rec.tool_calls)


def test_malformed_only_policy_scores_zero_without_errors():
    with openai_server(malformed_tool_policy()) as url:
        res = evaluate("arithmetic", base_url=url, model="m", limit=10, **FAST)
    assert not res.failed and res.n_errors == 0 and res.score == 0.0
    assert all(r.n_tool_errors == 4 and r.turns == 5 for r in res.records)


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_think_and_text_tool_calls(name):
    fam = get_family(name)
    with ScriptedOpenAIServer(think_policy(fam)) as server:
        res = evaluate(name, base_url=server.base_url, model="m", limit=LIMIT, tool_choice="none", **FAST)
    assert not res.failed and res.score == 1.0
    assert server.requests[0]["tool_choice"] == "none"
    for rec, inst in zip(res.records, hidden_set(name)):
        # the decoy <tool_call> inside the final <think> block is not executed
        assert len(rec.tool_calls) == len(fam.solution(inst))
        assert all(c.source == "text" and c.error is None for c in rec.tool_calls)
        assert "<think>" in rec.response and "987654321" in rec.response
        assert "<think>" not in rec.final_text and "987654321" not in rec.final_text
        assert "<tool_call>" not in rec.final_text


# ------------------------------------------------------------------------------------------ infrastructure
def test_flaky_500s_are_retried():
    with ScriptedOpenAIServer(error_policy(correct_policy("arithmetic"), fail_attempts=2)) as server:
        res = evaluate("arithmetic", base_url=server.base_url, model="m", limit=20, max_retries=2, **FAST)
    assert not res.failed and res.n_errors == 0 and res.score == 1.0
    assert server.status_counts[500] == 2 * server.status_counts[200] > 0


def test_some_errors_under_threshold_are_counted_separately():
    policy = error_policy(correct_policy("arithmetic"), fail_attempts=None, fail_fraction=0.15)
    with ScriptedOpenAIServer(policy) as server:
        res = evaluate("arithmetic", base_url=server.base_url, model="m", limit=LIMIT, max_retries=1,
                       max_error_rate=0.5, **FAST)
    errored = [r for r in res.records if r.error]
    assert 0 < res.n_errors == len(errored) < LIMIT * 0.5
    assert not res.failed
    assert all("HTTP 500" in r.error and "after 1 retries" in r.error for r in errored)
    assert all(r.score == 0.0 and r.stop_reason == "error" for r in errored)
    assert res.n_scored == LIMIT - res.n_errors
    assert res.score == pytest.approx(res.n_scored / LIMIT)
    assert res.score_excluding_errors == 1.0


def test_mostly_failing_server_fails_the_eval():
    policy = error_policy(correct_policy("arithmetic"), fail_attempts=None, fail_fraction=0.8)
    with ScriptedOpenAIServer(policy) as server:
        res = evaluate("arithmetic", base_url=server.base_url, model="m", limit=LIMIT, concurrency=4,
                       max_retries=2, **FAST)
    assert res.failed and res.n_errors > LIMIT * res.max_error_rate
    assert "instances errored" in res.failure_reason and "HTTP 500" in res.failure_reason
    assert any(r.error and r.error.startswith("aborted") for r in res.records)  # stopped early
    with pytest.raises(EvalInfraError, match="failed"):
        res.raise_if_failed()


def test_client_errors_are_not_retried():
    def policy(messages, tools):
        raise PolicyHTTPError(404, "The model `m` does not exist.")

    with ScriptedOpenAIServer(policy) as server:
        res = evaluate("arithmetic", base_url=server.base_url, model="m", limit=10, abort_on_failure=False,
                       **FAST)
    assert res.failed and res.n_errors == 10
    assert server.status_counts == {404: 10}
    assert all("HTTP 404" in r.error for r in res.records)


def test_unreachable_server_fails_the_eval():
    with ScriptedOpenAIServer(no_tool_policy) as server:
        url = server.base_url
    res = evaluate("arithmetic", base_url=url, model="m", limit=5, max_retries=1, **FAST)
    assert res.failed and res.n_errors == 5
    assert all("connection error" in r.error or "aborted" in r.error for r in res.records)


def test_request_timeout_is_an_error():
    with openai_server(slow_policy(no_tool_policy, 1.0)) as url:
        res = evaluate("arithmetic", base_url=url, model="m", limit=3, request_timeout=0.1, max_retries=1,
                       retry_backoff=0.01)
    assert res.failed and res.n_errors == 3
    assert all("timeout" in r.error or "aborted" in r.error for r in res.records)
    assert res.wall_seconds < 1.0


def test_context_length_overflow_is_the_models_failure():
    first = correct_policy("arithmetic")

    def policy(messages, tools):
        if any(m["role"] == "tool" for m in messages):
            raise PolicyHTTPError(400, "This model's maximum context length is 4096 tokens.")
        return first(messages, tools)

    with openai_server(policy) as url:
        res = evaluate("arithmetic", base_url=url, model="m", limit=5, **FAST)
    assert not res.failed and res.n_errors == 0 and res.score == 0.0
    assert all(r.stop_reason == "context_length" and r.turns == 1 for r in res.records)


def test_max_turns_stops_the_loop():
    fam = get_family("arithmetic")
    with openai_server(correct_policy(fam)) as url:
        res = evaluate(fam, base_url=url, model="m", limit=10, max_turns=2, **FAST)
    assert not res.failed and res.score == 0.0
    assert all(r.stop_reason == "max_turns" and r.turns == 2 and len(r.tool_calls) == 1 for r in res.records)


# ------------------------------------------------------------------------------------------ outputs, API
def test_records_saved_as_jsonl(tmp_path: Path):
    out = tmp_path / "eval" / "records.jsonl"
    with openai_server(correct_policy("arithmetic")) as url:
        res = evaluate("arithmetic", base_url=url, model="m", limit=10, out=out, **FAST)
    lines = out.read_text().splitlines()
    assert len(lines) == 10
    recs = [EvalRecord.model_validate_json(line) for line in lines]
    assert [r.model_dump() for r in recs] == [r.model_dump() for r in res.records]
    summary = json.loads(out.with_suffix(".summary.json").read_text())
    assert summary["score"] == 1.0 and summary["n"] == 10 and "records" not in summary


def test_model_discovery_and_async_api():
    with openai_server(correct_policy("arithmetic"), model="served-name") as url:
        res = asyncio.run(evaluate_async("arithmetic", base_url=url, limit=3, **FAST))

        async def inside_a_loop():
            return evaluate("arithmetic", base_url=url, model="served-name", limit=3, **FAST)

        res2 = asyncio.run(inside_a_loop())
    assert res.model == res2.model == "served-name" and res.score == res2.score == 1.0


def test_explicit_instances():
    fam = get_family("arithmetic")
    dev = fam.dev_pool()[:7]
    with openai_server(correct_policy(fam, instances=dev)) as url:
        res = evaluate(fam, base_url=url, model="m", instances=dev, **FAST)
    assert res.n == 7 and res.score == 1.0 and res.hidden_set_hash != hidden_set_hash("arithmetic")


def test_cli(tmp_path: Path, capsys):
    out = tmp_path / "r.jsonl"
    with openai_server(correct_policy("arithmetic")) as url:
        rc = main(["--family", "arithmetic", "--base-url", url, "--model", "m", "--limit", "4",
                   "--out", str(out), "--quiet"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["score"] == 1.0 and summary["n"] == 4
    assert len(out.read_text().splitlines()) == 4


def test_cli_reports_infra_failure(capsys):
    with ScriptedOpenAIServer(no_tool_policy) as server:
        url = server.base_url
    rc = main(["--family", "arithmetic", "--base-url", url, "--model", "m", "--limit", "2", "--retries", "0",
               "--quiet"])
    assert rc == 2


# ------------------------------------------------------------------------------------------ units
def test_wilson_interval_known_values():
    assert wilson_interval(8, 10) == pytest.approx((0.4902, 0.9433), abs=1e-4)
    lo, hi = wilson_interval(0, 50)
    assert lo == 0.0 and hi == pytest.approx(1.959964 ** 2 / (50 + 1.959964 ** 2))
    lo, hi = wilson_interval(50, 50)
    assert hi == 1.0 and lo == pytest.approx(50 / (50 + 1.959964 ** 2))
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_confidence_interval_methods():
    binary = [1.0] * 30 + [0.0] * 20
    assert confidence_interval(binary) == pytest.approx((*wilson_interval(30, 50), "wilson"))
    frac = [0.5, 1.0, 0.0, 0.25, 0.75, 1.0]
    lo, hi, method = confidence_interval(frac)
    half = 1.959964 * statistics.stdev(frac) / math.sqrt(len(frac))
    assert method == "normal"
    assert (lo, hi) == pytest.approx((max(0, statistics.mean(frac) - half), min(1, statistics.mean(frac) + half)))


def test_parse_text_tool_calls():
    text = ('<think>maybe <tool_call>{"name": "x", "arguments": {}}</tool_call></think>'
            'ok <tool_call>{"name": "calculator", "arguments": {"expression": "1+2"}}</tool_call>'
            '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"3\\"}"}</tool_call>'
            '<tool_call>{"name": "calculator", "arguments": {"expression": "4')
    calls = parse_text_tool_calls(text)
    assert [(c.name, c.arguments, c.error is None) for c in calls[:2]] == [
        ("calculator", {"expression": "1+2"}, True), ("calculator", {"expression": "3"}, True)]
    assert len(calls) == 3 and calls[2].error and "invalid JSON" in calls[2].error  # cut off by max_tokens
    assert parse_text_tool_calls("Answer: 3") == []
    assert final_text("<think>7</think>Answer: 3 <tool_call>{}</tool_call>") == "Answer: 3"
    assert final_text("no close</think>Answer: 5") == "Answer: 5"
    assert final_text("Answer: 5<think>unfinished 9") == "Answer: 5"


def test_harness_imports_no_agent_code():
    code = ("import sys, ait_env.hidden.evaluation; "
            "bad = [m for m in sys.modules if m in ('environment', 'family_tools') or m.startswith('ait_env.agents')]; "
            "print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.strip() == "[]"


def test_the_harness_in_a_child_process(tmp_path: Path):
    """The runner's way: the same result as in this process, records kept where asked; a dead server
    gives a failed result, not a score."""
    keep = tmp_path / "post.jsonl"
    with openai_server(correct_policy("arithmetic")) as url:
        res = evaluate_subprocess("arithmetic", base_url=url, model="m", limit=6, concurrency=3, max_tokens=77,
                                  keep=keep)
    assert not res.failed and res.n == 6 and res.score == 1.0 and res.settings["max_tokens"] == 77
    assert res.hidden_set_hash == hidden_set_hash("arithmetic") and len(keep.read_text().splitlines()) == 6
    with ScriptedOpenAIServer(no_tool_policy) as server:
        url = server.base_url
    dead = evaluate_subprocess("arithmetic", base_url=url, model="m", limit=2)
    assert dead.failed and dead.n_errors == 2
    with pytest.raises(EvalInfraError, match="without a result"):
        evaluate_subprocess("no-such-family", base_url=url, model="m", limit=2)


# ------------------------------------------------------------------------------------------ stateful families
def test_a_stateful_family_is_scored_on_the_state_each_episode_leaves():
    """warehouse: each of 50 concurrent episodes gets its own world; the right label without the packing scores
    0, and one wrong pick (irreversible) before a correct solution scores 0 too."""
    fam = get_family("warehouse")
    hidden = hidden_set("warehouse")[:LIMIT]
    by_question = {inst.question: inst for inst in hidden}

    def answer_only(messages, tools):
        return {"content": f"Answer: {by_question[messages[1]['content']].answer}"}

    def wrong_pick_first(messages, tools):
        inst = by_question[messages[1]["content"]]
        if not any(m["role"] == "tool" for m in messages):
            b, item = next((b, i) for b, items in inst.info["world"]["bins"].items() for i in items
                           if i not in inst.info["order"])
            return {"content": "", "tool_calls": [{"id": "w", "type": "function", "function": {
                "name": "pick", "arguments": json.dumps({"bin": b, "item": item, "quantity": 1})}}]}
        trimmed = [m for m in messages if not (m.get("tool_calls") and m["tool_calls"][0]["id"] == "w")
                   and m.get("tool_call_id") != "w"]
        return correct_policy(fam, hidden)(trimmed, tools)

    for policy, want in ((correct_policy(fam, hidden), 1.0), (answer_only, 0.0), (wrong_pick_first, 0.0)):
        with ScriptedOpenAIServer(policy) as server:
            res = evaluate("warehouse", base_url=server.base_url, model="m", limit=LIMIT, concurrency=50, **FAST)
        assert not res.failed and res.n_errors == 0 and res.score == want, (policy, res.score)
        if policy is answer_only:  # the answer alone is right: only the state makes it 0
            assert all(fam.check(inst, rec.final_text) == 1.0 for rec, inst in zip(res.records, hidden))
