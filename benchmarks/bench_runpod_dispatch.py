"""How many jobs one orchestrator (the runpod backend) submits and tracks per second, and whether any is
lost or sent twice: N distinct job bundles go through ``RunpodBackend`` to the fake Serverless endpoint
(``tests/fakes/runpod_client.py``) in instant mode (a job ends on its first poll), from several episode
threads at once; every result is waited for.

    python benchmarks/bench_runpod_dispatch.py                      # 10,000 jobs, 16 submitting threads
    python benchmarks/bench_runpod_dispatch.py --jobs 2000 --threads 4 --max-in-flight 500
    python benchmarks/bench_runpod_dispatch.py --http             # the real client over HTTP to
                                                                  # tests/gpu/fake_runpod.py (instant)

``--http`` puts the real client and the HTTP fake (same process, same cores) in the loop.

Prints: bundles built (not timed), jobs/s submitted (``submit`` calls over their wall time), jobs/s
tracked (jobs over the time from the first submit to the last result), lost (no final ``succeeded``
result, or a wrong one), duplicated (Runpod runs beyond one per job), and the journal's totals. Goal:
>= 200 jobs/s with 0 lost and 0 duplicated. What is measured is the orchestrator (keys, the journal,
packing, the poller, waking waiters), not Runpod's latency: the fake answers at once.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from task_families import reference_files  # noqa: E402
from ait_env.backends.base import JobHandle
from ait_env.jobs.settings import BackendSettings
from ait_env.jobs.result import JobResult  # noqa: E402
from ait_env.backends.runpod import RunpodBackend  # noqa: E402
from ait_env.config import load_group  # noqa: E402
from ait_env.jobs.bundle import JobBundle, build_bundle  # noqa: E402
from ait_env.jobs.schema import parse_job  # noqa: E402
from task_families import get_family  # noqa: E402
from tests.fakes.runpod_client import DELAY_MS, EXECUTION_MS, FakeServerlessClient, bundle_job_id  # noqa: E402


def make_bundles(root: Path, n: int) -> list[JobBundle]:
    files = reference_files("arithmetic", "Qwen/Qwen3-0.6B")
    ws = root / "ws"
    ws.mkdir(parents=True)
    (ws / "environment.py").write_text(files["environment.py"])
    family = get_family("arithmetic")
    out = []
    for i in range(n):
        text = files["job.toml"] + f"\n# variant {i}\n"
        (ws / "job.toml").write_text(text)
        job, issues = parse_job(text)
        assert job is not None, issues
        out.append(build_bundle(ws, job, family, root / "jobs", job_id=f"bench-{i:06d}"))
    return out


def cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--threads", type=int, default=16, help="episode threads submitting and waiting")
    ap.add_argument("--max-in-flight", type=int, default=10_000)
    ap.add_argument("--poll-interval", type=float, default=0.05)
    ap.add_argument("--http", action="store_true",
                    help="fleet.runpod_api.ServerlessClient over HTTP to tests/gpu/fake_runpod.py "
                         "(instant mode)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ait-bench-runpod-"))
    try:
        t0 = time.perf_counter()
        bundles = make_bundles(tmp / "b", args.jobs)
        print(f"built {len(bundles)} bundles in {time.perf_counter() - t0:.1f} s (not timed below)")
        base = load_group("backend", "runpod")
        settings = BackendSettings.model_validate({**base, "options": {
            **base["options"], "poll_interval_s": args.poll_interval, "max_in_flight": args.max_in_flight}})
        stack = contextlib.ExitStack()
        if args.http:
            from tests.gpu.fake_runpod import start_fake_runpod

            output = {"kind": "job", "baselines": [], "result": {
                "job_id": "w", "backend": "runpod", "status": "succeeded", "post_score": 0.5,
                "worker": {"image_revision": "unknown", "versions": {},
                           "gpus": ["NVIDIA RTX A5000 (24564 MiB)"] * 2}}}
            http = stack.enter_context(start_fake_runpod(instant=True, instant_output=output))
            os.environ["RUNPOD_API_KEY"] = http.api_key
            settings.options.update(endpoint_id=http.endpoint_id, base_url=http.job_base_url)
            client = None
        else:
            fake = FakeServerlessClient()
            client = fake
        results: dict[str, JobResult] = {}
        submit_s: list[float] = []
        lock = threading.Lock()
        with stack, RunpodBackend(settings, tmp / "runs", show_progress=False, client=client) as backend:
            chunks = [bundles[i::args.threads] for i in range(args.threads)]

            def episode_thread(mine: list[JobBundle]) -> None:
                s0 = time.perf_counter()
                handles: list[JobHandle] = [backend.submit(b) for b in mine]
                s1 = time.perf_counter()
                got = {h.job_id: backend.wait(h, timeout=600) for h in handles}
                with lock:
                    submit_s.append(s1 - s0)
                    results.update(got)

            threads = [threading.Thread(target=episode_thread, args=(c,)) for c in chunks]
            start = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            tracked_s = time.perf_counter() - start
            counts, spent = backend.journal.counts(), backend.spent_usd()
            if args.http:   # instant jobs bill nothing there; each input is one run
                sent = [bundle_job_id(j.input) for j in http.jobs.values()]
                per_job = 0.0
            else:
                sent = [j["bundle"] for j in fake.store.all()]
                per_job = (DELAY_MS + EXECUTION_MS) / 1000 * 0.00019 * 2
        lost = sum(1 for b in bundles if b.job_id not in results or results[b.job_id].status != "succeeded"
                   or results[b.job_id].cost_usd != round(per_job, 6))
        duplicated = len(sent) - len(set(sent))
        print(f"machine: {cpu()}, {os.cpu_count()} cores; python {platform.python_version()}")
        print(f"jobs: {args.jobs}, threads: {args.threads}, max_in_flight: {args.max_in_flight}, "
              f"poll interval: {args.poll_interval} s")
        print(f"submitted: {args.jobs / max(submit_s):.0f} jobs/s (slowest thread's submit calls: "
              f"{max(submit_s):.1f} s)")
        print(f"tracked:   {args.jobs / tracked_s:.0f} jobs/s (first submit to last result: "
              f"{tracked_s:.1f} s)")
        print(f"lost: {lost}  duplicated: {duplicated}  runs on the fake: {len(sent)}"
              + (" (HTTP, the real client)" if args.http else " (in-process fake client)"))
        print(f"journal: {counts}, billed ${spent:.2f} (expected ${args.jobs * per_job:.2f})")
        return 0 if lost == 0 and duplicated == 0 else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
