"""The agent's six tools: argument schemas, JSON schemas for LLM prompts, and a thin dispatcher.

``read_file``, ``write_file``, ``edit_file`` and ``list_files`` act on the :class:`Workspace`;
``get_baseline_scores`` and ``submit_job`` are delegated to callbacks the env provides. Tools never
raise on bad input: every problem becomes a :class:`ToolOutcome` with ``ok=False`` and a message
that says how to fix the call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ait_env.toolcalls import ToolCall
from ait_env.workspace import Workspace, WorkspaceError


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


def tool_schemas() -> list[dict[str, Any]]:
    """OpenAI-style function schemas of the six tools."""
    out = []
    for name, (desc, model) in TOOL_DOCS.items():
        props = {k: {"type": "string", "description": f.description or ""} for k, f in model.model_fields.items()}
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
    expected = ", ".join(f"{k} (string)" for k in model.model_fields) or "no arguments"
    problems = "; ".join(
        f"{'.'.join(str(x) for x in e['loc']) or 'arguments'}: "
        f"{'unexpected argument' if e['type'] == 'extra_forbidden' else e['msg']}" for e in exc.errors())
    return f"error: bad arguments for {name}: {problems}. Expected: {expected}."


class ToolBox:
    """Dispatches parsed calls to the workspace and to the env's callbacks."""

    def __init__(self, workspace: Workspace, baselines: Callable[[], str],
                 submit: Callable[[], ToolOutcome]) -> None:
        self.ws = workspace
        self._baselines = baselines
        self._submit = submit

    def run(self, call: ToolCall) -> ToolOutcome:
        name = call.name
        if name not in TOOL_DOCS:
            return ToolOutcome(name, False, f"error: unknown tool {name!r}. Available tools: "
                               + ", ".join(TOOL_NAMES) + ".")
        model = TOOL_DOCS[name][1]
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
