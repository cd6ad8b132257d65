"""``python -m fleet.pool up|status|cost|down``: the SkyPilot pool the ``skypilot`` backend launches jobs onto
(this engine's ``fleet.endpoint``).

- ``up``: ``sky jobs pool apply`` of the pool YAML rendered from the config (:func:`fleet.skypilot_engine.pool_yaml`:
  the pinned worker image, the accelerators (any of them: SkyPilot refuses ordered resources in a pool), workers fixed or min..max autoscaled,
  the autoscaler's delays, disk); applying again updates the pool in place (rolling).
- ``status``: workers (and which are busy), the pool's queue of managed jobs, and the cost per hour of the
  workers up, at :func:`fleet.prices.pod_price_per_s` (dated pod prices, fleet/prices.py).
- ``cost``: what the pool has cost, from SkyPilot's own cost report (``sky.cost_report``, its catalog prices x
  time up): each worker cluster ``<pool>-<n>`` (busy or idle; downed ones included) and the jobs controller's
  VM, and what keeps billing now (workers up, ``min_workers``); ``python -m fleet.reconcile_pool`` compares the
  workers' figure with a run's journal.
- ``down``: ``sky jobs pool down``, then reads the pool's status until no worker is listed (at most
  ``--wait`` seconds); exits 1 and says so when a worker is still listed, so a pod is never left running
  unseen.

The pool's spec is ``backend.options.pool`` of ``conf/backend/skypilot.yaml`` (:class:`fleet.settings.PoolSpec`,
one config tree with the Runpod settings), overridden by ``--config FILE`` (YAML of PoolSpec fields).
Needs the ``skypilot`` extra and SkyPilot's API server; ``--print`` writes the pool YAML and needs neither.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from fleet import prices
from fleet.settings import PoolSpec
from fleet.skypilot_engine import SkySDK, pool_yaml


def load_spec(config: Path | None = None) -> PoolSpec:
    """The pool's spec: conf/backend/skypilot.yaml ``options.pool``, then ``config`` over it."""
    from ait_env.conf import load_group

    data: dict[str, Any] = dict((load_group("backend", "skypilot").get("options") or {}).get("pool") or {})
    if config is not None:
        data.update(yaml.safe_load(Path(config).read_text()) or {})
    return PoolSpec.model_validate(data)


def gpus_per_worker(spec: PoolSpec) -> int:
    """The spec's GPUs per worker, else the most the backend's allowed models need (ait_env.jobs.gpus)."""
    if spec.gpus_per_worker is not None:
        return spec.gpus_per_worker
    from ait_env.conf import load_group
    from ait_env.jobs.gpus import gpus_for_job

    conf = load_group("backend", "skypilot")
    seq = int(conf["bounds"]["seq_len"])
    return max(gpus_for_job(m["name"], seq).gpus for m in conf["models"])


