"""What one hidden evaluation records and reports: each instance's record (its turns, tool calls, answer and
score: :class:`EvalRecord`, :class:`ToolCallRecord`) and the evaluation's result (:class:`EvalResult`: mean
score with its 95% interval, errors, whether it failed and why), and the intervals it uses (Wilson for binary
scores, else the normal approximation). Written by :mod:`ait_env.hidden.evaluation`, read by the runner and the
reward."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

Z95 = 1.959963984540054


class EvalInfraError(RuntimeError):
    """The eval could not be run (server down, too many errors): not a statement about the model."""


class ToolCallRecord(BaseModel):
    """One tool call the model made, and what the harness answered."""

    turn: int
    source: Literal["structured", "text"]
    name: str | None
    arguments: str                       # as the model wrote them (raw JSON text)
    result: str                          # the tool message content sent back
    error: str | None = None             # malformed call (bad JSON, unknown tool): not executed


class EvalRecord(BaseModel):
    """One hidden-eval instance."""

    index: int
    key: str
    question: str
    answer: str
    response: str = ""                   # final assistant content, raw
    final_text: str = ""                 # what the checker saw (think / tool_call blocks removed)
    score: float = 0.0
    turns: int = 0
    tool_calls: list[ToolCallRecord] = Field(default_factory=list)
    n_tool_errors: int = 0               # malformed calls + tool results starting with "error:"
    stop_reason: Literal["answer", "max_turns", "context_length", "error"] = "error"
    error: str | None = None             # infrastructure/harness error: score 0, counted separately
    seconds: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    messages: list[dict[str, Any]] | None = None   # full conversation when keep_messages=True


class EvalResult(BaseModel):
    """Hidden-eval score of one model on one family."""

    family: str
    model: str
    base_url: str
    hidden_set_hash: str
    n: int
    n_errors: int
    n_scored: int
    score: float                         # mean over all n (errors count as 0)
    score_excluding_errors: float | None
    ci_low: float
    ci_high: float
    ci95: float                          # half-width of the 95% interval
    ci_method: Literal["wilson", "normal"]
    failed: bool
    failure_reason: str | None = None
    max_error_rate: float
    wall_seconds: float
    seconds_per_instance: float
    concurrency: int
    limit: int | None = None
    settings: dict[str, Any] = Field(default_factory=dict)
    started_at: float
    records: list[EvalRecord] = Field(default_factory=list)

    @property
    def mean(self) -> float:
        return self.score

    def summary(self) -> dict[str, Any]:
        """Everything but the per-instance records."""
        return self.model_dump(exclude={"records"})

    def raise_if_failed(self) -> EvalResult:
        if self.failed:
            raise EvalInfraError(f"hidden eval of {self.model!r} on {self.family!r} failed: {self.failure_reason}")
        return self

    def write_jsonl(self, path: str | Path) -> Path:
        """Per-instance records as JSONL at ``path``; the summary as ``<path stem>.summary.json``."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", encoding="utf-8") as f:
            for rec in self.records:
                f.write(rec.model_dump_json() + "\n")
        path.with_suffix(".summary.json").write_text(json.dumps(self.summary(), indent=2) + "\n",
                                                     encoding="utf-8")
        return path

    def __str__(self) -> str:
        state = f"FAILED ({self.failure_reason})" if self.failed else "ok"
        return (f"{self.family}/{self.model}: {self.score:.3f} [{self.ci_low:.3f}, {self.ci_high:.3f}] "
                f"n={self.n} errors={self.n_errors} {self.wall_seconds:.1f}s {state}")


# ------------------------------------------------------------------------------------------ statistics
def wilson_interval(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    lo = 0.0 if successes <= 0 else max(0.0, center - half)
    hi = 1.0 if successes >= n else min(1.0, center + half)
    return lo, hi


def confidence_interval(scores: list[float], z: float = Z95) -> tuple[float, float, str]:
    """95% interval of the mean score: Wilson for binary scores, else the normal approximation."""
    n = len(scores)
    if n == 0:
        return 0.0, 1.0, "wilson"
    if all(s in (0.0, 1.0) for s in scores):
        lo, hi = wilson_interval(sum(scores), n, z)
        return lo, hi, "wilson"
    mean = sum(scores) / n
    if n == 1:
        return 0.0, 1.0, "normal"
    sd = math.sqrt(sum((s - mean) ** 2 for s in scores) / (n - 1))
    half = z * sd / math.sqrt(n)
    return max(0.0, mean - half), min(1.0, mean + half), "normal"
