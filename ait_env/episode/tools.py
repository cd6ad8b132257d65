"""The agent's six tools: argument schemas, JSON schemas for LLM prompts, and a thin dispatcher.

``read_file``, ``write_file``, ``edit_file`` and ``list_files`` act on the :class:`Workspace`;
``get_baseline_scores`` and ``submit_job`` are delegated to callbacks the env provides. Tools never
raise on bad input: every problem becomes a :class:`ToolOutcome` with ``ok=False`` and a message
that says how to fix the call.

A research episode (``env.max_jobs_per_episode > 1``) has two more tools, ``submit_jobs`` (several jobs at
once, one per workspace folder, validated each on its own and run concurrently) and ``finish``, and a
``submit_job`` whose description says that a job's result comes back (:func:`tool_docs` with
``research=True``); an episode of one job never shows them. This module is the one place that defines the
tools: the env, the verifiers, TRL and Tinker adapters and the LLM runner all declare :func:`tool_schemas`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ait_env.jobs import guard
from ait_env.jobs.toolcalls import ToolCall
from ait_env.sandbox.workspace import Workspace, WorkspaceError


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ReadFileArgs(_Args):
    path: str = Field(description="File path relative to the workspace root, e.g. 'job.toml'.")


class WriteFileArgs(_Args):
    path: str = Field(description="File path relative to the workspace root.")
    content: str = Field(description="The complete new text of the file (UTF-8).")


class EditFileArgs(_Args):
    path: str = Field(description="File path relative to the workspace root.")
    old_text: str = Field(description="Exact text to replace; must occur exactly once in the file.")
    new_text: str = Field(description="Replacement text.")


class NoArgs(_Args):
    pass


class SubmitJobsArgs(_Args):
    folders: list[str] = Field(description="Workspace folders, each holding a complete job (its job.toml and "
                                           "environment module), e.g. [\"lr_low\", \"lr_high\"]; \".\" is "
                                           "the workspace root.")

    @field_validator("folders", mode="before")
    @classmethod
    def _json_list(cls, value: Any) -> Any:
        """A list written as JSON text (``'["a", "b"]'``, as some tool-call parsers pass it) is that list (read
        through :mod:`ait_env.jobs.guard`: text past its bounds stays text, which the schema refuses)."""
        if isinstance(value, str) and value.strip().startswith("["):
            try:
                return guard.loads(value, what="folders")
            except guard.Refused:
                return value
        return value


TOOL_DOCS: dict[str, tuple[str, type[_Args]]] = {
    "read_file": ("Read a text file of the workspace.", ReadFileArgs),
    "write_file": ("Create or overwrite a text file in the workspace.", WriteFileArgs),
    "edit_file": ("Replace one exact, unique occurrence of old_text with new_text in a file.", EditFileArgs),
    "list_files": ("List the workspace's files with their sizes in bytes.", NoArgs),
    "get_baseline_scores": ("Hidden-eval scores of the allowed base models before any training.", NoArgs),
    "submit_job": ("Validate job.toml and your environment module; if valid, run the training job and end "
                   "the episode with its reward. If invalid, every problem is listed and attempts are "
                   "limited.", NoArgs),
}
TOOL_NAMES: tuple[str, ...] = tuple(TOOL_DOCS)
#: what changes in a research episode: submit_job's description, and the submit_jobs and finish tools
RESEARCH_TOOL_DOCS: dict[str, tuple[str, type[_Args]]] = {
    "submit_job": ("Validate job.toml and your environment module; if valid, run the training job and show "
                   "you its result (scores, eval curve, time, cost). You may then revise the workspace and "
                   "submit another job until the job limit or the budget ends, or call finish. If invalid, "
                   "every problem is listed and attempts per job are limited.", NoArgs),
    "submit_jobs": ("Run several experiments at once: each folder holds a complete job and is validated on "
                    "its own (a refused one does not stop the others, and counts as an attempt); the valid "
                    "ones train at the same time and their results come back together. Each job counts "
                    "toward the job limit and is charged like a job submitted alone.", SubmitJobsArgs),
    "finish": ("End the episode now; your reward counts your best job so far.", NoArgs),
}
#: the tools only a research episode has
RESEARCH_ONLY: tuple[str, ...] = ("submit_jobs", "finish")


def tool_docs(research: bool = False) -> dict[str, tuple[str, type[_Args]]]:
    """The tools of an episode: the six, or in a research episode the six with ``submit_jobs`` and ``finish``."""
    return {**TOOL_DOCS, **RESEARCH_TOOL_DOCS} if research else TOOL_DOCS


def tool_schemas(research: bool = False) -> list[dict[str, Any]]:
    """OpenAI-style function schemas of the episode's tools (see :func:`tool_docs`)."""
    out = []
    for name, (desc, model) in tool_docs(research).items():
        props = {k: {"type": "array", "items": {"type": "string"}, "description": f.description or ""}
                 if f.annotation == list[str] else {"type": "string", "description": f.description or ""}
                 for k, f in model.model_fields.items()}
        out.append({"type": "function", "function": {
            "name": name, "description": desc,
            "parameters": {"type": "object", "properties": props, "required": list(props)}}})
    return out


