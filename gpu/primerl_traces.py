"""The training audit on a GPU: prime-rl v0.7.0's rollout traces, read outside the jail.

prime-rl's orchestrator appends every train rollout, the moment it completes, to
``<output_dir>[/run_default]/rollouts/step_<n>/train/all/traces.jsonl`` (and the trained-on subset to
``.../effective/traces.jsonl``): ``orchestrator.py`` and ``utils.save_rollouts`` at tag v0.7.0 (d334ea52),
paths from ``utils/pathing.py::get_trace_path``. A record is verifiers' ``Trace.to_record()`` (the v1
trace of verifiers 0.2.0, ``verifiers/v1/trace.py``): ``nodes`` holds every message of the rollout's
conversation tree (system, user, assistant with ``tool_calls`` as ``{id, name, arguments}``, tool with
``tool_call_id``), each with the token ids the model saw.

:func:`audit_traces` runs :class:`ait_env.probe.training_audit.TrainingAudit` — the hidden-set leak check and the
family-tool check — over every message of every train trace, after training and before the post eval,
in the worker process (the hidden questions never enter the jail). The traces are written inside the jail
by prime-rl's orchestrator, next to the agent's environment server; they are what prime-rl trained from
unless code in the jail rewrote them, which the local backend's audit (on the model endpoint's own
records) does not have to assume. A line that is not JSON (one cut off when the run stopped) is skipped; a
line past the bounds of :func:`ait_env.jobs.guard.loads` (integers, nesting, sizes: what the agent's
environment put in a message) fails the job, since an unread line could hide a leak; a job with no trace at
all is reported.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ait_env.jobs import guard
from ait_env.jobs.failures import JobFailed

#: the per-step train trace files under a prime-rl output folder (both layouts of v0.7.0's pathing.py)
TRACE_GLOB = "rollouts/step_*/train/{subset}/traces.jsonl"
#: at most this many bytes of traces are read (a bound, far above a job's bounds allow)
MAX_TRACE_BYTES = 2 * 2**30
#: the bounds of one trace line (one rollout's conversation tree with its token ids)
TRACE_LIMITS = guard.Limits(max_chars=256 * 2**20, max_items=20_000_000)


def trace_files(output_dir: Path) -> list[Path]:
    """The train trace files of a run, ``all`` (every completed rollout) where present, else ``effective``."""
    root = Path(output_dir)
    for subset in ("all", "effective"):
        found = sorted(root.glob(TRACE_GLOB.format(subset=subset))) + \
            sorted(root.glob("run_default/" + TRACE_GLOB.format(subset=subset)))
        if found:
            return sorted(set(found))
    return []


def conversations(files: list[Path]) -> Iterator[tuple[list[Any], None]]:
    """(messages, None) per trace record: every message of its conversation tree."""
    budget = MAX_TRACE_BYTES
    for path in files:
        with open(path, "rb") as f:
            for line in f:
                budget -= len(line)
                if budget < 0:
                    return
                try:
                    record = guard.loads(line, TRACE_LIMITS, what=f"a rollout trace ({path.name})")
                except guard.NotJSON:
                    continue
                except guard.Refused as exc:
                    raise JobFailed(f"the training audit cannot read what your environment gave the model ({exc}); "
                                    "keep prompts, tool schemas and tool results plain text and small JSON") from None
                nodes = record.get("nodes") if isinstance(record, dict) else None
                if isinstance(nodes, list):
                    yield [n.get("message") for n in nodes if isinstance(n, dict)], None


def audit_traces(output_dir: Path, family: str, log: Any = None) -> int:
    """Audit a prime-rl run's train traces (module docstring); raises the job's
    :class:`~ait_env.jobs.failures.JobFailed` (``eval_leak`` / ``foreign_tools``). Returns how many tool
    results were compared."""
    from ait_env.probe.training_audit import TrainingAudit
    from ait_env.hidden.secrets import hidden_questions
    from task_families import get_family

    files = trace_files(output_dir)
    if not files:
        if log is not None:
            log(f"no rollout traces under {output_dir}: the training audit had nothing to read")
        return 0
    audit = TrainingAudit(get_family(family), hidden_questions(family))
    audit.review(conversations(files))
    if log is not None:
        log(f"training audit: {len(files)} trace files, {audit.checked_results} tool results compared, "
            f"{len(audit.leaked)} hidden questions seen")
    return audit.checked_results
