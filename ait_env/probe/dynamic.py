"""Dynamic stage of the validation probe: run the agent's ``load_environment`` in the sandbox.

On a copy of the workspace (with the family's own ``family_tools.py``), inside
:class:`ait_env.sandbox.Sandbox`, the agent's module is imported and ``load_environment(**env)``
is called. Checks (each failure says what, where and how to fix it):

- it returns a classic verifiers ``ToolEnv`` (verifiers 0.2.0);
- the dataset has ``question`` and ``answer`` columns, between the task's min and max rows, no empty
  answers, and at most ``leak_tolerance_rows`` hidden-eval questions in its questions or in any other
  text its prompts are built from (a prompt column, the system prompt, few-shot messages, tool
  descriptions), compared outside the sandbox as instances and in a canonical form that undoes disguises
  (:mod:`ait_env.probe.leak`; a few accidental collisions of short questions are tolerated). The same
  check runs again where the job trains, on what the model is given (:mod:`ait_env.probe.training_audit`);
- the tools are exactly the family's (same names, defined in ``family_tools``);
- the rubric runs on the dev examples with a correct and a wrong transcript, returns finite numbers
  without errors, and does not give both the same reward on every example;
- for a stateful family (tools that change a per-rollout world), whole rollouts of each dev example run in
  the sandbox with verifiers' own rollout code and scripted replies, several concurrently: they must run,
  each must be shown the tool results of its own fresh world (``world_per_rollout``: no world shared between
  rollouts or kept in a module global), and the rubric must reward a correct episode over the right answer
  given without any tool call (``state_ignored``: it must read the state);
- the longest prompt plus ``max_turns × max_tokens`` fits in ``seq_len`` (token counts use the model's
  tokenizer when one is registered, else a conservative estimate of one token per 3 UTF-8 bytes);
- exceptions, ``sys.exit``, hangs, memory blow-ups and resource-limit kills come back as failures
  with the traceback tail;
- what the sandbox reports is the agent's code's output (it runs in the process that writes the report): it
  passes :func:`ait_env.jobs.guard.check` (:data:`REPORT_LIMITS`) and has the types the checks read
  (:data:`REPORT_TYPES`) before any check reads it; a report past those bounds (a 5,000-digit integer, deep
  nesting, a system prompt that is not a string, lone surrogates) is the failure ``unreadable``.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, Field

from ait_env.jobs import guard
from ait_env.jobs.settings import TokenCounter
from ait_env.jobs.bundle import write_env_package
from ait_env.jobs.primerl import token_budget_rule
from ait_env.jobs.schema import Job
from ait_env.probe.leak import LEAK_TOLERANCE, LeakIndex
from ait_env.probe.report import ProbeFailure
from ait_env.sandbox import Sandbox, SandboxSettings, shared_sandbox
from ait_env.hidden.redact import for_agent
from task_families.base import TOOLS_MODULE_NAME, TaskFamily, TaskSpec


#: the package name the probe imports the agent's files under (a bundle uses its job's env id)
PROBE_ENV_ID = "ait_job_probe"
#: the sandbox job the probe runs (inside the sandbox, from a copy of the file)
PROBE_JOBS = {"inspect": Path(__file__).with_name("inspect_job.py")}
#: the bounds of what the sandbox reports (at most the zygote's 16 MB of result; NaN and infinity pass: the
#: rubric checks name them)
REPORT_LIMITS = guard.Limits(finite=False)
#: the JSON type of each field of a sandbox report that the checks read (as ``inspect_job`` writes them)
REPORT_TYPES: dict[str, type] = {
    "stage": str, "kind": str, "error": str, "traceback": str, "signal": str, "exit_code": int, "columns": list,
    "rows": int, "empty_answers": int, "questions": list, "prompt_texts": list, "max_turns": int,
    "system_prompt": str, "longest_prompt": str, "tools": dict, "tool_defs": str, "scores": list, "rollouts": list}


def report_problem(resp: Any) -> str | None:
    """What is wrong with the shape of a sandbox report (the agent's code runs in the process that writes
    it, so any field may hold anything), or None."""
    if not isinstance(resp, dict):
        return f"a {type(resp).__name__} instead of a report"
    for key, kind in REPORT_TYPES.items():
        value = resp.get(key)
        if value is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
            return f"its {key} as a {type(value).__name__}, not a {kind.__name__}"
    if not all(isinstance(c, str) for c in resp.get("columns") or []):
        return "dataset column names that are not strings"
    if not all(isinstance(t, dict) for t in (resp.get("tools") or {}).values()):
        return "tools described by something other than an object"
    return None


def probe_sandbox(settings: SandboxSettings | None = None) -> Sandbox:
    """A sandbox of its own that runs the probe's job (the env's probes share :func:`shared_sandbox`)."""
    return Sandbox(settings, PROBE_JOBS)

_STAGE_TEXT = {"start": "starting", "import": "importing your module", "load_environment": "running load_environment",
               "dataset": "reading the dataset", "rubric": "running your rubric on the dev examples",
               "rollout": "running scripted rollouts of the dev examples", "result": "returning what it found"}

#: the scripted rollouts of one dev example of a stateful family, run concurrently in one group: two correct
#: ones (a world shared between rollouts shows in their tool results), a correct one with a wrong answer,
#: and the right answer with no tool call at all (a rubric that ignores the state rewards it)
STATEFUL_SCRIPTS = ("good", "good_again", "bad", "answer_only")


class DynamicSettings(BaseModel):
    enabled: bool = True
    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    leak_tolerance_rows: int = Field(LEAK_TOLERANCE, ge=0)


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


class DynamicProbe:
    """The dynamic stage; callable as :class:`ait_env.probe.DynamicStage`."""

    def __init__(self, settings: DynamicSettings | None = None, sandbox: Sandbox | None = None,
                 hidden_questions: Callable[[str], list[str]] | None = None,
                 token_counter: TokenCounter | None = None) -> None:
        """``token_counter``: the backend's (:meth:`ait_env.backends.Backend.token_counter`), so prompt
        lengths are counted with the job's model's tokenizer where the backend has it."""
        self.settings = settings or DynamicSettings()
        self._sandbox = sandbox
        self._token_counter = token_counter
        if hidden_questions is None:
            from ait_env.hidden.secrets import hidden_questions
        self._hidden_questions = hidden_questions
        self._leak_indexes: dict[str, LeakIndex] = {}

    def leak_index(self, family: str) -> LeakIndex:
        if family not in self._leak_indexes:
            from task_families import get_family

            self._leak_indexes[family] = LeakIndex(self._hidden_questions(family), get_family(family))
        return self._leak_indexes[family]

    @property
    def sandbox(self) -> Sandbox:
        if self._sandbox is None:
            self._sandbox = shared_sandbox(self.settings.sandbox, PROBE_JOBS)
        return self._sandbox

    def warm(self) -> None:
        self.sandbox.warm()

    def _request(self, job: Job, task: TaskSpec, family: TaskFamily, inside_dir: str) -> dict[str, Any]:
        import random

        rng = random.Random(0)
        dev, rollouts = [], []
        for inst in task.dev_examples:
            row = {"prompt": family.eval_messages(inst), "answer": inst.answer, "info": family.job_info(inst),
                   "example_id": 0}
            good, bad = family.transcript(inst), family.transcript(inst, correct=False, rng=rng)
            if family.state_args:  # the world exists only inside a rollout: run whole scripted ones
                said = {"good": good, "good_again": good, "bad": bad,
                        "answer_only": [{"role": "assistant", "content": family.final_answer(inst)}]}
                rollouts.append({"row": row, "scripts": [[m for m in said[k] if m["role"] == "assistant"]
                                                         for k in STATEFUL_SCRIPTS]})
            else:
                dev.append({"row": row, "good": good, "bad": bad})
        return {"job": "inspect", "dir": inside_dir, "package": PROBE_ENV_ID, "args": job.env, "dev": dev,
                "rollouts": rollouts,
                "tools_module": TOOLS_MODULE_NAME,
                "max_rows": task.bounds.max_examples + 1, "limits": self.settings.sandbox.limits.model_dump()}

    def __call__(self, root: Path, job: Job, task: TaskSpec, family: TaskFamily) -> tuple[list[ProbeFailure], str]:
        sb = self.sandbox
        outside, inside = sb.new_workdir()
        try:
            write_env_package(Path(root), job, family, outside, PROBE_ENV_ID)  # laid out as the bundle will be
            resp = sb.run(self._request(job, task, family, inside), outside)
        finally:
            sb.release(outside)
        return self.interpret(resp, job, task, family), sb.description

    # ------------------------------------------------------------------ interpretation
    def interpret(self, resp: dict[str, Any], job: Job, task: TaskSpec, family: TaskFamily) -> list[ProbeFailure]:
        env_file = job.job.environment
        limits = self.settings.sandbox.limits
        try:
            guard.check(resp, REPORT_LIMITS, what="what your environment returned")
            problem = report_problem(resp)
            if problem is not None:
                raise guard.Refused(f"what your environment returned has {problem}")
        except guard.Refused as exc:
            return [_fail("unreadable", env_file, str(exc), "Build the dataset, system prompt, tools and rubric "
                          "from plain strings and small numbers (what verifiers expects), and keep error "
                          "messages plain text.")]
        status = resp.get("status")
        stage = _STAGE_TEXT.get(str(resp.get("stage")), str(resp.get("stage")))
        if status == "timeout":
            return [_fail("timeout", env_file, f"your code did not finish within {limits.wall_seconds:g} s "
                          f"(it was {stage})", "Remove infinite loops and keep load_environment and the rubric "
                          "fast: build datasets of at most a few thousand rows in well under a second.")]
        if status == "crashed":
            sig = resp.get("signal", "")
            what = {"SIGXCPU": f"CPU time limit ({limits.cpu_seconds} s)",
                    "SIGXFSZ": f"file size limit ({limits.file_size_mb} MB)",
                    "SIGKILL": "a resource limit (memory or processes)",
                    "SIGSEGV": "a crash (segmentation fault), often from memory exhaustion"}.get(sig, sig)
            return [_fail("resource_limit", env_file, f"your code was killed by {what} while {stage}",
                          "Use less memory and CPU; do not start processes or write large files.")]
        if status == "disk_limit":
            return [_fail("disk_limit", env_file, f"your code wrote more than {limits.scratch_mb} MB (or "
                          f"{limits.scratch_inodes} files) while {stage}",
                          "Do not write files; build datasets in memory.")]
        if status in ("no_result",):
            return [_fail("no_result", env_file, f"your code exited without a result while {stage} "
                          f"(exit code {resp.get('exit_code')})", "Do not call os._exit or kill the process.")]
        if status == "error":
            kind = resp.get("kind")
            tb = resp.get("traceback", "")
            where = _agent_location(tb, env_file)
            detail = resp.get("error", "")
            if kind == "exit":
                return [_fail("exit_called", where, f"{detail} while {stage}", "Never call sys.exit / exit().")]
            if kind == "memory":
                return [_fail("memory_limit", where, f"out of memory (limit {limits.memory_mb} MB) while {stage}",
                              "Build smaller datasets; do not allocate huge lists or strings.")]
            if kind == "contract":
                return [_fail("not_verifiers_env", env_file, detail,
                              "load_environment must return vf.ToolEnv(dataset=..., tools=TOOLS, rubric=vf.Rubric(...)).")]
            code = "import_error" if resp.get("stage") == "import" else "load_error"
            return [_fail(code, where, f"{detail} while {stage}\n{_clean_tb(tb)}",
                          "Fix the exception (the traceback tail above points at your code).")]
        if status != "ok":
            return [_fail("sandbox", env_file, f"unexpected sandbox answer {resp!r}")]
        return self._checks(resp, job, task, family)

    def _checks(self, r: dict[str, Any], job: Job, task: TaskSpec, family: TaskFamily) -> list[ProbeFailure]:
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
        if family.state_args:
            rollouts = r.get("rollouts")
            out.extend(self._stateful_checks(rollouts if isinstance(rollouts, list) else [], task, family, env_file))
        else:
            scores = r.get("scores")
            out.extend(self._rubric_checks(scores if isinstance(scores, list) else [], env_file))
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
        questions = [str(q) for q in r.get("questions") or []]
        rows = index.count(questions)
        others = [str(t) for t in r.get("prompt_texts") or []]
        others += [str(r.get("system_prompt") or ""), str(r.get("tool_defs") or "")]
        distinct = index.leaked(questions) | index.leaked(others)
        if rows <= tol and len(distinct) <= tol:
            return []
        where = "dataset questions" if rows > tol else "prompts (system prompt, prompt column or tool descriptions)"
        return [_fail("eval_leak", f"{env_file}: {where}", f"{max(rows, len(distinct))} hidden-eval questions "
                      f"appear in your {where} ({rows} question rows; {len(distinct)} distinct hidden questions "
                      "in all texts of the prompts), compared as instances (the same numbers, people or items "
                      "however worded) and as text after normalising case, spacing, punctuation and Unicode "
                      "look-alikes", "Generate fresh questions; do not copy or re-word evaluation data.")]

    def _stateful_checks(self, rollouts: list[Any], task: TaskSpec, family: TaskFamily,
                         env_file: str) -> list[ProbeFailure]:
        """A stateful family's environment, judged by its scripted rollouts (:data:`STATEFUL_SCRIPTS`): they
        run without errors; the two correct rollouts of an example, run concurrently, are shown exactly the
        tool results a fresh world of that example gives (else the world is shared between rollouts, or not
        the one the tools act on); the rubric tells a correct episode from a wrong answer (the usual rubric
        checks) and from the right answer with no tool calls (else it ignores the state)."""
        layout = sorted(family.job_info(task.dev_examples[0])) if task.dev_examples else []
        where_rows = (f"The probe's rollouts use the dev examples, with each row's info laid out as the "
                      f"family's INSTRUCTIONS.md says ({', '.join(layout)})")
        out: list[ProbeFailure] = []
        if len(rollouts) != len(task.dev_examples):
            return [_fail("stateful_rollout", f"{env_file}: rollout", f"{len(rollouts)} of "
                          f"{len(task.dev_examples)} scripted rollouts of the dev examples came back",
                          where_rows + "; keep load_environment and the rollouts fast and free of side effects.")]
        pairs, answer_only_wins, n_examples = [], 0, 0
        for k, (inst, runs) in enumerate(zip(task.dev_examples, rollouts)):
            runs = [r for r in runs if isinstance(r, dict)] if isinstance(runs, list) else []
            if len(runs) != len(STATEFUL_SCRIPTS):
                err = next((r.get("error") for r in runs if r.get("error")), "no result")
                return [_fail("stateful_rollout", f"{env_file}: rollout", f"a scripted rollout of dev example {k + 1} "
                              f"failed: {str(err)[:500]}", where_rows + "; build the world in setup_state from "
                              "state['info'] and make every tool call work on it.")]
            by = dict(zip(STATEFUL_SCRIPTS, runs))
            broken = next((r for r in runs if r.get("error")), None)
            if broken is not None:
                return [_fail("stateful_rollout", f"{env_file}: rollout", f"a scripted rollout of dev example {k + 1} "
                              f"failed: {str(broken['error'])[:500]}", where_rows + "; build the world in setup_state from "
                              "state['info'] and make every tool call work on it.")]
            expected = [str(m.get("content")) for m in family.transcript(inst) if m.get("role") == "tool"]
            for name in ("good", "good_again"):
                shown_results = by[name].get("tool_results")
                got = [str(x) for x in shown_results] if isinstance(shown_results, list) else []
                if got != expected:
                    i = next((j for j, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
                    shown = got[i] if i < len(got) else "(no result)"
                    want = expected[i] if i < len(expected) else "(no result)"
                    return [_fail("world_per_rollout", f"{env_file}: tools", "in concurrent scripted rollouts of dev "
                                  f"example {k + 1}, tool call {i + 1} was answered {shown[:160]!r} where a fresh world "
                                  f"of that example answers {want[:160]!r}: the world is shared between rollouts "
                                  "(a module global, one object for the whole environment) or the tools do not act "
                                  "on the rollout's own world",
                                  "Subclass vf.StatefulToolEnv: create the world per rollout in setup_state "
                                  "(state['world'] = new_world(state['info']['world'])) and return "
                                  "{**tool_args, 'world': state['world']} from update_tool_args; add each tool "
                                  "with add_tool(tool, args_to_skip=['world']).")]
            pairs.append({"good": by["good"], "bad": by["bad"]})
            g, a = by["good"].get("reward"), by["answer_only"].get("reward")
            n_examples += 1
            if isinstance(g, (int, float)) and isinstance(a, (int, float)) and a >= g:
                answer_only_wins += 1
        out.extend(self._rubric_checks(pairs, env_file))
        if n_examples and answer_only_wins == n_examples and not out:
            out.append(_fail("state_ignored", f"{env_file}: rubric", "your rubric gives the right answer with no "
                             "tool call at all as much reward as a correct episode on every dev example: it reads "
                             "the answer text but not the world the tools changed (the hidden eval scores the "
                             "final state)", "Read state['world'] in a reward function (what the episode left "
                             "there), not only the answer text."))
        return out

    @staticmethod
    def _rubric_checks(scores: list[dict[str, Any]], env_file: str) -> list[ProbeFailure]:
        out: list[ProbeFailure] = []
        if not scores:
            return out
        errors: list[str] = []
        nonfinite = False
        same = 0
        scores = [p for p in scores if isinstance(p, dict)]  # what the sandbox sends is untrusted
        for pair in scores:
            g, b = (pair.get(k) if isinstance(pair.get(k), dict) else {} for k in ("good", "bad"))
            for side in (g, b):
                errs = side.get("errors")
                if isinstance(errs, list):
                    errors.extend(str(e) for e in errs)
                if guard.number(side.get("reward")) is None:
                    nonfinite = True
            if g.get("reward") == b.get("reward"):
                same += 1
        if errors:
            uniq = list(dict.fromkeys(errors))[:3]
            out.append(_fail("rubric_error", f"{env_file}: rubric", "reward functions raised: " + " | ".join(uniq),
                             "Reward functions get completion (messages), answer, info, state...; make them "
                             "robust to any completion and return a float."))
        if nonfinite:
            out.append(_fail("rubric_nonfinite", f"{env_file}: rubric", "the rubric returned NaN, inf, a number "
                             f"beyond ±{guard.MAX_MAGNITUDE:g} or no number",
                             f"Return finite floats within ±{guard.MAX_MAGNITUDE:g} (e.g. 0.0 or 1.0)."))
        elif same == len(scores):
            vals = sorted({json.dumps(p["good"].get("reward") if isinstance(p.get("good"), dict) else None)
                           for p in scores})
            out.append(_fail("constant_reward", f"{env_file}: rubric",
                             f"the rubric gives a correct and a wrong answer the same reward on every dev example "
                             f"({', '.join(vals)}); a constant reward cannot train anything",
                             "Reward correct final answers more than wrong ones (compare with `answer`)."))
        return out
