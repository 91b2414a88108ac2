# Sourced by the set-up scripts: `find_python 3.10` prints the path of a Python of that
# version (PATH first, then pyenv's versions, newest patch first) or returns 1.
find_python() {
  local want="$1" major minor candidate
  major="${want%%.*}"; minor="${want#*.}"
  for candidate in "python$want" python3 python; do
    if command -v "$candidate" >/dev/null 2>&1 \
       && "$candidate" -c "import sys; sys.exit(sys.version_info[:2] != ($major, $minor))" >/dev/null 2>&1; then
      command -v "$candidate"; return 0
    fi
  done
  if command -v pyenv >/dev/null 2>&1; then
    local root version
    root="$(pyenv root)"
    for version in $(ls "$root/versions" 2>/dev/null | grep -E "^${major}\\.${minor}(\\.|\$)" | sort -V -r); do
      if [ -x "$root/versions/$version/bin/python" ]; then
        echo "$root/versions/$version/bin/python"; return 0
      fi
    done
  fi
  return 1
}
