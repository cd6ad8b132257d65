"""Every setting of a fleet backend in one tree: :class:`DispatchOptions` (the dispatch core's: polling,
limits, retries, budgets, owners) extending the worker's options (:class:`ait_env.jobs.settings.WorkerOptions`),
:class:`RunpodOptions` (``conf/backend/runpod.yaml`` ``options``: those, the endpoint, prices, run costs), and :data:`FLEET_DEFAULTS` (``fleet_defaults.yaml``:
the endpoint's workers, idle timeout and GPUs when they cannot be read from Runpod, shared with the
endpoint tool and the simulator).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ait_env.jobs.settings import WorkerOptions
from fleet import prices
from fleet.billing import GpuPrices

#: the fleet settings the simulator picked (``python -m fleet.simulate ... --write-defaults``, docs/fleet.md):
#: workers, idle timeout, GPUs, the GPU priority list
FLEET_DEFAULTS = Path(__file__).with_name("fleet_defaults.yaml")


def fleet_settings(path: Path = FLEET_DEFAULTS) -> dict[str, Any]:
    """The simulator's pick as :class:`EndpointSpec` fields: workers min/max, idle timeout, FlashBoot, GPUs
    per worker and the GPU priority list as Serverless pools (:func:`fleet.prices.pool_of`)."""
    from omegaconf import OmegaConf

    d: dict[str, Any] = OmegaConf.to_container(OmegaConf.load(path))  # type: ignore[assignment]
    pools = list(dict.fromkeys(prices.pool_of(g) for g in d["gpu_priority"]))
    return {"workers_min": d["workers_min"], "workers_max": d["workers_max"],
            "idle_timeout_s": d["idle_timeout_s"], "flashboot": d["flashboot"],
            "gpu_count": d["gpus_per_worker"], "gpu_type_ids": pools}


class DispatchOptions(WorkerOptions):
    """The dispatch core's options (:mod:`fleet.dispatch`), shared by every fleet backend: polling, limits,
    retries, budgets, owners (the worker's options it extends go to the worker)."""

    #: seconds between two sweeps of the poller over the jobs in flight
    poll_interval_s: float = Field(5.0, gt=0)
    #: a status that cannot be read is read again after poll_interval_s, doubling up to this
    status_backoff_max_s: float = Field(60.0, gt=0)
    #: jobs sent to the engine at once (more wait locally, in order). None: the engine's own limit (Runpod:
    #: the endpoint's ``workers_max``, read like the run costs' settings: a job sent beyond it waits in
    #: Runpod's queue, and that wait is in its ``delayTime``, which the bill counts although Runpod does not
    #: charge it, docs/fleet.md)
    max_in_flight: int | None = Field(None, ge=1)
    #: threads that record and send queued jobs (the poller never does)
    submit_threads: int = Field(4, ge=1)
    #: the worker's limit for one job (None: the job's wall-clock bound plus its eval allowance)
    job_timeout_s: float | None = Field(None, gt=0)
    #: the engine's execution limit per attempt (None: the worker's limit + WORKER_OVERHEAD_S)
    execution_timeout_s: float | None = Field(None, gt=0)
    #: queue wait and cold start allowed to an attempt on top of its execution timeout
    startup_allowance_s: float = Field(600.0, ge=0)
    #: an attempt without a result this long after it was sent is cancelled and retried (None:
    #: startup_allowance_s + the execution timeout)
    deadline_s: float | None = Field(None, gt=0)
    #: an attempt's hard end is the deadline plus this (Runpod: the request's ttl): the job's end even if a
    #: cancel cannot reach the engine, and the bound an attempt is charged at when its bill cannot be read
    ttl_margin_s: float = Field(300.0, ge=0)
    #: engine-side failures retried per job (new attempts) before it ends infra_failed
    retry_budget: int = Field(2, ge=0)
    #: true: a new key per bundle (an identical job trains again); false: identical jobs are served
    rerun: bool = False
    #: the pins a result must carry: the image revision ($AIT_IMAGE_REVISION, also sent to the worker's
    #: self-check) and versions (``result.worker["versions"]`` keys, e.g. ``train:prime-rl-commit``)
    require_revision: str | None = None
    expected_versions: dict[str, str] = Field(default_factory=dict)
    #: USD over this run's journal (every attempt, idle, active workers, the bounds of jobs in flight) / one
    #: episode's jobs; None = no limit
    run_budget_usd: float | None = Field(None, ge=0)
    episode_budget_usd: float | None = Field(None, ge=0)
    #: an orchestrator whose journal heartbeat is older than this (or whose session closed, or whose
    #: process is gone) no longer owns its rows: another one adopts them
    owner_stale_s: float = Field(120.0, gt=0)
    #: wait()'s default limit (None: (retry_budget + 1) attempts' bounds plus the status backoff)
    wait_timeout_s: float | None = Field(None, gt=0)
    #: close(): cancel the jobs still in flight (false: they keep running; a restart re-attaches them)
    cancel_on_close: bool = False


class RunpodOptions(DispatchOptions):
    """``options`` of the runpod backend (unknown keys are refused): the dispatch core's and Runpod's own."""

    #: the queue-based endpoint (else ``$RUNPOD_ENDPOINT_ID``); the API key is read from ``$RUNPOD_API_KEY``
    endpoint_id: str | None = None
    #: the API's base URL (None: the client's default, https://api.runpod.ai/v2); a fake's in tests. The
    #: REST API (the endpoint's settings) follows it unless rest_base_url says otherwise
    base_url: str | None = None
    #: the endpoint's first GPU type and GPUs per worker (bills attempts that report no GPUs)
    gpu_type: str = "NVIDIA RTX A5000"
    gpus_per_worker: int = Field(2, ge=1)
    prices: GpuPrices = Field(default_factory=GpuPrices)
    #: run costs: the endpoint's idle timeout and active workers, used when the endpoint's own settings
    #: cannot be read (None: fleet/fleet_defaults.yaml); the REST v2 base URL they are read from (None:
    #: $AIT_RUNPOD_REST_BASE_URL, else base_url when set, else https://api.runpod.io/v2)
    idle_timeout_s: float | None = Field(None, ge=0)
    workers_min: int | None = Field(None, ge=0)
    rest_base_url: str | None = None
    #: false: never read the endpoint's settings (options and the fleet defaults only)
    read_endpoint: bool = True
    #: a negotiated active-worker rate in $/GPU-s (None: the flex rate, Runpod's one published price since
    #: 2026-05-13; fleet/prices.py UNIFIED_SINCE)
    active_usd_per_gpu_s: float | None = Field(None, gt=0)


class PoolSpec(BaseModel):
    """A SkyPilot pool of identical workers (``python -m fleet.pool up``; ``conf/backend/skypilot.yaml``
    ``options.pool``): the pinned worker image, the accelerators (any of them), workers (fixed, or
    ``min_workers``..``max_workers`` autoscaled by queue length), idle reaping and disk.
    ``fleet.skypilot_engine.pool_yaml`` renders it as the pool YAML SkyPilot's own parser checks."""

    model_config = ConfigDict(extra="forbid")

    #: the pool's name (``sky jobs launch --pool <name>``)
    name: str = "ait-workers"
    #: the pinned worker image (gpu/Dockerfile, gpu/README.md "Build and push"), as SkyPilot's ``image_id``
    #: ``docker:<registry>/ait-worker:<rev>``; required by ``python -m fleet.pool up`` (or ``--image``)
    image: str = ""
    #: SkyPilot accelerator names, any of which a worker may have (resources ``any_of``: a pool refuses
    #: ``ordered``); each with its Runpod GPU type
    #: id for the price (fleet/prices.py)
    accelerators: list[str] = Field(default_factory=lambda: ["RTXA5000", "RTX4090", "L40S"])
    #: GPUs each worker has (every job the pool runs gets the whole worker: SkyPilot gives a pool job
    #: the worker's resources); None: the most any allowed model needs (ait_env.jobs.gpus)
    gpus_per_worker: int | None = Field(None, ge=1, le=8)
    #: the infra the workers are rented on (SkyPilot ``infra``: runpod, k8s/<ctx>, aws, ...)
    infra: str = "runpod"
    #: fixed workers (None: autoscale between min_workers and max_workers by queue length)
    workers: int | None = Field(None, ge=0)
    min_workers: int = Field(0, ge=0)
    max_workers: int = Field(16, ge=1)
    #: SkyPilot's pool autoscaler: +1 worker after this many seconds of a queue above the threshold
    #: (sky/serve/constants.py: default 300 s, decisions every 20 s), -1 after downscale_delay_s below it
    #: (default 1200 s): the pool's idle reaping
    upscale_delay_s: float = Field(20.0, ge=0)
    downscale_delay_s: float = Field(300.0, ge=0)
    queue_length_threshold: int = Field(1, ge=1)
    disk_gb: int = Field(100, ge=10)
    use_spot: bool = False


class SkypilotOptions(DispatchOptions):
    """``options`` of the skypilot backend (unknown keys are refused): the dispatch core's, the pool's
    and how jobs reach it (fleet/skypilot_engine.py)."""

    pool: PoolSpec = Field(default_factory=PoolSpec)
    #: per-job idle bound in seconds: pool pod time between two jobs charged to the run (not the agent),
    #: an estimate; None: the simulator's measured idle per job of the default pool (docs/fleet.md)
    idle_per_job_s: float | None = Field(None, ge=0)
    #: GPUs per job: None: the one rule (ait_env.jobs.gpus.gpus_for_job) on the job's model and seq_len
    gpus_per_job: int | None = Field(None, ge=1, le=8)
    #: the GPU type bills use when a result does not say which GPU ran it (fleet/prices.py pod prices)
    gpu_type: str = "NVIDIA RTX A5000"
    #: the largest request (bundle and settings, gzip + base64) sent inline in the job's envs
    max_request_bytes: int = Field(100_000, ge=1_000, le=120_000)
