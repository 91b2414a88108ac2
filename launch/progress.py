"""A run's progress lines, echoed to this terminal from the log of the process that prints them
(a program's driver node, a device run's first process), whichever engine or launcher started it."""

import os
import threading


class ProgressEcho(threading.Thread):
  """Echoes a node's progress lines (the evaluator's; a device run's first process) from its log
  file to this terminal."""

  def __init__(self, path: str):
    """Make it before the nodes start: a resumed run's node appends to its earlier session's log,
    and only what this session adds is echoed."""
    super().__init__(daemon=True)
    self._path, self._halt = path, threading.Event()
    self._start = os.path.getsize(path) if os.path.exists(path) else 0

  def run(self):
    position = self._start
    while not self._halt.wait(0.5):
      if not os.path.exists(self._path):
        continue
      with open(self._path, errors="replace") as f:
        f.seek(position)
        text = f.read()
        position = f.tell()
      for line in text.splitlines():
        if line.startswith("[") and "] steps " in line:
          print(line, flush=True)

  def stop(self):
    self._halt.set()
