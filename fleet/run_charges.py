"""The run's own costs into an env cost ledger: the idle, active-worker and (SkyPilot) jobs-controller USD a
run dir's journal holds beyond its jobs, written once as records with no episode (``kind="gpu_idle"``,
``"gpu_active"``, ``"gpu_controller"``: run costs, never an agent's). Used by the backends at the end of every
job (:meth:`ait_env.backends.runpod.RunpodBackend.charge_run_costs`) and by ``python -m fleet.reconcile_pool
--correct`` after it reads the pool's cost from SkyPilot. Exactly once across processes: the journal hands each
dollar to one caller (:meth:`fleet.journal.Journal.take_run_charges`); no record is ever negative."""

from __future__ import annotations

from typing import Any

from fleet.journal import Journal, RunCosts


def charge_run_parts(journal: Journal, ledger: Any, costs: RunCosts, meta: dict[str, Any]) -> dict[str, float]:
    """Append to ``ledger`` (:class:`ait_env.observe.ledger.CostLedger`) the part of ``costs``' run parts not
    charged before; returns what was written per part (0 where nothing)."""
    from ait_env.observe.ledger import CostRecord

    taken = journal.take_run_charges(costs)
    for part, usd in taken.items():
        if usd > 0:
            ledger.append(CostRecord(kind=f"gpu_{part}", usd=usd, meta={
                **meta, "journal": str(journal.path), "run_total_usd": costs.total,
                "measured": costs.measured}))
    return taken
