#!/usr/bin/env bash
# Runs the test suite (with JRL_TEST_PYTHON's interpreter, .venv's by default).
# A venv with the core stack (its .jrl-stack says core: no Reverb, Launchpad or TensorFlow) runs it as
# `pytest --core` (tests/conftest.py), so `make test` passes as typed on either stack.
# pytest's exit 5 (no tests collected) is a failure here. With JRL_TEST_TIMES=FILE, a line
# "<stack> <arguments><TAB><seconds><TAB><exit status>" is added to FILE for each run (.ci/run tables them).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
PYTHON="${JRL_TEST_PYTHON:-.venv/bin/python}"
core=()
if [ "$(cat "$(dirname "$PYTHON")/../.jrl-stack" 2>/dev/null)" = core ] && [[ " $* " != *" --core "* ]]; then
  core=(--core)
fi
# --durations: the slowest tests are listed at the end of every run (CI keeps its time in view).
start=$SECONDS
"$PYTHON" -m pytest tests --durations=25 "${core[@]}" "$@"
status=$?
if [ -n "${JRL_TEST_TIMES:-}" ]; then
  printf '%s %s\t%s\t%s\n' "$(cat "$(dirname "$PYTHON")/../.jrl-stack" 2>/dev/null || echo '?')" "$*" \
    "$((SECONDS - start))" "$status" >> "$JRL_TEST_TIMES"
fi
if [ "$status" -eq 5 ]; then
  echo "run_tests: pytest collected no tests; failing" >&2
  exit 1
fi
exit "$status"
