"""The dynamic probe's checks of a sandbox report (a part of :class:`ait_env.probe.dynamic.DynamicProbe`): the
dataset and the prompts (``_checks``), hidden-eval questions in the data (``_leak_checks``), the scripted
rollouts (``_rollout_checks``) and the rubric's rewards (``_rubric_checks``); each problem a
:class:`ait_env.probe.report.ProbeFailure` with where it is and how to fix it."""

from __future__ import annotations

import json
import math
import re
from typing import Any


from ait_env.jobs import guard
from ait_env.jobs.settings import TokenCounter
from ait_env.jobs.primerl import token_budget_rule
from ait_env.jobs.schema import Job
from ait_env.probe.leak import model_texts
from ait_env.probe.scripted_model import ScriptedModel
from ait_env.probe.report import ProbeFailure
from ait_env.hidden.redact import for_agent
from task_families.base import TOOLS_MODULE_NAME, TaskFamily, TaskSpec


#: the package name the probe imports the agent's files under (a bundle uses its job's env id)
PROBE_ENV_ID = "ait_job_probe"
#: the bounds of what the sandbox reports (at most the zygote's 16 MB of result; NaN and infinity pass: the
#: rubric checks name them)
REPORT_LIMITS = guard.Limits(finite=False)


def estimate_tokens(messages: list[Any], tools: list[Any]) -> int:
    """Conservative estimate when no tokenizer is registered: one token per 3 UTF-8 bytes of the JSON
    of the prompt messages and the tool schemas."""
    text = json.dumps(messages, default=str) + json.dumps(tools, default=str)
    return math.ceil(len(text.encode("utf-8")) / 3)


def count_prompt_tokens(counter: TokenCounter | None, model: str, messages: list[Any],
                        tools: list[Any]) -> tuple[int, bool]:
    """Prompt tokens of ``messages`` + ``tools`` and whether the model's own tokenizer counted them (the
    backend's ``counter``; else, or when it cannot render them, :func:`estimate_tokens`). Both come from
    the agent's code: anything that is not a dict is dropped."""
    messages = [m for m in messages if isinstance(m, dict)]
    tools = [t for t in tools if isinstance(t, dict)]
    if counter is not None:
        try:
            n = counter(model, messages, tools)
            if n is not None:
                return int(n), True
        except Exception:  # noqa: BLE001 - malformed agent data must not crash the probe
            pass
    return estimate_tokens(messages, tools), False


def _fail(code: str, where: str, message: str, fix: str = "") -> ProbeFailure:
    return ProbeFailure(stage="dynamic", code=code, where=where, message=message, fix=fix)

def _agent_location(tb: str, default: str) -> str:
    """file:line of the innermost traceback frame in the agent's own files."""
    frames = re.findall(rf'File "[^"]*/req-[0-9a-f]+/{PROBE_ENV_ID}/([^"]+)", line (\d+)', tb or "")
    return f"{frames[-1][0]}:{frames[-1][1]}" if frames else default

def _clean_tb(tb: str) -> str:
    return for_agent(tb or "").strip()[-1500:]


