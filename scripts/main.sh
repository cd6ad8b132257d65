#!/usr/bin/env bash
# Set up and run the main job: one complete episode of the scripted reference agent on the local
# backend (real GRPO training of the project's own tiny models on this CPU; no accounts, no GPU).
# Three steps: set up .venv; build the local base models (python -m cpu.tiny_models.build: the first
# time a few minutes, with progress; afterwards one line, as they are cached in $AIT_CACHE_DIR or
# ~/.cache/ai-trains-ai/models); run the episode. backend=stub skips the build.
#   bash scripts/main.sh [hydra overrides, e.g. family=units seed=3, backend=stub for the fast surrogate]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh local
backend=local  # conf/run_episode.yaml's default; the last backend=<name> override wins, as in Hydra
for arg in "$@"; do
  case "$arg" in
    backend=* | +backend=* | ++backend=*) backend="${arg#*backend=}" ;;
  esac
done
if [ "$backend" = "local" ]; then
  .venv/bin/python -m cpu.tiny_models.build
fi
exec .venv/bin/python scripts/run_episode.py "$@"
