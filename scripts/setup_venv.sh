#!/usr/bin/env bash
# Creates .venv/ at the repo root with the pinned stack, once.
# dm-launchpad 0.5.2 ships wheels only up to CPython 3.10, so everything is pinned to 3.10.
# ACCEL picks JAX's accelerator wheels: cpu (requirements-lock.txt) or cuda12 (requirements-lock-cuda12.txt:
# the same pins plus JAX's CUDA 12 plugin and the nvidia-* wheels). Unset, it keeps what .venv has
# (.venv/.jrl-accel), so `make test` after `make setup ACCEL=cuda12` does not swap the GPU wheels out.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=find_python.sh
source "scripts/find_python.sh"

ACCEL="${ACCEL:-$(cat .venv/.jrl-accel 2>/dev/null || echo cpu)}"
case "$ACCEL" in
  cpu) LOCK=requirements-lock.txt ;;
  cuda12) LOCK=requirements-lock-cuda12.txt ;;
  *) echo "ACCEL=$ACCEL: make setup takes ACCEL=cpu or ACCEL=cuda12 (JAX 0.6.2 has no CUDA 13 wheels)" >&2; exit 2 ;;
esac

STAMP=.venv/.jrl-installed
# The stamp is the text of every requirements file installed below.
stamp_text() { cat "$LOCK" requirements-nodeps.txt; }
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
echo "[setup] installing pinned stack from $LOCK"
.venv/bin/python -m pip install -q --upgrade pip
if [ "$ACCEL" = cpu ]; then
  # Back to CPU from a GPU install: JAX would still load a CUDA plugin left in the venv.
  plugins="$(.venv/bin/python -m pip list --format=freeze 2>/dev/null | grep -oiE '^jax-cuda[0-9]+-(plugin|pjrt)' || true)"
  if [ -n "$plugins" ]; then
    # shellcheck disable=SC2086
    .venv/bin/python -m pip uninstall -q -y $plugins
  fi
fi
.venv/bin/python -m pip install -q -r "$LOCK"
# gymnax (device backend) declares gymnasium<1.4; its real needs are in the lock.
.venv/bin/python -m pip install -q --no-deps -r requirements-nodeps.txt
.venv/bin/python -m pip install -q --no-deps -e .
# The loopback shim of local distributed launches (launch/loopback.c); built on first use otherwise.
.venv/bin/python -m launch.loopback >/dev/null \
  || echo "[setup] note: loopback shim not built (no C compiler?); distributed launches will say what to do"
stamp_text > "$STAMP"
echo "$ACCEL" > .venv/.jrl-accel
echo "[setup] done"
