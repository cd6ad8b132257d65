"""The dispatch core of a GPU fleet: jobs for the GPU worker sent to an engine (Runpod Serverless today;
an engine adapter is all a second one needs), durably, never paid twice, within budgets, never blocking.

:class:`Dispatcher` owns the journal's rows of one orchestrator (:mod:`fleet.journal`), a local queue,
**submitter threads** that record and send queued jobs while fewer than ``max_in_flight`` are out, and
**one poller thread** that reads the status of every job in flight, checks every deadline on every sweep
(also while status reads fail), cancels, and wakes each waiter when its job ends. The poller never sends
or sleeps on a send's back-off. What a guarantee means, with the test that shows it, is in docs/fleet.md
("Guarantees under faults"); the ``runpod`` backend's docstring says how it uses this core.

The engine (:class:`Engine`) is the only part that knows the service: it sends an attempt (with its
limits) and says whether a failed send surely queued nothing (:class:`SendFailed`), was refused as ours
(:class:`SendRefused`), or may have queued a job unseen (:class:`SendUncertain`); reads statuses in the
dispatch vocabulary (:data:`IN_FLIGHT` and the final ``COMPLETED``, ``FAILED``, ``TIMED_OUT``,
``CANCELLED``; :class:`AttemptGone` when the engine no longer knows the attempt); cancels; and bills an
attempt (:meth:`Engine.bill`) or bounds one whose bill cannot be read (:meth:`Engine.bound_rate`).
Everything else (keys, claims, attempts and their deadlines, retries, budgets, owners and adoption, run
costs) is here, the same for every engine.
"""

from fleet.dispatch.dispatcher import Dispatcher
from fleet.dispatch.engine import (IN_FLIGHT, WORKER_OVERHEAD_S, AttemptGone, AttemptStatus, Engine, SendFailed,
                                   SendRefused, SendUncertain)

__all__ = ["IN_FLIGHT", "WORKER_OVERHEAD_S", "AttemptGone", "AttemptStatus", "Dispatcher", "Engine", "SendFailed",
           "SendRefused", "SendUncertain"]
