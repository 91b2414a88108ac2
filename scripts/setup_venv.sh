#!/usr/bin/env bash
# Creates a venv at the repo root (.venv, or VENV=) with one of jrl's two stacks, once.
#
# STACK picks the stack:
#   full  Python 3.10: Reverb, Launchpad (--distributed, --launcher slurm|template), TensorFlow 2.8, JAX 0.6.2
#         (requirements-lock.txt). dm-launchpad 0.5.2 ships wheels only up to 3.10, so this stack stays there.
#   core  Python 3.11-3.13 with current JAX: everything but Reverb and Launchpad (embedded runs with the seeded
#         buffer, the device backend, sweeps and reports, the research API). requirements-core-py311.txt on 3.11
#         (jaxlib's 3.11 wheels end at 0.10.2), requirements-core-py312.txt on 3.12 and 3.13.
#   unset the venv's own stack where it has one (.jrl-stack); else full where a Python 3.10 is found, else core on
#         the newest Python 3.11-3.13 found. CORE_PYTHON=3.12 asks the core stack for that Python.
# ACCEL picks JAX's accelerator wheels: cpu, cuda12 (both stacks) or cuda13 (the core on 3.12/3.13): the same pins
# plus JAX's CUDA plugin and the nvidia-* wheels. Unset, the venv keeps what it has (.jrl-accel), so
# `make test` after `make setup ACCEL=cuda12` does not swap the GPU wheels out.
# TARGET names the make target in messages (make setup, make setup-core). JRL_SETUP_PLAN=1 prints the choice
# (stack, Python, lock) and exits without touching the venv.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=find_python.sh
source "scripts/find_python.sh"

VENV="${VENV:-.venv}"
TARGET="${TARGET:-make setup}"

# The stack the venv already has (a venv made before .jrl-stack was written: by its Python).
venv_stack() {
  if [ -f "$VENV/.jrl-stack" ]; then
    cat "$VENV/.jrl-stack"
  elif [ -x "$VENV/bin/python" ]; then
    "$VENV/bin/python" -c "import sys; print('full' if sys.version_info[:2] == (3, 10) else 'core')" 2>/dev/null || true
  fi
}

CHOSEN_BY="STACK=${STACK:-}"
if [ -z "${STACK:-}" ]; then
  STACK="$(venv_stack)"
  CHOSEN_BY="the stack $VENV has"
  if [ "$STACK" = core ] && [ -z "${CORE_PYTHON:-}" ]; then  # and its Python, not a newer one found since
    CORE_PYTHON="$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true)"
  fi
fi
PY310=""
if [ -z "$STACK" ] || [ "$STACK" = full ]; then
  PY310="$(find_python 3.10 || true)"
fi
if [ -z "$STACK" ]; then
  if [ -n "$PY310" ]; then
    STACK=full
    CHOSEN_BY="a Python 3.10 was found"
  else
    STACK=core
    CHOSEN_BY="no Python 3.10 was found on PATH or in pyenv"
  fi
fi

