#!/usr/bin/env bash
# Builds the documentation site (docs/, mkdocs.yml) into build/site/ with --strict: any warning
# (a broken link, a missing page, a docstring mkdocstrings cannot read) fails the build.
# Installs requirements-docs.txt into .venv once (a stamp, as scripts/setup_venv.sh does).
# Extra arguments go to `mkdocs build` (e.g. --site-dir DIR).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/python ]; then
  echo "build_docs: no .venv; run 'make setup' first (make docs does)" >&2
  exit 2
fi

STAMP=.venv/.jrl-docs-installed
if [ ! -f "$STAMP" ] || ! cmp -s "$STAMP" requirements-docs.txt; then
  echo "[docs] installing requirements-docs.txt into .venv"
  # pip's own notes (e.g. a find-links folder in the machine's pip config that does not exist)
  # would read as build warnings; they are shown only when the install fails.
  log=$(mktemp)
  if ! .venv/bin/python -m pip install -q -r requirements-docs.txt >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    exit 1
  fi
  rm -f "$log"
  cp requirements-docs.txt "$STAMP"
fi

# Material 9.7 prints a banner about MkDocs 2.0 on every build; the pins stay on MkDocs 1.6.
export NO_MKDOCS_2_WARNING=1
exec .venv/bin/python -m mkdocs build --strict --site-dir build/site "$@"
