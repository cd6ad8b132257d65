"""What the worker hands its runner child (:class:`WorkerRequest`, written as JSON beside it) and what a
baseline request returns (:class:`BaselineOutcome`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ait_env.jobs.settings import BackendSettings
from ait_env.jobs.result import JobStatus
from ait_env.hidden.baselines import BaselineEntry


class WorkerRequest(BaseModel):
    """One request to the runner child (written as JSON next to it)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["job", "baseline"] = "job"
    executor: str
    settings: BackendSettings
    bundle_dir: Path | None = None
    family: str | None = None
    model: str | None = None
    baselines_dir: Path | None = None
    private_dir: Path | None = None


class BaselineOutcome(BaseModel):
    """What a baseline request returns: the measured entry, or why there is none."""

    status: JobStatus
    entry: BaselineEntry | None = None
    error: str = ""
    log_tail: str = ""
    worker: dict[str, Any] = Field(default_factory=dict)
