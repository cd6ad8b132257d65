"""The job runner's peak memory with and without a rollout worker that floods the trainer's step channel.

    python benchmarks/endpoint_memory.py [--posts 4] [--mb 8] [--model ait-tiny-s] [--runs honest,attack]

Each run is the arithmetic reference job of the local backend (shortened: 2 steps of 8 rollouts, a 20-question
post eval), bundled and run by the one job runner, ``python -m ait_env.runner``, exactly as the local backend
starts it. In the ``attack`` run the job's environment, where it trains (in the sandboxed rollout worker),
first posts ``--posts`` results of ``--mb`` MB each to ``POST /ait/results`` for steps the trainer never
asked (``--body objects``: JSON lists of empty objects, the body that inflates most when parsed; ``string``:
one long string), then trains as usual. The
runner's peak resident memory is its ``VmHWM`` (``/proc/<pid>/status``), read until it exits. Prints one
line per run: the job's status, the peak RSS in MB and the wall time.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ait_env.config import load_group
from ait_env.jobs.bundle import build_bundle
from ait_env.jobs.result import JobResult
from ait_env.jobs.schema import parse_job
from task_families import get_family, reference_files

SMALL = {"max_steps": "2", "batch_size": "8", "group_size": "4", "warmup_steps": "0", "num_examples": "64"}
#: the attack, in the environment module: it runs where the job trains (the step channel's socket is there)
FLOOD = """
import verifiers.utils.client_utils as _vu


def _flood():
    if not _vu.os.path.exists("endpoint.sock"):
        return  # not the rollout worker
    http = _vu.httpx.Client(transport=_vu.httpx.HTTPTransport(uds="endpoint.sock"), base_url="http://x",
                            timeout=600)
    for i in range({posts}):
        head = b'{{"step": %d, "groups": ' % (10 ** 6 + i)
        if {objects}:  # [{{}}, {{}}, ...]: the body that inflates most when parsed
            body = head + b"[" + b"{{}}," * (({nbytes} - len(head) - 8) // 3) + b"{{}}]}}"
        else:          # one long string: a readable body
            body = head + b'"' + b"x" * ({nbytes} - len(head) - 8) + b'"}}'
        http.post("/ait/results", content=body, headers={{"content-type": "application/json"}})


_real_load_environment = load_environment


def load_environment(**kwargs):
    _flood()
    return _real_load_environment(**kwargs)
"""


def _files(model: str, attack: bool, posts: int, mb: float, objects: bool) -> dict[str, str]:
    files = reference_files("arithmetic", model, backend="local")
    job = files["job.toml"]
    for key, value in SMALL.items():
        job = re.sub(rf"(?m)^{key} = .*$", f"{key} = {value}", job)
    files["job.toml"] = job
    if attack:
        files["environment.py"] += FLOOD.format(posts=posts, nbytes=int(mb * 2**20), objects=objects)
    return files


def _peak_rss_mb(pid: int) -> float | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    m = re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)
    return int(m.group(1)) / 1024 if m else None


def run_one(label: str, files: dict[str, str], work: Path) -> dict[str, object]:
    """Bundle ``files``, run the job runner on it, and return its status and peak RSS."""
    job, issues = parse_job(files["job.toml"])
    if job is None:
        raise SystemExit(f"{label}: job.toml invalid: {issues}")
    ws = work / f"ws-{label}"
    ws.mkdir()
    for name, text in files.items():
        (ws / name).write_text(text)
    bundle = build_bundle(ws, job, get_family("arithmetic"), work / "jobs")
    settings = load_group("backend", "local")
    settings["options"].update({"eval_every": 0, "eval_limit": 20, "step_timeout_s": 600})
    settings_path = work / f"{label}.backend.json"
    settings_path.write_text(json.dumps(settings))
    t0 = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "ait_env.runner", str(bundle.root), "--backend-settings",
                             str(settings_path), "--no-progress"], stdout=subprocess.DEVNULL)
    peak = 0.0
    while proc.poll() is None:
        peak = max(peak, _peak_rss_mb(proc.pid) or 0.0)
        time.sleep(0.2)
    path = bundle.root / "result.json"
    result = JobResult.model_validate_json(path.read_text()) if path.exists() else None
    return {"run": label, "status": result.status if result else f"no result (exit {proc.returncode})",
            "peak_rss_mb": round(peak), "wall_s": round(time.time() - t0, 1),
            "error": (result.error or "")[:200] if result else ""}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--posts", type=int, default=4)
    ap.add_argument("--mb", type=float, default=7.9, help="MB per post (the endpoint's body limit is 8 MiB)")
    ap.add_argument("--model", default="ait-tiny-s")
    ap.add_argument("--runs", default="honest,attack")
    ap.add_argument("--body", choices=["objects", "string"], default="objects",
                    help="what the attack posts: a list of empty objects, or one long string")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ait-bench-mem-") as tmp:
        for label in args.runs.split(","):
            files = _files(args.model, label == "attack", args.posts, args.mb, args.body == "objects")
            row = run_one(label, files, Path(tmp))
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
