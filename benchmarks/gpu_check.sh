#!/usr/bin/env bash
# The local backend on a GPU machine: the device tests, then the default reference job (arithmetic)
# through the full verifiers path on the GPU and on the same machine's CPU, so the two compare as a
# ratio measured in one run. Prints the nvidia-smi line, the tests' summary and both benchmark tables.
#
#   bash benchmarks/gpu_check.sh [OUT_DIR]
#
# Needs: a CUDA build of torch in `python3`, the local extra's packages (or wheels of the missing ones
# in .whl/, installed first with --no-deps: the sandboxed rollout worker starts with a cleared
# environment, so they go into the interpreter's own site-packages, not a PYTHONPATH), and the built
# models (AIT_CACHE_DIR, or .devcarry/models when present). Results go to OUT_DIR (default runs/gpu_check).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-runs/gpu_check}"
mkdir -p "$out"
py="${PYTHON:-python3}"
if compgen -G ".whl/*.whl" >/dev/null; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl || exit 1
fi
[ -d .devcarry/models ] && export AIT_CACHE_DIR="$PWD/.devcarry/models"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
{ nvidia-smi -L; lscpu | grep -E "^Model name|^CPU\(s\)"; "$py" -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.cuda.is_available())"; } 2>&1 | tee "$out/machine.txt"
"$py" -m pytest -q -p no:cacheprovider tests/cpu/test_device.py tests/cpu/test_runner_micro.py 2>&1 | tee "$out/tests.txt" | tail -4
for dev in cuda cpu; do
  echo "== reference job, device=$dev"
  t0=$SECONDS
  "$py" benchmarks/local_jobs.py reference --families arithmetic --device "$dev" \
    >"$out/reference_$dev.txt" 2>"$out/reference_$dev.log"
  echo "rc $? in $((SECONDS - t0)) s"; cat "$out/reference_$dev.txt"; grep -E " on (cuda|cpu)" "$out/reference_$dev.log" | head -2
done
cp runs/benchmarks/local_jobs.jsonl "$out/" 2>/dev/null || true
