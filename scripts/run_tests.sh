#!/usr/bin/env bash
# Runs the test suite. pytest's exit 5 (no tests collected) is a failure here.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
.venv/bin/python -m pytest tests "$@"
status=$?
if [ "$status" -eq 5 ]; then
  echo "run_tests: pytest collected no tests; failing" >&2
  exit 1
fi
exit "$status"
