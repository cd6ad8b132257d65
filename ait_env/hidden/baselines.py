"""Baseline store: hidden-eval scores of the untrained base models, keyed by (backend, family, model,
weights).

The store is a versioned JSON file per backend. Pinned stores ship with the package
(``ait_env/data/baselines/<backend>.json``); a user store (``<runs_dir>/baselines/<backend>.json``),
written by ``scripts/seed_baselines.py`` and by jobs that had to measure a base score themselves,
takes precedence. :meth:`BaselineStore.for_job` is the one policy every reader uses. A missing entry is a
:class:`BaselinesNotSeeded` error that names the command to seed it. An entry records the hash of the
weights it was measured on where the backend knows it (``model_hash``) and of the hidden set, so one
store can pin several builds of a model (the local models' weights differ between CPU vendors), and a
runner can tell a pin of other weights, or of another hidden set, from one it can use
(:meth:`BaselineEntry.stale`).
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from dataclasses import replace
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, Field

from ait_env.jobs.context import JobContext

STORE_VERSION = 1


class BaselinesNotSeeded(LookupError):
    pass


class BaselineEntry(BaseModel):
    backend: str
    family: str
    model: str
    score: float = Field(ge=0.0, le=1.0)
    ci95: float = 0.0           # half-width of the 95% confidence interval
    n: int = 0                  # hidden-eval instances scored
    hidden_set_hash: str = ""   # which hidden set it was measured on
    model_hash: str = ""        # which weights it was measured on (local models: ait_model.json's weights_hash)
    seeded_at: float = Field(default_factory=time.time)
    command: str = ""

    def measured_on_other_weights(self, weights_hash: str) -> bool:
        """True when this entry records the weights it was measured on and they are not ``weights_hash``
        (unknown on either side: False, the pin is taken as it is)."""
        return bool(self.model_hash and weights_hash and self.model_hash != weights_hash)

    def measured_on_other_set(self, set_hash: str) -> bool:
        """True when this entry is a measurement (``n > 0``) on another hidden set than ``set_hash`` (a
        redrawn family, or another secret seed); unknown on either side: False."""
        return bool(self.n and self.hidden_set_hash and set_hash and self.hidden_set_hash != set_hash)

    def stale(self, weights_hash: str, set_hash: str) -> str:
        """Why this pin does not hold for these weights and this hidden set ("" when it does)."""
        if self.measured_on_other_weights(weights_hash):
            return f"measured on other weights ({self.model_hash}, built here: {weights_hash})"
        if self.measured_on_other_set(set_hash):
            return f"measured on another hidden set ({self.hidden_set_hash}, now: {set_hash})"
        return ""


class BaselineFile(BaseModel):
    version: int = STORE_VERSION
    entries: list[BaselineEntry] = Field(default_factory=list)


def _key(e: BaselineEntry) -> tuple[str, str, str]:
    return (e.family, e.model, e.model_hash)


def _slot(e: BaselineEntry) -> tuple[str, str, str, str]:
    """Where a store keeps an entry: one per weights and per hidden set it was measured on, so the published
    and a private hidden set's measurements of one build live side by side (:mod:`ait_env.hidden.secrets`)."""
    return (e.family, e.model, e.model_hash, e.hidden_set_hash if e.n else "")


def seed_command(backend: str, family: str | None = None) -> str:
    cmd = f"python scripts/seed_baselines.py backend={backend}"
    return cmd + (f" families={family}" if family else "")


