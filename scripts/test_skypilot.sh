#!/usr/bin/env bash
# The SkyPilot YAML tests in CI: the task and pool YAML backend=skypilot generates, parsed by SkyPilot's own
# parser (skypilot==0.14.1, the `skypilot` extra) in its own venv, .venv-sky: skypilot 0.14.1 needs click<8.2
# and runpod 1.12.0 (the worker's handler pin) click>=8.4.2, so the extra cannot share .venv. The tests run in
# .venv and call .venv-sky's interpreter (tests/backends/test_skypilot_backend.py, skypilot_python()).
# Fresh install: 192 s and 460 MB on 2 shared cores (2026-12-02); a warm pip cache makes it much shorter.
#   bash scripts/test_skypilot.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-sky bash scripts/setup.sh skypilot
AIT_SKYPILOT_PYTHON="$PWD/.venv-sky/bin/python" exec .venv/bin/python -m pytest -m "not slow" \
  tests/backends/test_skypilot_backend.py tests/fleet/test_pool.py "$@"
