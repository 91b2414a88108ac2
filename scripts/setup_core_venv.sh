#!/usr/bin/env bash
# Creates .venv-core/ at the repo root: the pure core (no Reverb, Launchpad or TensorFlow) on
# Python 3.12 with the newest stack that resolves there (requirements-core-py312.txt), once.
set -euo pipefail
cd "$(dirname "$0")/.."

find_python312() {
  local candidate
  for candidate in python3.12 python3 python; do
    if command -v "$candidate" >/dev/null 2>&1 \
       && "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' >/dev/null 2>&1; then
      command -v "$candidate"; return 0
    fi
  done
  if command -v pyenv >/dev/null 2>&1; then
    local root version
    root="$(pyenv root)"
    for version in $(ls "$root/versions" 2>/dev/null | grep -E '^3\.12(\.|$)' | sort -V -r); do
      if [ -x "$root/versions/$version/bin/python" ]; then
        echo "$root/versions/$version/bin/python"; return 0
      fi
    done
  fi
  return 1
}

STAMP=.venv-core/.jrl-installed
# The stamp is the text of the lock installed below.
if [ -f "$STAMP" ] && cmp -s "$STAMP" requirements-core-py312.txt; then
  exit 0
fi

if ! PYTHON="$(find_python312)"; then
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
