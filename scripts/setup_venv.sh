#!/usr/bin/env bash
# Creates .venv/ at the repo root with the pinned stack, once.
# dm-launchpad 0.5.2 ships wheels only up to CPython 3.10, so everything is pinned to 3.10.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=find_python.sh
source "scripts/find_python.sh"

STAMP=.venv/.jrl-installed
# The stamp is the text of every requirements file installed below.
stamp_text() { cat requirements-lock.txt requirements-nodeps.txt; }
if [ -f "$STAMP" ] && stamp_text | cmp -s "$STAMP" -; then
  exit 0
fi

if ! PYTHON="$(find_python 3.10)"; then
  echo "jrl needs Python 3.10 (dm-launchpad 0.5.2 has no wheels for newer Pythons); none found on PATH or in pyenv. Install one, e.g. 'pyenv install 3.10.13', then rerun." >&2
  exit 2
fi

if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $("$PYTHON" --version 2>&1)"
  "$PYTHON" -m venv .venv
fi
echo "[setup] installing pinned stack from requirements-lock.txt"
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -r requirements-lock.txt
# gymnax (device backend) declares gymnasium<1.4; its real needs are in the lock.
.venv/bin/python -m pip install -q --no-deps -r requirements-nodeps.txt
.venv/bin/python -m pip install -q --no-deps -e .
# The loopback shim of local distributed launches (launch/loopback.c); built on first use otherwise.
.venv/bin/python -m launch.loopback >/dev/null \
  || echo "[setup] note: loopback shim not built (no C compiler?); distributed launches will say what to do"
stamp_text > "$STAMP"
echo "[setup] done"
