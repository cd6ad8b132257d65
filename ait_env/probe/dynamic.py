"""Dynamic stage of the validation probe: run the agent's ``load_environment`` in the sandbox.

On a copy of the workspace (with the family's own ``family_tools.py``), inside
:class:`ait_env.sandbox.Sandbox`, the agent's module is imported and ``load_environment(**env)``
is called. Checks (each failure says what, where and how to fix it):

- it returns a classic verifiers ``ToolEnv`` (verifiers 0.2.0);
- the dataset has ``question`` and ``answer`` columns, between the task's min and max rows, no empty
  answers, and at most ``leak_tolerance_rows`` hidden-eval questions in its questions or in any other
  text its prompts are built from (a prompt column, the system prompt, few-shot messages, tool schemas),
  read outside the sandbox as the model reads them (:func:`ait_env.probe.leak.model_texts`: content parts
  joined, schemas' keys and values) in every normalised reading (:mod:`ait_env.probe.leak`; a few
  accidental collisions of short questions are tolerated). The same check runs again where the job
  trains, on what the model is given (:mod:`ait_env.probe.training_audit`);
- the tools are exactly the family's (same names, defined in ``family_tools``);
- **the rollouts** (:meth:`DynamicProbe._rollout_checks`): each dev example is rolled out in the sandbox
  with the call training makes (``run_groups``: verifiers' rollouts and the rubric) against the probe's
  scripted model, served here, outside the sandbox (:mod:`ait_env.probe.scripted_model`), which deals each
  example's scripts (:data:`STATELESS_SCRIPTS`, :data:`STATEFUL_SCRIPTS`) to its concurrent rollouts in an
  order the sandbox cannot know, with nonce ids. Every decision is made here: the rollouts ran and their
  results name the model's own replies; the environment offered exactly the family's tools and showed the
  family's own results (on a fresh world of the example: ``world_per_rollout`` for a stateful family,
  whose world must be per rollout); the rubric returns finite numbers without errors, never rewards a
  wrong answer over a correct episode (``rubric_order``) and tells them apart somewhere
  (``constant_reward``); a stateful rubric must also reward a correct episode over the right answer given
  without a tool call (``state_ignored``: it must read the state). Nothing the sandbox computes on its own
  decides: patching the probe's code there changes nothing, patching the shared rollout code changes
  training the same way;
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

from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, Field

from ait_env.jobs import guard
from ait_env.jobs.settings import TokenCounter
from ait_env.jobs.bundle import write_env_package
from ait_env.jobs.schema import Job
from ait_env.probe.leak import LEAK_TOLERANCE, LeakIndex
from ait_env.probe.scripted_model import ScriptedModel
from ait_env.probe.report import ProbeFailure
from ait_env.probe.checks import PROBE_ENV_ID, REPORT_LIMITS, _Checks, _agent_location, _clean_tb, _fail
from ait_env.sandbox import Sandbox, SandboxSettings, shared_sandbox
from task_families.base import TOOLS_MODULE_NAME, TaskFamily, TaskSpec


#: the sandbox job the probe runs (inside the sandbox, from a copy of the file)
PROBE_JOBS = {"inspect": Path(__file__).with_name("inspect_job.py")}
#: the JSON type of each field of a sandbox report that the checks read (as ``inspect_job`` writes them)
REPORT_TYPES: dict[str, type] = {
    "stage": str, "kind": str, "error": str, "traceback": str, "signal": str, "exit_code": int, "columns": list,
    "rows": int, "empty_answers": int, "questions": list, "prompt_messages": list, "max_turns": int,
    "system_prompt": str, "longest_prompt": str, "tools": dict, "tool_defs": str, "rollouts": list,
    "rollout_error": str, "rubric_errors": list}


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

#: the scripted rollouts of one dev example, run concurrently in one group: two correct episodes and two with
#: a wrong answer (the rubric must rank every correct one at least as high as every wrong one)
STATELESS_SCRIPTS = ("good", "good_again", "bad", "bad_again")
#: those of a stateful family: two correct ones (a world shared between rollouts shows in their tool
#: results), a correct one with a wrong answer, and the right answer with no tool call at all (a rubric that
#: ignores the state rewards it)
STATEFUL_SCRIPTS = ("good", "good_again", "bad", "answer_only")
#: the probe's scripted model's socket, in the request's folder
MODEL_SOCKET = "model.sock"


class DynamicSettings(BaseModel):
    enabled: bool = True
    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    leak_tolerance_rows: int = Field(LEAK_TOLERANCE, ge=0)


class DynamicProbe(_Checks):
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

    @staticmethod
    def scripts(task: TaskSpec, family: TaskFamily) -> list[tuple[str, dict[str, list[dict[str, Any]]]]]:
        """What the probe's scripted model replies in the rollouts of each dev example: per example, its
        question and its scripts (:data:`STATELESS_SCRIPTS` or :data:`STATEFUL_SCRIPTS`, label -> the
        assistant messages of that episode, from :meth:`~task_families.base.TaskFamily.transcript`)."""
        import random

        rng = random.Random(0)
        out = []
        for inst in task.dev_examples:
            good, bad = family.transcript(inst), family.transcript(inst, correct=False, rng=rng)
            said = {"good": good, "good_again": good, "bad": bad,
                    "bad_again": family.transcript(inst, correct=False, rng=rng),
                    "answer_only": [{"role": "assistant", "content": family.final_answer(inst)}]}
            labels = STATEFUL_SCRIPTS if family.state_args else STATELESS_SCRIPTS
            out.append((inst.question, {k: [m for m in said[k] if m["role"] == "assistant"] for k in labels}))
        return out

    def _request(self, job: Job, task: TaskSpec, family: TaskFamily, inside_dir: str) -> dict[str, Any]:
        rows = [{"prompt": family.eval_messages(inst), "answer": inst.answer, "info": family.job_info(inst)}
                for inst in task.dev_examples]
        return {"job": "inspect", "dir": inside_dir, "package": PROBE_ENV_ID, "args": job.env, "rows": rows,
                "group_size": len(STATEFUL_SCRIPTS if family.state_args else STATELESS_SCRIPTS),
                "uds": f"{inside_dir}/{MODEL_SOCKET}", "model": job.job.base_model, "tools_module": TOOLS_MODULE_NAME,
                "max_rows": task.bounds.max_examples + 1, "limits": self.settings.sandbox.limits.model_dump()}

    def __call__(self, root: Path, job: Job, task: TaskSpec, family: TaskFamily) -> tuple[list[ProbeFailure], str]:
        sb = self.sandbox
        outside, inside = sb.new_workdir()
        try:
            write_env_package(Path(root), job, family, outside, PROBE_ENV_ID)  # laid out as the bundle will be
            with ScriptedModel(outside / MODEL_SOCKET, self.scripts(task, family), job.job.base_model) as model:
                sb.share_socket(outside / MODEL_SOCKET)
                resp = sb.run(self._request(job, task, family, inside), outside)
        finally:
            sb.release(outside)
        return self.interpret(resp, job, task, family, model), sb.description

    # ------------------------------------------------------------------ interpretation
    def interpret(self, resp: dict[str, Any], job: Job, task: TaskSpec, family: TaskFamily,
                  model: ScriptedModel | None = None) -> list[ProbeFailure]:
        """The probe's failures from the sandbox's report ``resp`` and what the scripted ``model`` saw of the
        rollouts (None: no rollout reached a model, which fails the rollout checks)."""
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
        return self._checks(resp, job, task, family, model)


