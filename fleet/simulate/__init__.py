"""Discrete-event simulator of the GPU fleet: the seed's pod pool against a Runpod Serverless endpoint.

Contract: everything runs on a simulated clock (:class:`SimClock`, no sleeping, no network) and is
deterministic per seed. A fleet is reached only through :class:`FleetAPI`, the project's Runpod client
interface (:class:`fleet.billing.ServerlessClientLike`: ``run(input) -> id``,
``status(id) -> fleet.runpod_api.RunpodJob`` with ``delay_time_ms``/``execution_time_ms``/``worker_id``
measured on the simulated clock, ``cancel``; plus ``status_many``), so :class:`SimulatedServerless` can be
handed to ``RunpodBackend(client=...)`` as it is. A job that fails in training ends COMPLETED with the
worker's verdict ``job_failed`` (as ``gpu/worker.py`` reports it); Runpod-side failures are not modelled.

Two drivers: :func:`run_outer_loop` (the sweep's fast path: the fleet's own accounting, Runpod's billing
rule, each worker billed from start to stop) and :func:`run_through_journal` / :func:`simulate_journal`
(the Serverless path through the project's own bookkeeping: a real :class:`fleet.journal.Journal`
on the simulated clock, claim/attach/update_status/record_result, each attempt billed by
:func:`fleet.billing.attempt_billing`, the active workers as a journal session; its $/job is
``run_costs()`` (jobs + idle + active) / jobs, and :class:`JournalResult` itemises how it differs from
the simulator's own figure). The pod pool has no journal path: the project has no pod client.

Workload (every figure and its source in ``docs/fleet.md``): ``steps`` outer steps of
``jobs_per_step`` jobs; a step's batch is submitted at once and the next step starts ``gap_s`` after
the last job of the batch ends (the trainer waits for its batch, then updates and collects the next
batch). Job execution seconds: lognormal with the given median and p90, except a fraction
``fail_frac`` that fail early (uniform in ``[fail_min_s, fail_max_s]``). Every job uses
``gpus_per_job`` GPUs of one worker or pod.

Fleets:

- :class:`SimulatedPodPool`: up to ``max_pods`` pods; a pod is created when a job waits and no pod is
  idle or being created for it, is ready after ``provision_s + bootstrap_s``, runs one job at a time,
  and is terminated after ``reap_s`` idle. Billed per second from creation to termination at the pod
  $/h.
- :class:`SimulatedServerless`: a queue endpoint with ``workers_min`` active workers (always warm,
  billed all run long at the active price) and flex workers up to ``workers_max`` in all; a flex
  worker starts when a job waits and no worker is idle or starting for it, pays a cold start
  (FlashBoot restore with probability ``flashboot_hit`` when FlashBoot is on), and stops after
  ``idle_timeout_s`` idle. Billed from worker start to stop, each session rounded up to a second.

Metrics (:class:`FleetResult`): realised USD, ideal USD (execution seconds x GPUs x the price, no cold
start, no idle), $/job, realised / ideal, p50/p95 step wall time, worker utilisation (execution
GPU-seconds / billed GPU-seconds), cold starts.

``python -m fleet.simulate`` sweeps the Serverless settings (fast path), prints a markdown table and the pick
(the cheapest configuration whose p95 step time is within ``--latency-factor`` of the best), runs the pick
through the journal (at the backend's default ``max_in_flight`` and at ``workers_max``) beside the pod
pool, and with ``--write-defaults`` writes ``fleet/fleet_defaults.yaml``.
"""

from fleet.simulate.clock import SimClock
from fleet.simulate.driver import FleetResult, run_outer_loop, simulate
from fleet.simulate.fleets import (FleetFactory, PodPoolConfig, ServerlessConfig, SimulatedPodPool, SimulatedServerless,
                                   SimulatedSkyPilotPool, SkyPoolConfig, pod_factory, serverless_factory,
                                   skypilot_factory)
from fleet.simulate.journal_path import JournalResult, run_through_journal, simulate_journal
from fleet.simulate.queue_fleet import FleetAPI
from fleet.simulate.sweep import Row, gpu_priority, journal_table, markdown, pick, skypilot_table, sweep, write_defaults
from fleet.simulate.workload import Job, Workload, draw_jobs

__all__ = ["FleetAPI", "FleetFactory", "FleetResult", "Job", "JournalResult", "PodPoolConfig", "Row",
           "ServerlessConfig", "SimClock", "SimulatedPodPool", "SimulatedServerless", "SimulatedSkyPilotPool",
           "SkyPoolConfig", "Workload", "draw_jobs", "gpu_priority", "journal_table", "markdown", "pick",
           "pod_factory", "run_outer_loop", "run_through_journal", "serverless_factory", "simulate",
           "simulate_journal", "skypilot_factory", "skypilot_table", "sweep", "write_defaults"]
