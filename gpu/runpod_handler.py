"""The Runpod Serverless handler (``python -m gpu.worker --serve``): ``job["input"]`` is a
:class:`HandlerInput`; :func:`handle_input` does the work synchronously through the process's
:class:`gpu.worker.Worker` (its self-check runs once); :func:`handler` runs it in a thread and turns a stop from
Runpod into the worker's cancel (the Runpod facts relied on: :mod:`gpu.worker`)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ait_env.jobs.settings import BackendSettings
from ait_env.hidden.baselines import BaselineEntry, BaselineFile, BaselineStore
from ait_env.jobs.wire import unpack_bundle

from gpu.worker import Progress, Worker


class HandlerInput(BaseModel):
    """``job["input"]`` of the Runpod handler."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["job", "baseline"] = "job"
    executor: str = "gpu"
    settings: BackendSettings
    bundle: str | None = None                  # pack_bundle() of the job (kind "job")
    family: str | None = None                  # kind "baseline"
    model: str | None = None
    #: the caller's baseline store entries for this backend: the runner reads them and measures only what
    #: they lack; what it measures comes back in the output's ``baselines``
    baselines: list[BaselineEntry] = Field(default_factory=list)
    require_revision: str | None = None
    timeout_s: float | None = None
    #: the orchestrator's tag of this attempt (its journal recorded it before sending: ``/run`` has no
    #: idempotency key); echoed in the output's ``tag``, so the orchestrator can tell its own attempt's result
    #: from another's under an id the provider gave twice
    tag: str | None = None


_WORKERS: dict[str | None, Worker] = {}


def _worker(require_revision: str | None) -> Worker:
    """The process's worker for ``require_revision`` (its self-check runs once)."""
    if require_revision not in _WORKERS:
        _WORKERS[require_revision] = Worker(require_revision=require_revision)
    return _WORKERS[require_revision]


def handle_input(payload: dict[str, Any], progress: Progress | None = None,
                 cancel: threading.Event | None = None, work_root: Path | None = None) -> dict[str, Any]:
    """The handler's work, synchronously: ``{"kind", "result", "tag"}`` (``tag``: the request's, echoed)
    plus, for a job, the ``baselines`` it measured. Raises ``ValueError`` for an input that does not validate (the SDK then marks the request
    FAILED: a caller's bug, not a job result)."""
    inp = HandlerInput.model_validate(payload)
    worker = _worker(inp.require_revision)
    root = Path(tempfile.mkdtemp(prefix="ait-job-", dir=work_root))
    root.chmod(0o711)   # the training uid passes through to the job's folder (gpu/isolation.py, user mode)
    try:
        if inp.kind == "baseline":
            if not (inp.family and inp.model):
                raise ValueError("a baseline request needs 'family' and 'model'")
            out = worker.run_baseline(inp.family, inp.model, inp.settings, inp.executor, progress=progress,
                                      cancel=cancel, timeout_s=inp.timeout_s)
            return {"kind": "baseline", "result": out.model_dump(mode="json"), "tag": inp.tag}
        if not inp.bundle:
            raise ValueError("a job request needs 'bundle' (ait_env.jobs.wire.pack_bundle of the bundle folder)")
        bundle_dir = unpack_bundle(inp.bundle, root / "jobs")
        store = BaselineStore(inp.settings.name, user_dir=root / "baselines")
        if inp.baselines:
            store.put(inp.baselines)
        result = worker.run_job(bundle_dir, inp.settings, inp.executor, baselines_dir=root / "baselines",
                                progress=progress, cancel=cancel, timeout_s=inp.timeout_s)
        given = {(e.family, e.model, e.model_hash, e.seeded_at) for e in inp.baselines}
        pinned = (BaselineFile.model_validate_json(store.user_path.read_text()).entries
                  if store.user_path is not None and store.user_path.exists() else [])
        return {"kind": "job", "result": result.model_dump(mode="json"), "tag": inp.tag,
                "baselines": [e.model_dump(mode="json") for e in pinned
                              if (e.family, e.model, e.model_hash, e.seeded_at) not in given]}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _sdk_progress(job: dict[str, Any]) -> Progress | None:
    """``runpod.serverless.progress_update`` for ``job``; None outside a deployed worker (the SDK's local
    test mode has no URL to post to)."""
    if not os.environ.get("RUNPOD_WEBHOOK_POST_OUTPUT"):
        return None
    import runpod

    return lambda msg: runpod.serverless.progress_update(job, msg)


async def handler(job: dict[str, Any]) -> dict[str, Any]:
    """The Runpod Serverless handler (queue-based endpoint): ``job["input"]`` is a :class:`HandlerInput`;
    the return value is :func:`handle_input`'s. The work runs in a thread so the SDK's event loop stays
    free; a stop from Runpod (``asyncio.CancelledError``, re-raised at once) sets the cancel flag, on which
    the worker kills the running job and everything below it within a second."""
    cancel = threading.Event()
    try:
        return await asyncio.to_thread(handle_input, job.get("input") or {}, _sdk_progress(job), cancel)
    except asyncio.CancelledError:
        cancel.set()
        raise


def serve() -> None:
    """Start the Runpod Serverless worker loop with :func:`handler` (the SDK reads its own flags, e.g.
    ``--test_input``, from ``sys.argv``). The self-check runs first and is printed to the worker's log."""
    import runpod

    chk = _worker(None).check(os.environ.get("AIT_EXECUTOR", "gpu"))
    print(f"ait worker self-check: {json.dumps(chk.summary())}", flush=True)
    if not chk.ok:
        print(chk.refusal(), flush=True)
    runpod.serverless.start({"handler": handler})
