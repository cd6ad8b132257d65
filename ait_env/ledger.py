"""Append-only cost ledger (``runs/costs.jsonl``) and budgets.

One JSON line per LLM call or GPU job: ``kind`` ("llm" | "gpu_job" | ...), ``tokens_in``,
``tokens_out``, ``seconds``, ``usd``, ``episode_id``, ``ts`` and free-form ``meta``.

Crash safety: each record is one ``os.write`` of a complete line on a file opened with
``O_APPEND``, under an exclusive ``flock`` and followed by ``fsync``; a torn last line (power loss
mid-write) is skipped when reading. Budgets: a global USD budget over the whole ledger and a
per-episode budget; :meth:`CostLedger.check_budget` raises :class:`BudgetExceeded` with a message
that says which budget and how to raise it.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field


class BudgetExceeded(RuntimeError):
    """Dispatch refused: the spend would exceed a budget."""


class LedgerSettings(BaseModel):
    path: str | None = None
    global_budget_usd: float | None = Field(None, ge=0)
    episode_budget_usd: float | None = Field(5.0, ge=0)


class CostRecord(BaseModel):
    kind: str
    episode_id: str | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    seconds: float = 0.0
    usd: float = 0.0
    ts: float = Field(default_factory=time.time)
    meta: dict[str, Any] = Field(default_factory=dict)


class CostLedger:
    def __init__(self, path: Path, global_budget_usd: float | None = None,
                 episode_budget_usd: float | None = None) -> None:
        self.path = Path(path)
        self.global_budget_usd = global_budget_usd
        self.episode_budget_usd = episode_budget_usd

    @classmethod
    def from_settings(cls, s: LedgerSettings, runs_dir: Path) -> "CostLedger":
        path = Path(s.path) if s.path else Path(runs_dir) / "costs.jsonl"
        return cls(path, s.global_budget_usd, s.episode_budget_usd)

    def append(self, record: CostRecord) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = (record.model_dump_json() + "\n").encode("utf-8")
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            # A previous crash may have left a torn line: start ours on a fresh line.
            size = os.fstat(fd).st_size
            if size:
                with open(self.path, "rb") as f:
                    f.seek(size - 1)
                    if f.read(1) != b"\n":
                        line = b"\n" + line
            os.write(fd, line)
            os.fsync(fd)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def records(self) -> list[CostRecord]:
        if not self.path.exists():
            return []
        out = []
        for raw in self.path.read_bytes().splitlines():
            try:
                out.append(CostRecord.model_validate_json(raw))
            except ValueError:
                continue  # torn or foreign line
        return out

    def spent(self, episode_id: str | None = None) -> float:
        return sum(r.usd for r in self.records() if episode_id is None or r.episode_id == episode_id)

    def check_budget(self, episode_id: str | None, estimated_usd: float) -> None:
        """Raise :class:`BudgetExceeded` when spending ``estimated_usd`` more would break a budget."""
        if self.global_budget_usd is not None:
            total = self.spent()
            if total + estimated_usd > self.global_budget_usd:
                raise BudgetExceeded(
                    f"global budget exceeded: spent ${total:.2f} + this job ${estimated_usd:.2f} > "
                    f"${self.global_budget_usd:.2f} (ledger {self.path}). Raise env.ledger.global_budget_usd "
                    "or start a new ledger.")
        if episode_id is not None and self.episode_budget_usd is not None:
            ep = self.spent(episode_id)
            if ep + estimated_usd > self.episode_budget_usd:
                raise BudgetExceeded(
                    f"episode budget exceeded: episode {episode_id} spent ${ep:.2f} + this job "
                    f"${estimated_usd:.2f} > ${self.episode_budget_usd:.2f}. Raise env.ledger.episode_budget_usd.")