ACCEL="${ACCEL:-$(cat "$VENV/.jrl-accel" 2>/dev/null || echo cpu)}"
case "$STACK/$ACCEL" in
  full/cpu | full/cuda12 | core/cpu | core/cuda12 | core/cuda13) ;;
  full/*) echo "ACCEL=$ACCEL: $TARGET takes ACCEL=cpu or ACCEL=cuda12 on the full stack (JAX 0.6.2 has no CUDA 13 wheels)" >&2; exit 2 ;;
  core/*) echo "ACCEL=$ACCEL: $TARGET takes ACCEL=cpu, ACCEL=cuda12 or ACCEL=cuda13" >&2; exit 2 ;;
  *) echo "STACK=$STACK: $TARGET takes STACK=full (Python 3.10: Reverb, Launchpad) or STACK=core (Python 3.11-3.13)" >&2; exit 2 ;;
esac

if [ "$STACK" = full ]; then
  PYTHON="$PY310"
  if [ -z "$PYTHON" ]; then
    echo "STACK=full needs Python 3.10 (dm-launchpad 0.5.2 has no wheels for newer Pythons); none found on PATH or in pyenv. Install one, e.g. 'pyenv install 3.10.13', then rerun; or 'make setup STACK=core' for the core stack on Python 3.11-3.13." >&2
    exit 2
  fi
  LOCK=requirements-lock.txt
  [ "$ACCEL" = cpu ] || LOCK="requirements-lock-$ACCEL.txt"
else
  PYTHON=""
  for version in ${CORE_PYTHON:-3.13 3.12 3.11}; do
    PYTHON="$(find_python "$version" || true)"
    [ -n "$PYTHON" ] && break
  done
  if [ -z "$PYTHON" ]; then
    echo "STACK=core needs Python ${CORE_PYTHON:-3.11, 3.12 or 3.13}; none found on PATH or in pyenv. Install one, e.g. 'pyenv install 3.12.1', then rerun." >&2
    exit 2
  fi
  case "$("$PYTHON" -c 'import sys; print(sys.version_info[1])')/$ACCEL" in
    11/cpu) LOCK=requirements-core-py311.txt ;;
    11/*) echo "ACCEL=$ACCEL: the core stack's GPU locks are for Python 3.12 and 3.13 (requirements-core-py312-$ACCEL.txt); the Python found is 3.11: install one, e.g. 'pyenv install 3.12.1'" >&2; exit 2 ;;
    1[23]/cpu) LOCK=requirements-core-py312.txt ;;
    1[23]/*) LOCK="requirements-core-py312-$ACCEL.txt" ;;
    *) echo "STACK=core: $PYTHON is not Python 3.11-3.13" >&2; exit 2 ;;
  esac
fi
VERSION="$("$PYTHON" --version 2>&1 | cut -d' ' -f2)"

if [ -n "${JRL_SETUP_PLAN:-}" ]; then
  echo "[setup] plan: $STACK stack, Python $VERSION ($PYTHON), $LOCK into $VENV ($CHOSEN_BY)"
  exit 0
fi

STAMP="$VENV/.jrl-installed"
# The stamp is the stack, the Python and the text of every requirements file installed below.
stamp_text() { echo "$STACK $VERSION"; cat "$LOCK" requirements-nodeps.txt; }
if [ -f "$STAMP" ] && stamp_text | cmp -s "$STAMP" -; then
  exit 0
fi

case "$STACK" in
  full) GIVES="Reverb, Launchpad (--distributed), TensorFlow 2.8, JAX $(grep -m1 '^jax==' "$LOCK" | cut -d= -f3); STACK=core for the core stack on Python 3.11-3.13" ;;
  core) GIVES="JAX $(grep -m1 '^jax==' "$LOCK" | cut -d= -f3): embedded runs with the seeded buffer, --backend device, sweeps; Reverb and Launchpad need STACK=full (Python 3.10)" ;;
esac
echo "[setup] stack: $STACK on Python $VERSION ($CHOSEN_BY; $GIVES)"

# Another Python than the venv's (a stack switched, a new patch release): a fresh venv.
if [ -x "$VENV/bin/python" ] && [ "$("$VENV/bin/python" --version 2>&1 | cut -d' ' -f2)" != "$VERSION" ]; then
  echo "[setup] $VENV has $("$VENV/bin/python" --version 2>&1): making it anew with Python $VERSION"
  rm -rf "$VENV"
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV with Python $VERSION"
  "$PYTHON" -m venv "$VENV"
fi
rm -f "$STAMP"  # an install cut short is not taken for a finished one
echo "[setup] installing $LOCK"
"$VENV/bin/python" -m pip install -q --upgrade pip
# Another accelerator's (or, for cpu, any) CUDA plugin left in the venv would still be loaded by JAX.
plugins="$("$VENV/bin/python" -m pip list --format=freeze 2>/dev/null | grep -oiE '^jax-cuda[0-9]+-(plugin|pjrt)' \
  | grep -viE "^jax-${ACCEL}-" || true)"
if [ -n "$plugins" ]; then
  # shellcheck disable=SC2086
  "$VENV/bin/python" -m pip uninstall -q -y $plugins
fi
"$VENV/bin/python" -m pip install -q -r "$LOCK"
# gymnax (the device backend) declares gymnasium<1.4 and jax<0.12; its real needs are in the lock.
"$VENV/bin/python" -m pip install -q --no-deps -r requirements-nodeps.txt
"$VENV/bin/python" -m pip install -q --no-deps -e .
if [ "$STACK" = full ]; then
  # The loopback shim of local distributed launches (launch/loopback.c); built on first use otherwise.
  "$VENV/bin/python" -m launch.loopback >/dev/null \
    || echo "[setup] note: loopback shim not built (no C compiler?); distributed launches will say what to do"
fi
echo "$STACK" > "$VENV/.jrl-stack"
echo "$ACCEL" > "$VENV/.jrl-accel"
stamp_text > "$STAMP"
echo "[setup] done: $VENV has the $STACK stack (Python $VERSION)"
