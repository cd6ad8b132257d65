#!/usr/bin/env bash
# Set up and run the test suite (the same command CI runs).
#   bash scripts/test.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test,local,tinker
exec .venv/bin/python -m pytest -m "not slow" "$@"