class _Checks:
    """The checks of one sandbox report (see the module docstring)."""

    def _checks(self, r: dict[str, Any], job: Job, task: TaskSpec, family: TaskFamily,
                model: ScriptedModel | None = None) -> list[ProbeFailure]:
        out: list[ProbeFailure] = []
        env_file = job.job.environment
        b = task.bounds
        if not r.get("is_tool_env"):
            out.append(_fail("not_tool_env", env_file, "load_environment must return a vf.ToolEnv",
                             "Return vf.ToolEnv(dataset=..., tools=TOOLS, rubric=..., system_prompt=...)."))
        cols = set(r.get("columns") or [])
        missing = {"question", "answer"} - cols
        if missing:
            out.append(_fail("dataset_columns", f"{env_file}: dataset", f"missing column(s) {sorted(missing)}; "
                             f"found {sorted(cols)}", "Build rows like {'question': ..., 'answer': ...}."))
        rows = r.get("rows") if isinstance(r.get("rows"), int) else 0
        if not b.min_examples <= rows <= b.max_examples:
            out.append(_fail("dataset_size", f"{env_file}: dataset", f"{rows} rows; the allowed range is "
                             f"{b.min_examples}..{b.max_examples}", "Generate more (or fewer) rows."))
        if r.get("empty_answers"):
            out.append(_fail("empty_answers", f"{env_file}: dataset", f"{r['empty_answers']} rows have an empty answer",
                             "Every row needs a non-empty answer string."))
        out.extend(self._leak_checks(r, family, env_file))
        tools = r.get("tools") or {}
        want = set(family.tool_names)
        if set(tools) != want:
            out.append(_fail("wrong_tools", f"{env_file}: tools", f"the environment's tools are {sorted(tools)}; "
                             f"they must be exactly the family's {sorted(want)}",
                             f"Pass tools=TOOLS from {TOOLS_MODULE_NAME} (no extra or renamed tools)."))
        else:
            foreign = {n: meta.get("not_own") or "defined elsewhere" for n, meta in tools.items()
                       if meta.get("module") != TOOLS_MODULE_NAME or meta.get("not_own")}
            if foreign:
                why = "; ".join(f"{n}: {reason}" for n, reason in sorted(foreign.items()))
                out.append(_fail("wrong_tools", f"{env_file}: tools", f"tool(s) {sorted(foreign)} are not the "
                                 f"family's own functions ({why})", f"Pass them unchanged: `from {TOOLS_MODULE_NAME} "
                                 "import TOOLS`, then tools=TOOLS (no wrappers, copies or replacements)."))
        out.extend(self._rollout_checks(r, model, task, family, env_file))
        try:
            messages = guard.loads(str(r.get("longest_prompt") or "[]"), REPORT_LIMITS, what="the longest prompt")
            tools = guard.loads(str(r.get("tool_defs") or "[]"), REPORT_LIMITS, what="the tool definitions")
        except guard.Refused as exc:
            out.append(_fail("unreadable", f"{env_file}: prompts", str(exc), "Build prompts and tool schemas from "
                             "plain strings and small JSON (what verifiers expects)."))
            return out
        if not isinstance(messages, list):
            messages = [{"role": "user", "content": str(messages)}]
        prompt_tokens, exact = count_prompt_tokens(self._token_counter, job.job.base_model, messages,
                                                   tools if isinstance(tools, list) else [])
        turns = r.get("max_turns") if isinstance(r.get("max_turns"), int) and r.get("max_turns") > 1 else 1
        how = "counted with the model's tokenizer" if exact else "estimated as 1 token per 3 bytes, tool schemas included"
        for iss in token_budget_rule(job, prompt_tokens=prompt_tokens, max_turns=turns):
            out.append(_fail("seq_len", iss.where, f"{iss.message} (prompt tokens {how})", iss.fix))
        return out

    def _leak_checks(self, r: dict[str, Any], family: TaskFamily, env_file: str) -> list[ProbeFailure]:
        """Hidden-eval questions in the dataset's questions or in any other text its prompts are built from
        (a supplied prompt column, the system prompt, few-shot messages, tool descriptions), as copies or as
        the same instances re-worded (:class:`ait_env.probe.leak.LeakIndex`). At most
        ``leak_tolerance_rows`` rows, and as many distinct hidden questions, are tolerated (accidental
        collisions of short questions)."""
        index = self.leak_index(family.name)
        tol = self.settings.leak_tolerance_rows
        questions = [str(q) for q in r.get("questions") or []] if isinstance(r.get("questions"), list) else []
        rows = index.count(questions)
        try:
            tool_defs = guard.loads(str(r.get("tool_defs") or "[]"), REPORT_LIMITS, what="the tool definitions")
        except guard.Refused:
            tool_defs = str(r.get("tool_defs"))  # read as text (the seq_len check names the problem)
        # every text the model reads, as it reads it: content parts joined, tool schemas' keys and values
        others = model_texts(r.get("prompt_messages"), tool_defs if isinstance(tool_defs, list) else [tool_defs])
        others.append(str(r.get("system_prompt") or ""))
        distinct = index.leaked(questions) | index.leaked(others)
        if rows <= tol and len(distinct) <= tol:
            return []
        where = "dataset questions" if rows > tol else "prompts (system prompt, prompt column or tool schemas)"
        return [_fail("eval_leak", f"{env_file}: {where}", f"{max(rows, len(distinct))} hidden-eval questions "
                      f"appear in your {where} ({rows} question rows; {len(distinct)} distinct hidden questions "
                      "in all texts of the prompts), compared as instances (the same numbers, people or items "
                      "however worded) and as text, after normalising what the model reads (content parts "
                      "joined, tool schemas' keys and values; case, spacing, punctuation, Unicode look-alikes, "
                      "numbers in words, hex or Roman numerals, reversed text)",
                      "Generate fresh questions; do not copy, re-word or encode evaluation data.")]

    def _rollout_checks(self, r: dict[str, Any], model: ScriptedModel | None, task: TaskSpec, family: TaskFamily,
                        env_file: str) -> list[ProbeFailure]:
        """The environment judged by its rollouts of the dev examples (the sandbox ran them with the call
        training makes, against the scripted ``model`` outside it): every decision is made here, from what the
        model saw and from the rewards the sandbox reports for the replies it gave (matched by their response
        ids: which rollout had the correct script, the sandbox could only learn from the replies).

        - the rollouts ran, each reached the model, and the results name the model's own replies;
        - the environment offered exactly the family's tools, and every tool result it showed is what the
          family's tool returns on a fresh world of that example (a stateless family's: the same call); for a
          stateful family, two correct rollouts run concurrently, so a world shared between rollouts shows
          (``world_per_rollout``);
        - the rubric returns finite rewards without errors and tells a correct episode from a wrong answer
          (:meth:`_rubric_checks`), and, for a stateful family, from the right answer with no tool call
          (``state_ignored``)."""
        stateful = bool(family.state_args)
        code = "stateful_rollout" if stateful else "rollout"
        layout = sorted(family.job_info(task.dev_examples[0])) if task.dev_examples else []
        where_rows = ("The probe's rollouts use the dev examples as rows (prompt: the question; answer; info"
                      + (f" laid out as the family's INSTRUCTIONS.md says: {', '.join(layout)}" if layout else "")
                      + ")")
        fix_rollout = where_rows + ("; build the world in setup_state from state['info'] and make every tool call "
                                    "work on it." if stateful else "; keep the row's prompt, call the family's "
                                    "tools and let the rollout end when the model answers.")
        if r.get("rollout_error"):
            return [_fail(code, f"{env_file}: rollout", f"the rollouts of the dev examples raised "
                          f"{str(r.get('rollout_error'))[:600]}\n{_clean_tb(str(r.get('traceback') or ''))}",
                          fix_rollout)]
        groups = r.get("rollouts") if isinstance(r.get("rollouts"), list) else []
        reported = [x for g in groups if isinstance(g, list) for x in g if isinstance(x, dict)]
        broken = next((x for x in reported if x.get("error")), None)
        if broken is not None:
            return [_fail(code, f"{env_file}: rollout", f"a rollout of a dev example failed: "
                          f"{str(broken.get('error'))[:500]}", fix_rollout)]
        scripts = self.scripts(task, family)
        conversations = model.conversations if model is not None else []
        wanted = sum(len(s) for _, s in scripts)
        by: dict[tuple[int, str], tuple[dict[str, Any], Any]] = {}
        for x in reported:
            conv = model.conversation_of(x.get("response_ids")) if model is not None else None
            if conv is None or (conv.example, conv.label) in by:
                return [_fail(code, f"{env_file}: rollout", "the rollout results name replies the probe's model "
                              "did not give (or one conversation twice): the results of a rollout must be the "
                              "ones verifiers computed for it", fix_rollout)]
            by[(conv.example, conv.label)] = (x, conv)
        if len(by) != wanted or len(conversations) != wanted:
            refused = "; ".join(dict.fromkeys(model.refused)) if model is not None else ""
            return [_fail(code, f"{env_file}: rollout", f"{len(by)} of the {wanted} rollouts of the dev examples "
                          f"came back from the probe's model ({len(conversations)} reached it)"
                          + (f"; it refused requests: {refused[:400]}" if refused else ""), fix_rollout)]
        want_tools = set(family.tool_names)
        offered = set().union(*(c.tools for c in conversations))
        if offered != want_tools:
            return [_fail("wrong_tools", f"{env_file}: tools", f"the environment offered the model the tools "
                          f"{sorted(offered)}; they must be exactly the family's {sorted(want_tools)}",
                          f"Pass tools=TOOLS from {TOOLS_MODULE_NAME} (no extra or renamed tools).")]
        for k, inst in enumerate(task.dev_examples):
            expected = [str(m.get("content")) for m in family.transcript(inst) if m.get("role") == "tool"]
            plan = family.solution(inst)
            for label in scripts[k][1]:
                conv = by[(k, label)][1]
                if not conv.call_ids:
                    continue
                got = conv.shown_results()
                if got == expected:
                    continue
                i = next((j for j, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
                shown = str(got[i]) if i < len(got) else "(no result)"
                want = expected[i] if i < len(expected) else "(no result)"
                if stateful:
                    return [_fail("world_per_rollout", f"{env_file}: tools", "in concurrent rollouts of dev "
                                  f"example {k + 1}, tool call {i + 1} was answered {shown[:160]!r} where a fresh world "
                                  f"of that example answers {want[:160]!r}: the world is shared between rollouts "
                                  "(a module global, one object for the whole environment) or the tools do not act "
                                  "on the rollout's own world",
                                  "Subclass vf.StatefulToolEnv: create the world per rollout in setup_state "
                                  "(state['world'] = new_world(state['info']['world'])) and return "
                                  "{**tool_args, 'world': state['world']} from update_tool_args; add each tool "
                                  "with add_tool(tool, args_to_skip=['world']).")]
                call = f"{plan[i].name}({json.dumps(plan[i].arguments)[:120]})" if i < len(plan) else "a tool call"
                return [_fail("wrong_tools", f"{env_file}: tools", f"in the probe's rollout of dev example {k + 1}, "
                              f"{call} was answered {shown[:160]!r}; the family's tool answers {want[:160]!r}",
                              f"Pass the family's tools unchanged: `from {TOOLS_MODULE_NAME} import TOOLS`, then "
                              "tools=TOOLS (no wrappers, copies or post-processing of their results).")]
        rewards = {key: x.get("reward") for key, (x, _) in by.items()}
        errors = [str(e) for e in r.get("rubric_errors") or []] if isinstance(r.get("rubric_errors"), list) else []
        out = self._rubric_checks([{label: rewards[(k, label)] for label in s} for k, (_, s) in enumerate(scripts)],
                                  errors, env_file)
        if stateful and scripts and not out:
            ignored = [k for k in range(len(scripts)) if isinstance(rewards[(k, "good")], (int, float))
                       and isinstance(rewards[(k, "answer_only")], (int, float))
                       and rewards[(k, "answer_only")] >= rewards[(k, "good")]]
            if len(ignored) == len(scripts):
                out.append(_fail("state_ignored", f"{env_file}: rubric", "your rubric gives the right answer with no "
                                 "tool call at all as much reward as a correct episode on every dev example: it reads "
                                 "the answer text but not the world the tools changed (the hidden eval scores the "
                                 "final state)", "Read state['world'] in a reward function (what the episode left "
                                 "there), not only the answer text."))
        return out

    @staticmethod
    def _rubric_checks(examples: list[dict[str, Any]], errors: list[str], env_file: str) -> list[ProbeFailure]:
        """The rubric, from its rewards per dev example (script label -> reward, as the sandbox reported
        them: untrusted) and the reward-function errors verifiers logged: no errors, finite numbers, and a
        correct episode (``good*``) never rewarded less than a wrong answer (``bad*``) on any example, and more
        on at least one. (A rubric that scores without reading the episode passes the order by chance with
        probability 1/6 per example: each example has two rollouts of each kind, dealt in an order the
        sandbox cannot know.)"""
        out: list[ProbeFailure] = []
        if not examples:
            return out
        if errors:
            uniq = list(dict.fromkeys(errors))[:3]
            out.append(_fail("rubric_error", f"{env_file}: rubric", "reward functions raised: " + " | ".join(uniq),
                             "Reward functions get completion (messages), answer, info, state...; make them "
                             "robust to any completion and return a float."))
        values = [guard.number(v) for ex in examples for v in ex.values()]
        if any(v is None for v in values):
            out.append(_fail("rubric_nonfinite", f"{env_file}: rubric", "the rubric returned NaN, inf, a number "
                             f"beyond ±{guard.MAX_MAGNITUDE:g} or no number",
                             f"Return finite floats within ±{guard.MAX_MAGNITUDE:g} (e.g. 0.0 or 1.0)."))
            return out
        apart = 0
        for k, ex in enumerate(examples):
            good = [float(v) for label, v in ex.items() if label.startswith("good")]
            bad = [float(v) for label, v in ex.items() if label.startswith("bad")]
            if not good or not bad:
                continue
            if max(bad) > min(good):
                out.append(_fail("rubric_order", f"{env_file}: rubric", f"on dev example {k + 1} the rubric gave a "
                                 f"wrong final answer {max(bad):g} and a correct episode {min(good):g}: it must never "
                                 "reward a wrong answer more than a correct one",
                                 "Reward correct final answers more than wrong ones (compare with `answer`), the "
                                 "same way for every rollout."))
                return out
            apart += min(good) > max(bad)
        if not apart:
            vals = sorted({f"{v:g}" for v in values if v is not None})
            out.append(_fail("constant_reward", f"{env_file}: rubric",
                             f"the rubric gives a correct and a wrong answer the same reward on every dev example "
                             f"({', '.join(vals)}); a constant reward cannot train anything",
                             "Reward correct final answers more than wrong ones (compare with `answer`)."))
        return out
