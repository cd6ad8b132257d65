"""Validation-probe wall time on the families' reference jobs: the static stage alone and the full
probe (static + sandboxed dynamic stage) with a warm sandbox; the sandbox's cold start is printed too.

    python benchmarks/bench_probe.py [--reps 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from task_families import reference_files
from ait_env.probe import ValidationProbe
from ait_env.probe.dynamic import DynamicProbe, DynamicSettings, probe_sandbox
from task_families import FAMILY_NAMES, get_family
from task_families.base import TOOLS_MODULE_NAME, Bounds

MODELS = ["Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    from ait_env.hidden.secrets import default_hidden_seeds

    seeds = default_hidden_seeds("published")   # the docs' figures; AIT_HIDDEN_SEEDS=private for your own sets
    print(f"hidden-eval seeds: {seeds.label}", file=sys.stderr)
    bounds = Bounds(base_models=MODELS, max_steps=200, max_batch_size=512, max_group_size=32, max_seq_len=8192,
                    max_tokens=2048)
    settings = DynamicSettings()
    sandbox = probe_sandbox(settings.sandbox)
    t0 = time.perf_counter()
    sandbox.new_workdir()
    cold = time.perf_counter() - t0
    static_probe = ValidationProbe()
    full_probe = ValidationProbe(dynamic=DynamicProbe(settings, sandbox=sandbox))
    print(f"sandbox: {sandbox.description}")
    print(f"sandbox cold start (imports verifiers + datasets once): {cold:.2f} s")
    print(f"{'family':12s} {'static ms':>10s} {'full s':>8s}")
    all_static, all_full = [], []
    for name in FAMILY_NAMES:
        fam = get_family(name)
        try:
            files = reference_files(name, MODELS[1])
        except FileNotFoundError:
            continue
        ws = Path(tempfile.mkdtemp())
        for fname, text in files.items():
            (ws / fname).write_text(text)
        (ws / f"{TOOLS_MODULE_NAME}.py").write_text(fam.tools_source())
        task = fam.make_task(0, bounds)
        st, ft = [], []
        for _ in range(args.reps):
            t = time.perf_counter()
            rep, _ = static_probe.run(ws, task, fam)
            st.append(time.perf_counter() - t)
            t = time.perf_counter()
            rep, _ = full_probe.run(ws, task, fam)
            ft.append(time.perf_counter() - t)
            assert rep.ok, rep.render()
        all_static += st
        all_full += ft
        print(f"{name:12s} {statistics.median(st) * 1e3:10.2f} {statistics.median(ft):8.2f}")
    full = statistics.median(all_full)
    print(f"{'median':12s} {statistics.median(all_static) * 1e3:10.2f} {full:8.2f}   (goal <= 3 s: "
          f"{'met' if full <= 3 else 'NOT met'})")
    sandbox.destroy()


if __name__ == "__main__":
    main()
