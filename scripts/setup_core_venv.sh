#!/usr/bin/env bash
# Creates .venv-core/ at the repo root: the pure core (no Reverb, Launchpad or TensorFlow) on
# Python 3.12 with the newest stack that resolves there (requirements-core-py312.txt), once.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=find_python.sh
source "scripts/find_python.sh"

STAMP=.venv-core/.jrl-installed
# The stamp is the text of the lock installed below.
if [ -f "$STAMP" ] && cmp -s "$STAMP" requirements-core-py312.txt; then
  exit 0
fi

if ! PYTHON="$(find_python 3.12)"; then
  echo "the jrl core venv needs Python 3.12 (requirements-core-py312.txt is resolved for it); none found on PATH or in pyenv. Install one, e.g. 'pyenv install 3.12.1', then rerun." >&2
  exit 2
fi

if [ ! -x .venv-core/bin/python ]; then
  echo "[setup-core] creating .venv-core with $("$PYTHON" --version 2>&1)"
  "$PYTHON" -m venv .venv-core
fi
echo "[setup-core] installing the core stack from requirements-core-py312.txt"
.venv-core/bin/python -m pip install -q --upgrade pip
.venv-core/bin/python -m pip install -q -r requirements-core-py312.txt
.venv-core/bin/python -m pip install -q --no-deps -e .
cp requirements-core-py312.txt "$STAMP"
echo "[setup-core] done"
