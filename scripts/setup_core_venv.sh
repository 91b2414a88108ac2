#!/usr/bin/env bash
# Creates .venv-core/ at the repo root: the pure core (no Reverb, Launchpad or TensorFlow) on
# Python 3.12 with the newest stack that resolves there (requirements-core-py312.txt), once.
# ACCEL picks JAX's accelerator wheels: cpu, cuda12 or cuda13 (requirements-core-py312-cuda1N.txt: the
# same pins plus JAX's CUDA plugin and the nvidia-* wheels). Unset, it keeps what .venv-core has.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=find_python.sh
source "scripts/find_python.sh"

ACCEL="${ACCEL:-$(cat .venv-core/.jrl-accel 2>/dev/null || echo cpu)}"
case "$ACCEL" in
  cpu) LOCK=requirements-core-py312.txt ;;
  cuda12 | cuda13) LOCK="requirements-core-py312-$ACCEL.txt" ;;
  *) echo "ACCEL=$ACCEL: make setup-core takes ACCEL=cpu, ACCEL=cuda12 or ACCEL=cuda13" >&2; exit 2 ;;
esac

STAMP=.venv-core/.jrl-installed
# The stamp is the text of the lock installed below.
if [ -f "$STAMP" ] && cmp -s "$STAMP" "$LOCK"; then
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
echo "[setup-core] installing the core stack from $LOCK"
.venv-core/bin/python -m pip install -q --upgrade pip
# Another accelerator's (or, for cpu, any) CUDA plugin left in the venv would still be loaded by JAX.
plugins="$(.venv-core/bin/python -m pip list --format=freeze 2>/dev/null | grep -oiE '^jax-cuda[0-9]+-(plugin|pjrt)' \
  | grep -viE "^jax-${ACCEL}-" || true)"
if [ -n "$plugins" ]; then
  # shellcheck disable=SC2086
  .venv-core/bin/python -m pip uninstall -q -y $plugins
fi
.venv-core/bin/python -m pip install -q -r "$LOCK"
.venv-core/bin/python -m pip install -q --no-deps -e .
cp "$LOCK" "$STAMP"
echo "$ACCEL" > .venv-core/.jrl-accel
echo "[setup-core] done"
