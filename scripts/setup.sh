#!/usr/bin/env bash
# Create .venv (Python >= 3.11) and install the project with the given extras.
#   bash scripts/setup.sh            # core only
#   bash scripts/setup.sh test,local # with extras
#   VENV=.venv-trl bash scripts/setup.sh test,trl   # another folder (the TRL extra: scripts/test_trl.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="${1:-}"
VENV="${VENV:-.venv}"
PY="${PYTHON:-python3}"
if ! "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
  echo "error: Python >= 3.11 is required (found $("$PY" --version 2>&1)); set PYTHON=/path/to/python3.11" >&2
  exit 1
fi
FIRST=""
if [ ! -x "$VENV/bin/python" ]; then
  echo "creating $VENV with $("$PY" --version)"
  "$PY" -m venv "$VENV"
  FIRST=" (the first time takes a few minutes)"
fi
SPEC="."
if [ -n "$EXTRAS" ]; then SPEC=".[${EXTRAS}]"; fi
echo "installing ai-trains-ai ${SPEC} into ${VENV}${FIRST}"
# pip's "Location ... is ignored" notes about local mirrors are noise; real errors still show.
set +e
"$VENV/bin/python" -m pip install --disable-pip-version-check -q -e "$SPEC" 2>&1 | grep -v "is ignored: it is neither"
PIP_STATUS=${PIPESTATUS[0]}
set -e
if [ "$PIP_STATUS" != 0 ]; then
  echo "error: pip could not install ai-trains-ai ${SPEC} (exit ${PIP_STATUS}; its message is above); rerun: $VENV/bin/pip install -e '$SPEC'" >&2
  exit 1
fi
"$VENV/bin/python" -c "import ait_env" || { echo "error: installation failed; rerun: $VENV/bin/pip install -e '$SPEC'" >&2; exit 1; }
# The validation probe's sandbox uses bubblewrap when available (see docs/security.md).
if ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing bubblewrap (sandbox for untrusted agent code)"
    { apt-get install -y -q bubblewrap >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q bubblewrap >/dev/null 2>&1; }; } || echo "warning: apt-get install bubblewrap failed; the probe will use its weaker fallback sandbox" >&2
  else
    echo "warning: bubblewrap (bwrap) not found; the probe will use its weaker fallback sandbox. Install it with: sudo apt-get install bubblewrap" >&2
  fi
fi