@dataclass
class ToolOutcome:
    name: str
    ok: bool
    text: str
    ends_episode: bool = False


def _args_error(name: str, exc: ValidationError, model: type[_Args]) -> str:
    expected = ", ".join(f"{k} ({'list of strings' if f.annotation == list[str] else 'string'})"
                         for k, f in model.model_fields.items()) or "no arguments"
    problems = "; ".join(
        f"{'.'.join(str(x) for x in e['loc']) or 'arguments'}: "
        f"{'unexpected argument' if e['type'] == 'extra_forbidden' else e['msg']}" for e in exc.errors())
    return f"error: bad arguments for {name}: {problems}. Expected: {expected}."


class ToolBox:
    """Dispatches parsed calls to the workspace and to the env's callbacks."""

    def __init__(self, workspace: Workspace, baselines: Callable[[], str],
                 submit: Callable[[], ToolOutcome], finish: Callable[[], ToolOutcome] | None = None,
                 submit_many: Callable[[list[str]], ToolOutcome] | None = None) -> None:
        """``finish`` and ``submit_many``: the research episode's callbacks of ``finish`` and ``submit_jobs``;
        without ``finish`` neither tool exists."""
        self.ws = workspace
        self._baselines = baselines
        self._submit = submit
        self._finish_cb = finish
        self._submit_many = submit_many
        self.docs = tool_docs(research=finish is not None)

    def run(self, call: ToolCall) -> ToolOutcome:
        name = call.name
        if name not in self.docs:
            return ToolOutcome(name, False, f"error: unknown tool {name!r}. Available tools: "
                               + ", ".join(self.docs) + ".")
        model = self.docs[name][1]
        try:
            args = model.model_validate(call.arguments)
        except ValidationError as exc:
            return ToolOutcome(name, False, _args_error(name, exc, model))
        try:
            return getattr(self, f"_{name}")(args)
        except WorkspaceError as exc:
            return ToolOutcome(name, False, f"error: {exc}")

    def _read_file(self, a: ReadFileArgs) -> ToolOutcome:
        return ToolOutcome("read_file", True, self.ws.read(a.path))

    def _write_file(self, a: WriteFileArgs) -> ToolOutcome:
        n = self.ws.write(a.path, a.content)
        return ToolOutcome("write_file", True, f"wrote {n} bytes to {self.ws.normalise(a.path)}")

    def _edit_file(self, a: EditFileArgs) -> ToolOutcome:
        line = self.ws.edit(a.path, a.old_text, a.new_text)
        return ToolOutcome("edit_file", True, f"edited {self.ws.normalise(a.path)} at line {line}")

    def _list_files(self, a: NoArgs) -> ToolOutcome:  # noqa: ARG002
        items = self.ws.listing()
        limit = self.ws.quota.max_list_entries
        lines = [f"{size:>8}  {path}" + ("  (read-only)" if path in self.ws.read_only else "")
                 for path, size in items[:limit]]
        if len(items) > limit:
            lines.append(f"... and {len(items) - limit} more")
        q = self.ws.quota
        lines.append(f"{len(items)} files, {sum(s for _, s in items)} bytes (limits: {q.max_files} files, "
                     f"{q.max_file_bytes} bytes per file, {q.max_total_bytes} bytes in all)")
        return ToolOutcome("list_files", True, "\n".join(lines))

    def _get_baseline_scores(self, a: NoArgs) -> ToolOutcome:  # noqa: ARG002
        return ToolOutcome("get_baseline_scores", True, self._baselines())

    def _submit_job(self, a: NoArgs) -> ToolOutcome:  # noqa: ARG002
        return self._submit()

    def _submit_jobs(self, a: SubmitJobsArgs) -> ToolOutcome:
        assert self._submit_many is not None  # run() knows submit_jobs only in a research episode
        return self._submit_many(list(a.folders))

    def _finish(self, a: NoArgs) -> ToolOutcome:  # noqa: ARG002
        assert self._finish_cb is not None  # run() knows finish only when the callback exists
        return self._finish_cb()
