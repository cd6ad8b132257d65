#!/usr/bin/env bash
# Set up and run the main job: one complete episode with the scripted reference agent.
#   bash scripts/main.sh [hydra overrides, e.g. family=arithmetic backend=stub]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python scripts/run_episode.py "$@"
