"""The durable job journal of a remote backend: what was sent where, what it cost, what came back.

One SQLite file per run directory (``<runs_dir>/runpod_journal.sqlite``), WAL mode, one connection per
call (safe across threads and processes). A row is one **key**: the job's content hash
(:func:`ait_env.jobs.cache.job_key`, the same key the job result cache uses) plus a nonce (``"0"``;
a deliberate re-run, ``rerun: true``, uses the bundle's job id), and records the remote job id of its
current attempt, its status, the result JSON (written the moment it is seen: Runpod keeps ``/run``
results 30 minutes only), the billed fields (queue/cold-start delay, execution time, GPU type, GPUs per
worker, USD) summed over every attempt, and timestamps. ``attempts`` holds one row per attempt.
``sessions`` holds one row per orchestrator that opened the run dir (:meth:`Journal.open_session`): when
it started and stopped, and what the endpoint's active (``workers_min``) workers cost per second meanwhile.

Contract:

- :meth:`Journal.claim` is atomic (``INSERT ... ON CONFLICT DO NOTHING``): of two orchestrators (threads
  or processes) claiming one key, exactly one gets ``new=True`` and submits; the other attaches to the
  row. A row whose outcome says nothing about the job (``infra_failed``, ``cancelled``, or a result whose
  own status is ``infra_failed``) is re-claimed by the next claim, again by exactly one caller, unless one
  of its attempts was sent without a remote id and may still run (before that attempt's ``hard_end``).
- :meth:`Journal.attach` records the remote id of the claimed attempt; :meth:`Journal.next_attempt`
  moves a row to a new attempt (a retry) for exactly one caller; :meth:`Journal.record_result` and
  :meth:`Journal.finish` write the final state once (later calls change nothing and return False).
- :meth:`Journal.take_charge` hands a row's cost to exactly one caller (the first to read it): a job is
  never paid for twice in the cost ledger. That cost is the job's own bill (``cost_usd``: delay +
  execution); the idle time Runpod bills after an attempt (``idle_usd``, an upper bound: see
  :mod:`ait_env.backends.runpod`) and the active workers of the sessions are **run** costs, never charged
  to a job: :meth:`Journal.run_costs` sums the three (``jobs + idle + active == total``), and
  :meth:`Journal.take_run_charges` hands the idle, active and controller USD not handed out before to exactly
  one caller (``run_charged``: a cost ledger gets them once). A SkyPilot pool's run dir may hold its pool's
  cost read from SkyPilot (:meth:`Journal.record_pool_measure`, ``python -m fleet.reconcile_pool --correct``):
  then the run's idle is that reading's (workers' time up in the run's window - its jobs) instead of the
  per-job estimate, and the jobs controller's share is a run cost too.
- **An attempt is recorded before it is sent** (:meth:`Journal.mark_sending`: a client-generated ``tag``,
  also put in the request's input, and ``sent_at``), so an attempt whose remote id never came back (a 5xx
  on a non-idempotent submit, a crash between the submit and :meth:`Journal.attach`) is still known: its
  owner (or whoever adopts it) charges it at its bound.
- **Every attempt that may have run is charged.** An attempt whose bill cannot be read is charged at its
  upper bound with ``Billing.estimated`` (column ``attempts.estimated``; :meth:`Journal.estimated_attempts`),
  and :meth:`Journal.correct_attempt` replaces the estimate when the bill is read later
  (``python -m fleet.reconcile --correct``).
- **Budgets reserve** (:meth:`Journal.reserve`): an attempt holds its bound (``reserved_usd`` + its idle
  bound ``reserved_idle_usd``) from when it is accepted until it ends, when its bill replaces it. A
  reservation is granted only while everything committed (the run costs plus every open reservation, or one
  episode's jobs plus its reservations) stays within the limit, inside one write transaction: of any
  number of orchestrators on the run dir, none can pass a budget but by the error of bounds already held.
- **Owners.** A row's ``owner`` is the orchestrator session that acts on it (:meth:`open_session`'s id).
  :meth:`Journal.owner_live` says whether that session is alive *and* polling (not closed, heartbeat newer
  than ``stale_s``, its process alive); a row whose owner is not is taken over by exactly one caller of
  :meth:`Journal.adopt`.
- Time: every timestamp (``created``, ``updated``, ``started``/``ended``, sessions, the ``now`` of
  :meth:`Journal.run_costs`) comes from the journal's clock, ``now`` (default ``time.time``; the fleet
  simulator, ``fleet/simulate/``, injects its simulated clock). An explicit ``now`` argument wins, 0.0
  included.
- Nothing secret is stored: keys, ids, statuses, the worker's (scrubbed) result and billing figures.

Subsumes, for backends that use it, the job result cache (:mod:`ait_env.jobs.cache`): the same key, and
a finished result is served to an identical job for free; but durable across a crash mid-job (the
remote job is re-attached by id) and shared by processes.
"""

from fleet.journal.journal import Journal
from fleet.journal.records import (ATTACHED, DUPLICATE_ID, FINAL, JOURNAL_NAME, MOVED_ON, Billing, JournalRow, PoolMeasure,
                                   RowStatus, RunCosts, Session)
from fleet.journal.store import owner_alive, this_owner

__all__ = ["ATTACHED", "DUPLICATE_ID", "FINAL", "JOURNAL_NAME", "MOVED_ON", "Billing", "Journal", "JournalRow",
           "PoolMeasure", "RowStatus", "RunCosts", "Session", "owner_alive", "this_owner"]
