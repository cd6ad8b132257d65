"""The local executor's sandbox job (``rollout_worker``): the agent's environment producing training
rollouts. It runs INSIDE the sandbox, loaded by :mod:`ait_env.sandbox.zygote` from a copy of this
file; standard library, httpx and the adapter only, never ``ait_env``.

It imports the job's package the way prime-rl does, loads the environment once, then serves the
trainer's steps: work items come from, and results go to, the local endpoint's step channel
(``GET /ait/work``, ``POST /ait/results``; :mod:`cpu.tiny_models.endpoint`) over its Unix socket, the
only network in the sandbox. Rollouts and rubric scores are verifiers' own
(:func:`ait_env.integrations.verifiers_v0.run_groups`). These routes are the local executor's: a
vLLM server has none of them, and the generic eval phase never uses them.
"""

from __future__ import annotations

import json
import time
from typing import Any


def run(req: dict[str, Any], adapter: Any, ctx: Any) -> dict[str, Any]:
    """Training rollouts: load the agent's environment once, then serve the trainer's steps. Work
    items and results travel over the model endpoint's Unix socket (the only network in here)."""
    import asyncio

    import httpx

    ctx.send({"stage": "import"})
    try:
        module = adapter.import_env_package(req["dir"], req["package"])
        ctx.send({"stage": "load_environment"})
        env = adapter.load_environment(module, req.get("args") or {})
    except BaseException as exc:  # noqa: BLE001
        err = {"status": "error", "stage": "load_environment", "kind": "exception",
               "error": f"{type(exc).__name__}: {exc}", "traceback": ctx.traceback()}
        try:
            import httpx as _httpx

            _httpx.Client(transport=_httpx.HTTPTransport(uds=req["uds"]), base_url="http://localhost").post(
                "/ait/results", json={"step": -1, "error": err["error"], "traceback": err["traceback"]})
        except Exception:  # noqa: BLE001
            pass
        return err
    uds = req["uds"]
    http = httpx.Client(transport=httpx.HTTPTransport(uds=uds), base_url="http://localhost", timeout=700.0)
    client = adapter.make_client(uds=uds)
    loop = asyncio.new_event_loop()
    ctx.send({"stage": "rollouts"})
    http.post("/ait/results", json={"step": -1, "rows": adapter.dataset_len(env), "max_turns": adapter.max_turns(env)})
    after, steps = -1, 0
    while True:
        work = http.get("/ait/work", params={"after": after, "timeout": 60}).json()
        if work.get("done"):
            break
        if work.get("wait"):
            continue
        step = int(work["step"])
        t0 = time.time()
        try:
            groups = adapter.rollout_inputs(env, work["indices"], int(work["group_size"]))
            results = loop.run_until_complete(adapter.run_groups(env, client, work["model"], groups,
                                                                 work["sampling_args"]))
            payload: dict[str, Any] = {"step": step, "groups": results, "seconds": time.time() - t0,
                                       # each group's row info: the trainer's audit replays stateful tool calls on it
                                       "infos": [g[0].get("info") if g else None for g in groups]}
        except BaseException as exc:  # noqa: BLE001 - reported to the trainer, which decides
            payload = {"step": step, "error": f"{type(exc).__name__}: {exc}", "traceback": ctx.traceback()}
        try:
            body = json.dumps(payload, allow_nan=False, default=str)
        except (TypeError, ValueError) as exc:  # whatever the agent's rubric returned, the trainer hears of it
            body = json.dumps({"step": step, "error": f"the rollout results could not be sent: {exc}"})
        http.post("/ait/results", content=body, headers={"content-type": "application/json"})
        after = step
        steps += 1
    return {"status": "ok", "steps": steps}
