#!/usr/bin/env bash
# The TRL tests (tests/integrations/test_trl_*.py) in their own venv, .venv-trl: every trl 1.x needs
# datasets>=4.7 and the inner stack (verifiers 0.2.0, in .venv) datasets<4.7, so the `trl` extra cannot
# share .venv. The first run installs it (about a minute with a warm pip cache; 1.6 GB).
#   bash scripts/test_trl.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-trl bash scripts/setup.sh test,trl
exec .venv-trl/bin/python -m pytest -m "not slow" tests/integrations/test_trl_adapter.py \
  tests/integrations/test_trl_grpo.py "$@"
