#!/usr/bin/env bash
# Set up and run the test suite: the README's test command, exactly what CI runs (.ci/run).
#   bash scripts/test.sh [extra pytest args]
set -euo pipefail
exec bash "$(dirname "$0")/../.ci/run" "$@"