class BaselineStore:
    def __init__(self, backend: str, user_dir: Path | None = None) -> None:
        self.backend = backend
        self.user_path = (Path(user_dir) / f"{backend}.json") if user_dir else None

    def _pinned(self) -> BaselineFile:
        res = resources.files("ait_env").joinpath("data", "baselines", f"{self.backend}.json")
        if not res.is_file():
            return BaselineFile()
        return BaselineFile.model_validate_json(res.read_text(encoding="utf-8"))

    def _user(self) -> BaselineFile:
        if self.user_path is None or not self.user_path.exists():
            return BaselineFile()
        return BaselineFile.model_validate_json(self.user_path.read_text(encoding="utf-8"))

    def entries(self) -> dict[tuple[str, str, str], BaselineEntry]:
        """Every entry by (family, model, weights hash) (of several hidden sets' entries, one); the user
        store's replace the pinned ones."""
        return {**{_key(e): e for e in self._pinned().entries}, **{_key(e): e for e in self._user().entries}}

    def get(self, family: str, model: str, weights_hash: str = "", set_hash: str = "") -> BaselineEntry:
        """The entry for ``model`` on ``family``: the one measured on ``weights_hash`` and on the hidden set
        ``set_hash`` when there is one, else the user store's, else the newest (:meth:`lookup` says whether it
        holds)."""
        user = [e for e in self._user().entries if e.family == family and e.model == model]
        taken = {_slot(e) for e in user}
        found = [(True, e) for e in user] + [(False, e) for e in self._pinned().entries
                                             if e.family == family and e.model == model and _slot(e) not in taken]
        if not found:
            raise BaselinesNotSeeded(
                f"no baseline for model {model!r} on family {family!r} with backend {self.backend!r}. "
                f"Seed it with: {seed_command(self.backend, family)}")
        return max(found, key=lambda ue: (bool(weights_hash) and ue[1].model_hash == weights_hash,
                                          not ue[1].measured_on_other_set(set_hash), ue[0], ue[1].seeded_at))[1]

    def lookup(self, family: str, model: str, weights_hash: str = "", set_hash: str | None = None
               ) -> tuple[BaselineEntry, str]:
        """(:meth:`get`'s entry, why it does not hold for these weights and the hidden set ``set_hash``
        (default: the current one), or ""). A measurement holds only for the set it was measured on (a
        formula, ``n == 0``, for any)."""
        if set_hash is None:
            from ait_env.hidden.secrets import hidden_set_hash

            set_hash = hidden_set_hash(family)
        entry = self.get(family, model, weights_hash, set_hash)
        return entry, entry.stale(weights_hash, set_hash)

    def for_job(self, job: JobContext) -> tuple[dict[str, float], dict[str, str]]:
        """THE baseline policy: which untrained score each model of a job (``job.models``) is compared with.

        Returns ``(holding, missing)``: the score of every model whose entry holds (:meth:`lookup`: the
        user store's entry, else the pinned one, measured on the weights built here and on the current
        hidden set), and for every other model why not (not seeded, measured on other weights, on
        another hidden set). The runner measures the missing ones and records them
        (:meth:`record_measured`), so the agent's ``get_baseline_scores``, the job's pre-scores and the
        reward's ``best_pre`` always read the same numbers."""
        holding: dict[str, float] = {}
        missing: dict[str, str] = {}
        for name in job.models:
            try:
                entry, reason = self.lookup(job.family, name, job.weights_hash(name), job.hidden_set_hash)
            except BaselinesNotSeeded:
                missing[name] = "not seeded"
                continue
            if reason:
                missing[name] = reason
            else:
                holding[name] = entry.score
        return holding, missing

    def best_pre(self, job: JobContext, measured: dict[str, float]) -> float:
        """The best untrained score of the models a job is compared with (``job.models``): the scores the job
        measured or read (its result's ``baselines``), completed by :meth:`for_job` for the others (the
        reward's ``best_pre``). Raises :class:`BaselinesNotSeeded` when none is known."""
        scores = {m: s for m, s in measured.items() if m in job.models}
        rest = tuple(m for m in job.models if m not in scores)
        if rest:
            holding, _ = self.for_job(replace(job, models=rest))
            scores.update(holding)
        if not scores:
            raise BaselinesNotSeeded(f"no baselines for family {job.family!r} on backend {self.backend!r}")
        return max(scores.values())

    def record_measured(self, entry: BaselineEntry) -> Path | None:
        """Keep a base score a job measured on the full hidden set (with the weights' hash) in the user
        store, so the next job and ``get_baseline_scores`` read it instead of measuring again. Returns
        the store's path (``None`` without a user store)."""
        return self.put([entry]) if self.user_path is not None else None

    def put(self, entries: list[BaselineEntry], path: Path | None = None) -> Path:
        """Write entries (replacing same keys) atomically into ``path`` (default: the user store); a lock
        file serialises concurrent writers (two jobs pinning at once lose neither entry)."""
        target = Path(path) if path else self.user_path
        if target is None:
            raise ValueError("no user baseline directory configured; pass path=")
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target.with_name(f".{target.name}.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            current = BaselineFile.model_validate_json(target.read_text()) if target.exists() else BaselineFile()
            merged = {_slot(e): e for e in current.entries}
            merged.update({_slot(e): e for e in entries})
            data = BaselineFile(entries=sorted(merged.values(), key=_slot))
            tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data.model_dump(), indent=1) + "\n")
            os.replace(tmp, target)
        return target
