#!/usr/bin/env bash
# The verifiers v1 tests (tests/integrations/test_verifiers_v1.py) in their own venv, .venv-vf1: verifiers 0.4.0
# (the `vf1` extra) and the inner stack's verifiers 0.2.0 (.venv) are one distribution name, so they cannot share a
# venv. The episode's jobs are still validated with .venv's interpreter (probe.sandbox.python), so make .venv first
# (bash scripts/setup.sh test,local). The first run installs about 100 packages (~2 minutes on 2 cores); verifiers'
# subprocess runtime then installs its harness program with uv from PyPI (cached after the first episode).
#   bash scripts/test_verifiers_v1.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-vf1 bash scripts/setup.sh test,vf1
.venv-vf1/bin/python -m pip install --disable-pip-version-check -q --no-deps -e environments/ait_job_writing_v1 2>&1 \
  | grep -v "is ignored: it is neither" || true
AIT_INNER_PYTHON="$PWD/.venv/bin/python" exec .venv-vf1/bin/python -m pytest -m "not slow" -n 0 \
  tests/integrations/test_verifiers_v1.py "$@"
