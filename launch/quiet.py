"""Keeps native libraries' chatter out of what a person reads.

Reverb's C++ code writes its info lines ("[reverb/cc/platform/default/server.cc:71] Started
replay server ...", "Still reading compressed chunks ..." on a resume) straight to the process's
standard error, and no logging setting turns them off. `hide_native_chatter` puts a small filter
process between the process's standard error and the terminal: lines with those prefixes are
dropped, everything else passes unchanged. A separate process, not a thread, so that a crash of
the run (an abort's last words, a fault handler's traceback) still reaches the terminal: the
filter ends when the last writer closes the pipe. `--verbose` leaves standard error alone.
"""

import atexit
import os
import subprocess
import sys

PREFIXES = ("[reverb/cc/",)

# The filter's own program: runs with `python -S`, no imports beyond os and sys.
_FILTER = r"""
import os, sys
prefixes = tuple(p.encode() for p in sys.argv[1:])
held = b""
def passes(line):
  return not line.startswith(prefixes)
def may_be_filtered(partial):
  return any(partial.startswith(p) or p.startswith(partial) for p in prefixes)
while True:
  data = os.read(0, 1 << 16)
  if not data:
    break
  *lines, held = (held + data).split(b"\n")
  out = b"".join(line + b"\n" for line in lines if passes(line))
  if held and not may_be_filtered(held):  # a partial line (a prompt): shown now, not at its newline
    out, held = out + held, b""
  if out:
    os.write(1, out)
if held and passes(held):
  os.write(1, held)
"""

_installed = None


def hide_native_chatter(prefixes=PREFIXES) -> None:
  """Routes this process's standard error (file descriptor 2) through the filter; once."""
  global _installed
  if _installed is not None:
    return
  sys.stderr.flush()
  terminal = os.dup(2)
  read_end, write_end = os.pipe()
  process = subprocess.Popen([sys.executable, "-S", "-c", _FILTER, *prefixes], stdin=read_end, stdout=terminal,
                             stderr=subprocess.DEVNULL, close_fds=True)
  os.close(read_end)
  os.dup2(write_end, 2)
  os.close(write_end)
  _installed = (terminal, process)
  atexit.register(_restore)


def _restore() -> None:
  """Standard error back to the terminal; waits for the filter to pass on what it holds."""
  global _installed
  if _installed is None:
    return
  terminal, process = _installed
  _installed = None
  try:
    sys.stderr.flush()
  except (OSError, ValueError):
    pass
  os.dup2(terminal, 2)  # closes this process's last write end of the pipe: the filter sees its end
  os.close(terminal)
  try:
    process.wait(timeout=5)
  except subprocess.TimeoutExpired:  # a child process still holds the pipe open
    pass
