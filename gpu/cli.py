"""``python -m gpu.worker``: the command line over the worker (a bundle, ``--baseline``, ``--selfcheck``), the
runner child (``--child``), the Runpod handler (``--serve``) and a SkyPilot managed job's request
(``--request-env``, :func:`run_request_env`). The contract: :mod:`gpu.worker`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


from ait_env.jobs.settings import BackendSettings, worker_settings

import gpu.worker as worker_module
from gpu.child import child_main
from gpu.runpod_handler import handle_input, serve
from gpu.worker import Worker


RESULT_BEGIN, RESULT_END = "AIT-RESULT-BEGIN", "AIT-RESULT-END"


def run_request_env(name: str) -> int:
    """A managed job's ``run`` (fleet/skypilot_engine.py): the :class:`HandlerInput` from ``$<name>`` (JSON,
    gzip, base64) through :func:`handle_input`, its output printed to the job's log between the result
    markers (gzip + base64, lines of 4,000 characters, the last line carrying the blob's sha256). Exit 0 once
    the output is printed (a job's own failure is in it), 2 for an input that does not decode or validate."""
    import base64
    import gzip
    import hashlib

    try:
        payload = json.loads(gzip.decompress(base64.b64decode(os.environ[name])))
        out = handle_input(payload)
    except (KeyError, ValueError, OSError) as exc:
        print(f"ait worker: the request in ${name} is unusable: {type(exc).__name__}: {exc}", flush=True)
        return 2
    blob = base64.b64encode(gzip.compress(json.dumps(out, separators=(",", ":")).encode(), 6, mtime=0)).decode()
    lines = [RESULT_BEGIN, *(blob[i:i + 4000] for i in range(0, len(blob), 4000)),
             f"{RESULT_END} {hashlib.sha256(blob.encode()).hexdigest()}"]
    print("\n".join(lines), flush=True)
    return 0


def load_settings(path: Path | None, executor: str) -> BackendSettings:
    """``--settings`` (JSON or YAML of :class:`BackendSettings`), else the defaults for ``executor``:
    ``conf/backend/local.yaml`` for ``local``, the worker part of ``conf/backend/gpu-local.yaml`` for
    ``gpu``."""
    from ait_env.conf import load_group

    if path is not None:
        text = Path(path).read_text()
        if Path(path).suffix in (".yaml", ".yml"):
            from omegaconf import OmegaConf

            data = OmegaConf.to_container(OmegaConf.create(text), resolve=True)
            return BackendSettings.model_validate(data)
        return BackendSettings.model_validate_json(text)
    if executor == "local":
        return BackendSettings.model_validate(load_group("backend", "local"))
    return worker_settings(BackendSettings.model_validate(load_group("backend", "gpu-local")))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child_main(Path(argv[1]))
    if argv[:1] == ["--request-env"]:
        return run_request_env(argv[1] if len(argv) > 1 else "AIT_REQUEST")
    if "--serve" in argv:
        sys.argv = [sys.argv[0], *[a for a in argv if a != "--serve"]]  # the SDK parses its own flags
        serve()
        return 0
    ap = argparse.ArgumentParser(prog="python -m gpu.worker", description=(worker_module.__doc__ or "").split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle", type=Path, nargs="?", help="the job bundle folder (result.json goes there)")
    ap.add_argument("--baseline", nargs=2, metavar=("FAMILY", "MODEL"), help="measure an untrained model")
    ap.add_argument("--backend", default="gpu",
                    help="the trainer executor: gpu (prime-rl) or local (the tiny CPU models)")
    ap.add_argument("--settings", type=Path, help="BackendSettings as JSON or YAML (default: load_settings)")
    ap.add_argument("--baselines-dir", type=Path, help="the baseline store jobs read and pin into")
    ap.add_argument("--out", type=Path, help="--baseline: write the outcome here as JSON")
    ap.add_argument("--timeout", type=float, help="seconds before the request is killed (infra_failed)")
    ap.add_argument("--require-revision", help="refuse unless the image revision is this one")
    ap.add_argument("--selfcheck", action="store_true", help="print the self-check and exit")
    args = ap.parse_args(argv)
    worker = Worker(require_revision=args.require_revision)
    if args.selfcheck:
        chk = worker.check(args.backend)
        print(chk.model_dump_json(indent=1))
        return 0 if chk.ok else 1
    settings = load_settings(args.settings, args.backend)
    if args.baseline:
        out = worker.run_baseline(*args.baseline, settings, args.backend, timeout_s=args.timeout)
        if args.out:
            args.out.write_text(out.model_dump_json(indent=1))
        print(json.dumps({k: v for k, v in out.model_dump(mode="json").items() if k != "log_tail"}))
        return 0 if out.status == "succeeded" else 1
    if args.bundle is None:
        ap.error("give a bundle folder, --baseline FAMILY MODEL, --serve or --selfcheck")
    res = worker.run_job(args.bundle, settings, args.backend, baselines_dir=args.baselines_dir,
                         timeout_s=args.timeout)
    print(json.dumps({k: v for k, v in res.model_dump(mode="json").items()
                      if k not in ("curves", "log_tail")}))
    return 0 if res.status == "succeeded" else 1
