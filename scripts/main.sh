#!/usr/bin/env bash
# Set up and run the main job: one complete episode of the scripted reference agent on the local
# backend (real GRPO training of the project's own tiny models on this CPU; no accounts, no GPU).
# The first run also builds the base model the job uses (a few minutes, cached in ~/.cache/ai-trains-ai).
#   bash scripts/main.sh [hydra overrides, e.g. family=units seed=3, backend=stub for the fast surrogate]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh local
exec .venv/bin/python scripts/run_episode.py "$@"
