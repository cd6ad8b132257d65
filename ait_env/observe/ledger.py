"""Append-only cost ledger (``runs/costs.jsonl``) and budgets.

One JSON line per LLM call or GPU job: ``kind`` ("llm" | "gpu_job" | ...), ``tokens_in``,
``tokens_out``, ``seconds``, ``usd``, ``episode_id``, ``ts`` and free-form ``meta``.

Crash safety: each record is one ``os.write`` of a complete line on a file opened with
``O_APPEND``, under an exclusive ``flock`` and followed by ``fsync``; a torn last line (power loss
mid-write) is skipped when reading. Budgets: a global USD budget over the whole ledger and a
per-episode budget; :meth:`CostLedger.check_budget` raises :class:`BudgetExceeded` with a message
that says which budget and how to raise it.

**Reservations** (the one budget mechanism; the runpod backend's journal applies the same rule to its run
budget, :meth:`fleet.journal.Journal.reserve`): :meth:`CostLedger.reserve` holds a job's bound (what
it can cost at most, :meth:`ait_env.backends.base.Backend.estimate_cost_usd`) against both budgets from
when the job is accepted, inside one ``flock``: of any number of episodes (threads or processes) on one
ledger, none is accepted past a budget by counting only what was spent. The job's charge record carries
the reservation's id (``meta["reservation"]``) and closes it (:meth:`CostLedger.settle` when there is no
charge); a reservation of a process that died lapses after its ``ttl_s``. A reservation record is
``kind="reserve"`` with ``usd`` 0 (the held amount is ``meta["hold_usd"]``): no reader adds it to spending.
"""

from __future__ import annotations

import fcntl
import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
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

    @contextmanager
    def _locked(self) -> Iterator[int]:
        """The ledger file, opened for appending under an exclusive ``flock`` (one writer at a time)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield fd
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def _write(self, fd: int, record: CostRecord) -> None:
        line = (record.model_dump_json() + "\n").encode("utf-8")
        # A previous crash may have left a torn line: start ours on a fresh line.
        size = os.fstat(fd).st_size
        if size:
            with open(self.path, "rb") as f:
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    line = b"\n" + line
        os.write(fd, line)
        os.fsync(fd)

    def append(self, record: CostRecord) -> None:
        with self._locked() as fd:
            self._write(fd, record)

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

    def reserved(self, episode_id: str | None = None, records: list[CostRecord] | None = None) -> float:
        """USD held by open reservations (not settled, not lapsed), in all or for one episode."""
        records = self.records() if records is None else records
        closed = {r.meta.get("reservation") for r in records if r.kind != "reserve"}
        now = time.time()
        return sum(float(r.meta.get("hold_usd", 0.0)) for r in records
                   if r.kind == "reserve" and r.meta.get("reservation") not in closed
                   and float(r.meta.get("expires", now + 1)) > now
                   and (episode_id is None or r.episode_id == episode_id))

    def _refusal(self, records: list[CostRecord], episode_id: str | None, usd: float) -> str:
        if self.global_budget_usd is not None:
            total = sum(r.usd for r in records)
            held = self.reserved(None, records)
            if total + held + usd > self.global_budget_usd + 1e-9:
                return (f"global budget exceeded: spent ${total:.2f} + held for jobs in flight ${held:.2f} + this "
                        f"job ${usd:.2f} > ${self.global_budget_usd:.2f} (ledger {self.path}). Raise "
                        "env.ledger.global_budget_usd or start a new ledger.")
        if episode_id is not None and self.episode_budget_usd is not None:
            ep = sum(r.usd for r in records if r.episode_id == episode_id)
            held = self.reserved(episode_id, records)
            if ep + held + usd > self.episode_budget_usd + 1e-9:
                return (f"episode budget exceeded: episode {episode_id} spent ${ep:.2f} + held ${held:.2f} + this "
                        f"job ${usd:.2f} > ${self.episode_budget_usd:.2f}. Raise env.ledger.episode_budget_usd.")
        return ""

    def check_budget(self, episode_id: str | None, estimated_usd: float) -> None:
        """Raise :class:`BudgetExceeded` when spending ``estimated_usd`` more would break a budget (what open
        reservations hold counts as spent)."""
        why = self._refusal(self.records(), episode_id, estimated_usd)
        if why:
            raise BudgetExceeded(why)

    def reserve(self, episode_id: str | None, usd: float, *, what: str = "", ttl_s: float = 86400.0) -> str:
        """Hold ``usd`` (a job's bound) against the budgets until the job's charge (a record whose
        ``meta["reservation"]`` is the returned id) or :meth:`settle` closes it, or ``ttl_s`` passes (a
        process that died). Raises :class:`BudgetExceeded` when spent + held + ``usd`` would pass a budget.
        The check and the hold are one step under the ledger's lock."""
        rid = uuid.uuid4().hex
        self.check_budget(episode_id, usd)   # a refusal writes nothing, not even an empty ledger file
        with self._locked() as fd:           # the decisive check, with the hold, under the lock
            why = self._refusal(self.records(), episode_id, usd)
            if why:
                raise BudgetExceeded(why)
            self._write(fd, CostRecord(kind="reserve", episode_id=episode_id, usd=0.0, meta={
                "reservation": rid, "hold_usd": round(usd, 6), "expires": time.time() + ttl_s, "what": what}))
        return rid

    def recover_charge(self, record: CostRecord) -> bool:
        """Write ``record`` (a ``gpu_job`` charge whose ``meta["job_id"]`` names the job) unless the ledger
        already has a record of that job for its episode; it closes the job's open reservation (the one held
        for ``meta["job_id"]``) when there is one. One step under the ledger's lock, so two processes
        recovering the same charge write it once. True when written: a charge a killed episode took from a
        backend's journal and never wrote here (fleet/journal/costs.py ``torn_charges``)."""
        job_id = record.meta.get("job_id")
        with self._locked() as fd:
            records = self.records()
            if any(r.kind != "reserve" and r.episode_id == record.episode_id and r.meta.get("job_id") == job_id
                   for r in records):
                return False
            closed = {r.meta.get("reservation") for r in records if r.kind != "reserve"}
            hold = next((r.meta.get("reservation") for r in records if r.kind == "reserve"
                         and r.episode_id == record.episode_id and r.meta.get("what") == job_id
                         and r.meta.get("reservation") not in closed), None)
            meta = {**record.meta, **({"reservation": hold} if hold else {})}
            self._write(fd, record.model_copy(update={"meta": meta}))
            return True

    def settle(self, reservation: str, record: CostRecord | None = None) -> None:
        """Close ``reservation``: append ``record`` (the real charge) carrying its id, or a release record."""
        rec = record or CostRecord(kind="release")
        self.append(rec.model_copy(update={"meta": {**rec.meta, "reservation": reservation}}))
