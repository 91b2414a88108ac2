#!/usr/bin/env bash
# Creates .venv-core/ at the repo root: the core stack (no Reverb, Launchpad or TensorFlow) on Python 3.12
# (CORE_PYTHON= another 3.11-3.13) beside the full stack's .venv, for `make test-core` and `make lint` on a
# machine whose .venv has the full stack. scripts/setup_venv.sh does the work (ACCEL as there).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-core STACK=core CORE_PYTHON="${CORE_PYTHON:-3.12}" TARGET="make setup-core" exec bash scripts/setup_venv.sh
