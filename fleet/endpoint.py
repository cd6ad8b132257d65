"""The Runpod Serverless endpoint of the GPU worker: deploy it, look at it, remove it.

    python -m fleet.endpoint up     [--config FILE] [--image IMAGE]
    python -m fleet.endpoint status [--config FILE] [--id ENDPOINT_ID] [--json]
    python -m fleet.endpoint down   [--config FILE] [--id ENDPOINT_ID] [--wait-s 600]

Contract: the settings are the simulator's fleet defaults (``fleet/fleet_defaults.yaml``: workers, idle
timeout, GPUs, the GPU priority list), ``fleet/endpoint.yaml`` (the rest of a
:class:`fleet.runpod_management.EndpointSpec`) and ``--config FILE``, merged in that order; the endpoint is found by its ``name`` (or ``--id``). ``up`` creates it
or updates it in place. ``status`` prints what exists: id, GPU pools, GPUs per worker, workers min/max,
idle and execution timeouts, the workers Runpod has allocated, the queue (``/health``) and what it costs
per hour idle (``workers_min`` x GPUs per worker x the active $/s of the first pool x 3600,
:mod:`fleet.prices`) and at most (``workers_max`` busy flex workers). ``down`` scales to 0 workers, waits
until none is allocated, deletes, and checks the listing no longer has it: it never leaves a running
endpoint behind, and says so when it cannot (exit status 1).

Needs ``RUNPOD_API_KEY``. Base URLs: ``$AIT_RUNPOD_REST_BASE_URL`` (REST v2, default
``https://api.runpod.io/v2``) and ``$RUNPOD_ENDPOINT_BASE_URL`` (job API, default
``https://api.runpod.ai/v2``), or ``--rest-url`` / ``--job-url`` (tests point them at the fake).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from fleet import prices
from fleet.settings import FLEET_DEFAULTS, fleet_settings  # noqa: F401  (python -m fleet.endpoint's defaults)
from fleet.runpod_api import API_KEY_ENV, RunpodAPIError, ServerlessClient
from fleet.runpod_management import EndpointSpec, ManagementClient, delete_endpoint, upsert_endpoint

DEFAULT_CONFIG = Path(__file__).with_name("endpoint.yaml")
def load_config(config: Path | None = None) -> dict[str, Any]:
    """The fleet defaults (:func:`fleet_settings`), then ``fleet/endpoint.yaml``, then ``config``, merged, as
    a dict (not validated)."""
    from omegaconf import OmegaConf

    conf = OmegaConf.merge(OmegaConf.create(fleet_settings()), OmegaConf.load(DEFAULT_CONFIG))
    if config is not None:
        conf = OmegaConf.merge(conf, OmegaConf.load(config))
    return OmegaConf.to_container(conf, resolve=False)  # type: ignore[return-value]


def load_spec(config: Path | None = None, image: str | None = None) -> EndpointSpec:
    """The validated :class:`EndpointSpec` of :func:`load_config` (``image`` overrides the config's);
    ``ValueError`` saying what to set when there is no image."""
    data = load_config(config)
    if image:
        data["image"] = image
    if not data.get("image"):
        raise ValueError("no image: set `image:` in the config or pass --image <registry>/ait-worker:<rev> "
                         "(gpu/README.md, 'Build and push the image')")
    return EndpointSpec.model_validate(data)


def _api_key() -> str:
    key = os.environ.get(API_KEY_ENV, "")
    if not key:
        raise SystemExit(f"error: {API_KEY_ENV} is not set: create a key in the Runpod console (Settings > "
                         f"API Keys, read/write) and export {API_KEY_ENV}=...")
    return key


def describe(mgmt: ManagementClient, ep: dict[str, Any], job_url: str | None) -> dict[str, Any]:
    """What ``status`` prints, as a dict."""
    gpu, workers = ep.get("gpu") or {}, ep.get("workers") or {}
    pools, count = list(gpu.get("pools") or []), int(gpu.get("count") or 1)
    idle_usd, idle_note = prices.cost_per_hour(pools, count, int(workers.get("min", 0)), active=True)
    max_usd, max_note = prices.cost_per_hour(pools, count, int(workers.get("max", 0)), active=False)
    out: dict[str, Any] = {
        "id": ep["id"], "name": ep.get("name"), "image": ep.get("image"), "gpu_pools": pools,
        "gpus_per_worker": count, "workers_min": workers.get("min"), "workers_max": workers.get("max"),
        "idle_timeout_s": workers.get("idleTimeout"), "execution_timeout_s": (ep.get("timeout") or 0) / 1000,
        "flashboot": ep.get("flashboot"),
        "idle_usd_per_hour": round(idle_usd, 4), "idle_cost_basis": idle_note,
        "max_usd_per_hour": round(max_usd, 4), "max_cost_basis": max_note,
    }
    try:
        out["workers"] = mgmt.workers(ep["id"]).get("summary")
    except RunpodAPIError as e:
        out["workers"] = f"unavailable: {e}"
    try:
        with ServerlessClient(ep["id"], _api_key(), base_url=job_url) as jobs:
            out["queue"] = jobs.health()
    except RunpodAPIError as e:
        out["queue"] = f"unavailable: {e}"
    return out


def _print(info: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(info, indent=1))
        return
    for k, v in info.items():
        print(f"{k:>20}: {v}")


def _find(mgmt: ManagementClient, spec_name: str, endpoint_id: str | None) -> dict[str, Any] | None:
    if endpoint_id:
        return mgmt.get(endpoint_id)
    return mgmt.find(spec_name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fleet.endpoint", description=__doc__.split("\n")[0])
    ap.add_argument("command", choices=["up", "status", "down"])
    ap.add_argument("--config", type=Path, help="a YAML merged over fleet/endpoint.yaml")
    ap.add_argument("--image", help="the worker image (overrides the config)")
    ap.add_argument("--id", dest="endpoint_id", help="act on this endpoint id instead of the config's name")
    ap.add_argument("--wait-s", type=float, default=600.0, help="down: how long to wait for workers to go")
    ap.add_argument("--poll-s", type=float, default=5.0, help="down: seconds between worker checks")
    ap.add_argument("--json", action="store_true", help="status: print JSON")
    ap.add_argument("--rest-url", help="REST v2 base URL (default $AIT_RUNPOD_REST_BASE_URL or Runpod's)")
    ap.add_argument("--job-url", help="job API base URL (default $RUNPOD_ENDPOINT_BASE_URL or Runpod's)")
    args = ap.parse_args(argv)
    try:
        spec = load_spec(args.config, args.image) if args.command == "up" else None
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    name = spec.name if spec else str(load_config(args.config)["name"])
    try:
        with ManagementClient(_api_key(), base_url=args.rest_url) as mgmt:
            return _run(args, mgmt, spec, name)
    except RunpodAPIError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace, mgmt: ManagementClient, spec: EndpointSpec | None, name: str) -> int:
    if args.command == "up":
        assert spec is not None
        ep, created = upsert_endpoint(mgmt, spec)
        print(f"{'created' if created else 'updated'} endpoint {ep['id']} ({spec.name})")
        _print(describe(mgmt, ep, args.job_url), args.json)
        return 0
    ep = _find(mgmt, name, args.endpoint_id)
    if ep is None:
        print(f"no endpoint named {name!r}" + ("" if args.command == "status" else ": nothing to remove"))
        return 0
    if args.command == "status":
        _print(describe(mgmt, ep, args.job_url), args.json)
        return 0
    delete_endpoint(mgmt, ep["id"], wait_s=args.wait_s, poll_s=args.poll_s)
    print(f"deleted endpoint {ep['id']} ({ep.get('name')}); it is no longer listed")
    return 0


if __name__ == "__main__":
    # the canonical module's main, not this __main__ copy's: one class object per exception and type
    from fleet.endpoint import main as _main

    raise SystemExit(_main())
