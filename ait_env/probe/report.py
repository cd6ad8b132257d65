"""What the validation probe returns: failures that say what, where and how to fix — never a score."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class ProbeFailure(BaseModel):
    stage: Literal["static", "dynamic"]
    code: str           # stable identifier of the failure class, e.g. "bounds", "forbidden_import"
    where: str          # file, file:line or field
    message: str        # what is wrong
    fix: str = ""       # how to fix it

    def render(self) -> str:
        text = f"[{self.code}] {self.where}: {self.message}"
        return text + (f"\n    fix: {self.fix}" if self.fix else "")


class ProbeReport(BaseModel):
    failures: list[ProbeFailure] = Field(default_factory=list)
    #: job.toml parsed as TOML and every Python file parsed: the submission was at least readable.
    parsable: bool = False
    stages_run: list[str] = Field(default_factory=list)
    seconds: float = 0.0
    #: Which isolation the dynamic stage used ("bwrap", "fallback: ...", or "" if not run).
    sandbox: str = ""

    @property
    def ok(self) -> bool:
        return not self.failures

    def render(self) -> str:
        if self.ok:
            return "validation passed (" + ", ".join(self.stages_run) + ")"
        lines = [f"validation failed with {len(self.failures)} problem(s):"]
        lines += [f"{i}. {f.render()}" for i, f in enumerate(self.failures, 1)]
        return "\n".join(lines)
