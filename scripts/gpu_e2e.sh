#!/usr/bin/env bash
# One prepared end-to-end check of the GPU worker on a machine with an NVIDIA GPU (issue 48, item 6): the
# worker on a real bundle with prime-rl v0.7.0 and vLLM 0.24.0, everything written under $OUT.
#
#   OUT=/tmp/gpu_e2e AIT_PRIME_RL_DIR=/opt/prime-rl bash scripts/gpu_e2e.sh [--steps N] [--timeout S]
#
# Steps, each recorded in $OUT (and not stopping the script when one fails):
#   machine.txt      nvidia-smi, the GPUs' memory, the driver, python, the CPU
#   selfcheck.json   python -m gpu.worker --selfcheck --backend gpu: what the worker would refuse, and why
#   bundle/          the reference arithmetic job on Qwen/Qwen3-0.6B, made short (--steps, default 3, at least 2;
#                    batch 16, group 4, max_tokens 48, warmup 1), bundled with its rl.toml as the env bundles it
#   result.json      python -m gpu.worker <bundle> --backend gpu: dry run, base eval (vLLM), training (prime-rl,
#                    shared mode on one GPU: vLLM with the fixed KV cache of gpu/gpu_share.py), post eval
#   job.log, logs/   the worker's log and prime-rl's own logs (orchestrator, trainer, inference, env servers)
#   summary.txt      status, error, scores, timings, and the memory lines vLLM printed (its KV cache)
#   liveness.txt     the env-server liveness cases (four broken environments, two jails) with this prime-rl
# What it needs: this checkout with its venv (bash scripts/setup.sh test), a prime-rl v0.7.0 install with
# vLLM and torchtitan (the GPU image, gpu/Dockerfile: AIT_PRIME_RL_DIR=/opt/prime-rl), Qwen3-0.6B in the
# Hugging Face cache or AIT_MODELS_DIR (the machine may have no network), and baselines pinned or
# measurable. Not run yet: no GPU was lent to a session when it was written (2026-12-05).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu_e2e}
STEPS=3
TIMEOUT=1500
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) STEPS=$2; shift 2 ;;
    --timeout) TIMEOUT=$2; shift 2 ;;
    *) echo "unknown argument $1 (--steps N, --timeout S)" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT"
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
say() { echo "[gpu_e2e $(date +%H:%M:%S)] $*" | tee -a "$OUT/progress.txt"; }

say "machine"
{ nvidia-smi; nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv; "$PY" -V; lscpu | head -20; } \
  > "$OUT/machine.txt" 2>&1

say "self-check"
"$PY" -m gpu.worker --selfcheck --backend gpu > "$OUT/selfcheck.json" 2>&1
say "self-check rc=$?"

say "bundle ($STEPS steps)"
"$PY" - "$OUT" "$STEPS" <<'EOF' > "$OUT/bundle.txt" 2>&1
import sys
from pathlib import Path

from ait_env.jobs.bundle import build_bundle
from ait_env.jobs.schema import parse_job
from task_families import get_family, reference_files

out, steps = Path(sys.argv[1]).resolve(), int(sys.argv[2])
ws = out / "ws"
ws.mkdir(parents=True, exist_ok=True)
files = reference_files("arithmetic", "Qwen/Qwen3-0.6B")
toml = files["job.toml"]
for old, new in (("max_steps = 60", f"max_steps = {steps}"), ("batch_size = 128", "batch_size = 16"),
                 ("group_size = 8", "group_size = 4"), ("max_tokens = 256", "max_tokens = 48"),
                 ("warmup_steps = 5", "warmup_steps = 1")):
    toml = toml.replace(old, new)
files["job.toml"] = toml
for name, text in files.items():
    (ws / name).write_text(text)
job, issues = parse_job(toml)
assert job is not None, issues
bundle = build_bundle(ws, job, get_family("arithmetic"), out / "jobs", job_id="gpu-e2e")
if not (bundle.root / "rl.toml").is_file():
    sys.exit(f"the bundle has no rl.toml: {bundle.manifest.extra.get('rl_toml')}")
print(bundle.root)
EOF
BUNDLE=$(tail -1 "$OUT/bundle.txt")
if [ ! -f "$BUNDLE/rl.toml" ]; then say "no bundle: $(cat "$OUT/bundle.txt" | tail -3)"; exit 1; fi
say "bundle: $BUNDLE"

say "the worker on the bundle (timeout ${TIMEOUT} s)"
t0=$(date +%s)
timeout "$((TIMEOUT + 60))" "$PY" -m gpu.worker "$BUNDLE" --backend gpu --baselines-dir "$OUT/baselines" \
  --timeout "$TIMEOUT" > "$OUT/worker.txt" 2>&1
rc=$?
say "worker rc=$rc after $(( $(date +%s) - t0 )) s"
cp "$BUNDLE/result.json" "$OUT/result.json" 2>/dev/null
cp "$BUNDLE/job.log" "$OUT/job.log" 2>/dev/null
mkdir -p "$OUT/logs" && cp -r "$BUNDLE/outputs/logs/." "$OUT/logs/" 2>/dev/null

"$PY" - "$OUT" <<'EOF' > "$OUT/summary.txt" 2>&1
import json
import re
import sys
from pathlib import Path

out = Path(sys.argv[1])
try:
    r = json.loads((out / "result.json").read_text())
except (OSError, ValueError) as exc:
    print(f"no result.json ({exc}); see worker.txt")
    r = {}
for key in ("status", "error", "pre_score", "post_score", "baselines", "timings"):
    print(f"{key}: {r.get(key)}")
for path in sorted((out / "logs").rglob("*.log")):
    for line in path.read_text(errors="replace").splitlines():
        if re.search(r"KV cache|cache blocks|memory|OutOfMemory|Env \S+ ready", line):
            print(f"{path.name}: {line.strip()[:300]}")
EOF
# the env-server liveness cases against the real launcher, orchestrator and env server (issue 48), here with the
# image's flash-attn (a CPU run stubs ring_flash_attn's import: docs/gpu.md)
if nvidia-smi -L > /dev/null 2>&1; then
  say "env-server liveness with the real prime-rl (tests/gpu/test_gpu_real_primerl.py -k broken)"
  AIT_PRIME_RL_DIR=${AIT_PRIME_RL_DIR:-/opt/prime-rl} timeout 1200 "$PY" -m pytest -m slow -p no:cacheprovider \
    -n 0 -q -rs tests/gpu/test_gpu_real_primerl.py -k broken > "$OUT/liveness.txt" 2>&1
  say "liveness rc=$?: $(tail -1 "$OUT/liveness.txt")"
else
  say "env-server liveness: not run (no GPU here; on a CPU: docs/gpu.md, Checked with the real prime-rl on CPU)" | tee "$OUT/liveness.txt"
fi
say "done: $OUT/summary.txt"
cat "$OUT/summary.txt"
