#!/usr/bin/env bash
# Runs the test suite (with JRL_TEST_PYTHON's interpreter, .venv's by default).
# pytest's exit 5 (no tests collected) is a failure here.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
# --durations: the slowest tests are listed at the end of every run (CI keeps its time in view).
"${JRL_TEST_PYTHON:-.venv/bin/python}" -m pytest tests --durations=25 "$@"
status=$?
if [ "$status" -eq 5 ]; then
  echo "run_tests: pytest collected no tests; failing" >&2
  exit 1
fi
exit "$status"