def workers_of(status: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The workers a ``pool_status`` answer lists (``replica_info``)."""
    return [w for rec in status for w in rec.get("replica_info") or []]


def cost_per_hour(spec: PoolSpec, workers: int, gpus: int) -> tuple[float, str]:
    """$/h of ``workers`` workers of ``gpus`` GPUs at the first accelerator's pod price (the pool may place
    workers on a later, dearer one: the note says which)."""
    acc = spec.accelerators[0]
    rate = prices.pod_price_per_s(prices.skypilot_gpu_type(acc)) * 3600
    dearest = max(prices.pod_price_per_s(prices.skypilot_gpu_type(a)) for a in spec.accelerators) * 3600
    return workers * gpus * rate, (f"{acc} at ${rate:.2f}/GPU-h (fleet/prices.py, {prices.PRICE_SHEET.date}); "
                                   f"up to ${workers * gpus * dearest:.2f}/h on the dearest accelerator")


def lifecycle_note(spec: PoolSpec) -> str:
    """What keeps billing once the backend is closed, and how to stop it (said by the skypilot backend's
    ``close`` and by ``cost``)."""
    floor = (f"{spec.workers} fixed workers bill until `python -m fleet.pool down`" if spec.workers is not None
             else f"idle workers are reaped one per {spec.downscale_delay_s:g} s down to min_workers="
                  f"{spec.min_workers}" + (" (those bill until `python -m fleet.pool down`)" if spec.min_workers
                                           else ""))
    return (f"pool {spec.name} stays up after this run: {floor}; SkyPilot's jobs controller VM autostops after 10 "
            f"idle minutes (its default). Stop everything: python -m fleet.pool down; what it cost: python -m "
            f"fleet.pool cost")


def print_cost(sdk: SkySDK, spec: PoolSpec, gpus: int, days: int | None) -> int:
    """``cost``: the pool's workers and the jobs controller in SkyPilot's cost report, and what bills now."""
    from fleet.reconcile_pool import cluster_costs

    try:
        workers, controllers = cluster_costs(sdk.cost_report(days), spec.name)
    except Exception as e:  # noqa: BLE001  the API server unreachable, a refused login: say it
        print(f"error: SkyPilot's cost report failed ({type(e).__name__}: {e}); check `sky api info`", file=sys.stderr)
        return 2
    window = f"the last {days or 30} days"
    print(f"pool {spec.name}: SkyPilot's cost report ({window}; its catalog prices x time up, an estimate, not the "
          "cloud's invoice)")
    for name, usd in sorted(workers.items()):
        print(f"  worker     {name:<34} ${usd:.4f}")
    for name, usd in sorted(controllers.items()):
        print(f"  controller {name:<34} ${usd:.4f}")
    total = sum(workers.values()) + sum(controllers.values())
    print(f"  total: ${total:.4f} (workers ${sum(workers.values()):.4f}, jobs controller "
          f"${sum(controllers.values()):.4f})")
    if not workers:
        print(f"  note: no worker cluster {spec.name}-<n> in {window}: check the pool's name and --days")
    try:
        up = len(workers_of(sdk.pool_status(spec.name)))
    except Exception:  # noqa: BLE001  the report is printed; the live part is best effort
        up = -1
    if up > 0:
        usd_h, note = cost_per_hour(spec, up, gpus)
        print(f"  billing now: {up} workers, ${usd_h:.2f}/h ({note})")
    print(f"  {lifecycle_note(spec)}")
    return 0


def main(argv: list[str] | None = None, sdk: SkySDK | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fleet.pool", description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=["up", "status", "cost", "down"])
    ap.add_argument("--days", type=int, default=None, help="cost: how far back SkyPilot's report looks (its default 30)")
    ap.add_argument("--config", type=Path, help="YAML of PoolSpec fields over conf/backend/skypilot.yaml's pool")
    ap.add_argument("--print", action="store_true", help="print the pool YAML and exit (no SkyPilot needed)")
    ap.add_argument("--wait", type=float, default=600.0, help="down: seconds to wait until no worker is listed")
    ap.add_argument("--image", help="the pinned worker image, docker:<registry>/ait-worker:<rev> (over the config's)")
    args = ap.parse_args(argv)
    spec = load_spec(args.config)
    if args.image:
        spec = spec.model_copy(update={"image": args.image})
    gpus = gpus_per_worker(spec)
    config = pool_yaml(spec, gpus)
    if args.print:
        print(yaml.safe_dump(config, sort_keys=False))
        return 0
    if args.action == "up" and not spec.image:
        print("error: no worker image: pass --image docker:<registry>/ait-worker:<rev> or set pool.image in "
              "conf/backend/skypilot.yaml (gpu/README.md, 'Build and push the image')", file=sys.stderr)
        return 2
    try:
        sdk = sdk or SkySDK()
    except RuntimeError:
        from ait_env.extras import EXIT_MISSING_EXTRA, missing_extra_line

        print(missing_extra_line("python -m fleet.pool", "sky", "skypilot"), file=sys.stderr)
        return EXIT_MISSING_EXTRA
    if args.action == "up":
        sdk.pool_apply(config, spec.name)
        print(f"pool {spec.name}: applied ({gpus} x {'/'.join(spec.accelerators)} per worker, "
              + (f"{spec.workers} workers" if spec.workers is not None else
                 f"{spec.min_workers}..{spec.max_workers} workers, +1 after {spec.upscale_delay_s:g} s of queue, "
                 f"-1 after {spec.downscale_delay_s:g} s idle") + ")")
        return 0
    if args.action == "status":
        status = sdk.pool_status(spec.name)
        if not status:
            print(f"pool {spec.name}: not found (python -m fleet.pool up)")
            return 1
        workers = workers_of(status)
        busy = sum(1 for w in workers if w.get("used_by"))
        queue = [r for r in sdk.queue() if r.get("pool") == spec.name and r.get("status") in
                 ("PENDING", "STARTING", "RUNNING", "RECOVERING")]
        usd_h, note = cost_per_hour(spec, len(workers), gpus)
        print(f"pool {spec.name}: {len(workers)} workers ({busy} busy), queue: "
              f"{sum(r['status'] == 'PENDING' for r in queue)} pending, "
              f"{sum(r['status'] != 'PENDING' for r in queue)} running; ${usd_h:.2f}/h now ({note})")
        return 0
    if args.action == "cost":
        return print_cost(sdk, spec, gpus, args.days)
    sdk.pool_down(spec.name)
    deadline = time.time() + args.wait
    while True:
        left = workers_of(sdk.pool_status(spec.name))
        if not left:
            print(f"pool {spec.name}: down, no worker listed")
            return 0
        if time.time() >= deadline:
            print(f"pool {spec.name}: {len(left)} worker(s) still listed after {args.wait:.0f} s; check "
                  f"`sky jobs pool status {spec.name}` and `sky status` and terminate them", file=sys.stderr)
            return 1
        time.sleep(5.0)


if __name__ == "__main__":
    raise SystemExit(main())
