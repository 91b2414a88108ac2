"""Metrics sinks: one CSV per role plus TensorBoard event files, and a progress line.

Both sinks report their `position()` (bytes written so far); a resumed run
truncates them back to the positions saved in its checkpoint, so rows written
after that checkpoint by the killed process are neither lost nor duplicated:
they are written again by the resumed run.
"""

import csv
import os
import sys
import time
import types
from typing import Dict, Optional, Tuple

# TensorBoard's event writer reaches the file system through `tf.io.gfile`, importing
# TensorFlow for it where it is installed (1.5 s, in runs that otherwise never load it);
# `tensorboard.compat.notf` makes it use its own stub, which writes local files the same way.
sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))

from tensorboard.compat.proto import event_pb2, summary_pb2  # noqa: E402
from tensorboard.summary.writer.event_file_writer import EventFileWriter  # noqa: E402


def truncate(path: str, size: int) -> None:
  with open(path, "r+b") as f:
    f.truncate(size)


def cut_rows(path: str, column: str, limit: float) -> None:
  """Keeps the rows of a metrics CSV whose `column` is <= `limit` (what a resumed distributed run
  does with rows its nodes wrote after the checkpoint); atomic."""
  if not os.path.exists(path):
    return
  with open(path, newline="") as f:
    reader = csv.DictReader(f)
    header, rows = reader.fieldnames, [row for row in reader if float(row[column]) <= limit]
  if header is None:
    return
  tmp = path + ".cut"
  with open(tmp, "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=header)
    writer.writeheader()
    writer.writerows(rows)
  os.replace(tmp, path)


class TensorBoard:
  """Scalars into `RUN_DIR/tensorboard/` event files (or its folder `subdir`: one per node of a
  distributed run); resumable at a saved position.

  `continue_after` (a step): a node that continues its predecessor's events (restarted, or in a
  resumed run) marks where it takes over; TensorBoard then drops the earlier files' points from
  the next step on, as the node's CSV was cut back. `flush_each`: every row reaches the file at
  once (a node process can end at any moment)."""

  def __init__(self, run_dir: str, resume_from: Optional[Dict[str, int]] = None, subdir: str = "",
               continue_after: Optional[int] = None, flush_each: bool = False):
    self.logdir = os.path.join(run_dir, "tensorboard", subdir) if subdir else os.path.join(run_dir, "tensorboard")
    if resume_from is not None and os.path.isdir(self.logdir):
      for name in os.listdir(self.logdir):
        path = os.path.join(self.logdir, name)
        if name in resume_from:
          truncate(path, resume_from[name])
        else:  # written after the checkpoint
          os.unlink(path)
    if continue_after is not None:
      _wait_for_a_later_second(self.logdir)
    self._writer = EventFileWriter(self.logdir)
    self._known = dict(resume_from or {})
    self._flush_each = flush_each
    if continue_after is not None:  # a session START: TensorBoard purges the points at its step and after
      self._writer.add_event(event_pb2.Event(wall_time=time.time(), step=int(continue_after) + 1,
                                             session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)))
      self._writer.flush()

  def add_scalars(self, prefix: str, step: int, row: Dict[str, float], skip: str = "") -> None:
    values = [summary_pb2.Summary.Value(tag=f"{prefix}/{k}", simple_value=float(v))
              for k, v in row.items() if k != skip and isinstance(v, (int, float))]
    self._writer.add_event(event_pb2.Event(wall_time=time.time(), step=step,
                                           summary=summary_pb2.Summary(value=values)))
    if self._flush_each:
      self._writer.flush()

  def position(self) -> Dict[str, int]:
    self._writer.flush()
    name = os.path.basename(self._writer._file_name)  # pinned tensorboard: the file this writer appends to
    return {**self._known, name: os.path.getsize(os.path.join(self.logdir, name))}

  def close(self) -> None:
    self._writer.close()


def _wait_for_a_later_second(logdir: str) -> None:
  """TensorBoard reads a folder's event files in name order, and a name starts with the second the
  file was made, then the host, the process id and a counter as text (so within one second "10"
  sorts before "9"): a writer that continues its predecessors starts in a later second than
  theirs, so that its file comes after them."""
  seconds = [int(name.split(".")[3]) for name in (os.listdir(logdir) if os.path.isdir(logdir) else [])
             if name.startswith("events.out.tfevents.") and name.split(".")[3].isdigit()]
  while seconds and int(time.time()) <= max(seconds):
    time.sleep(0.05)


class MetricsLogger:
  """Appends rows to `metrics/<role>.csv` and scalars to TensorBoard under `<role>/`.

  The CSV columns are fixed by the first row; later rows must carry the same keys.
  `resume_from` (a `position()`) continues an existing file from that byte.
  """

  def __init__(self, run_dir: str, role: str, tensorboard: Optional[TensorBoard] = None,
               step_key: str = "actor_steps", resume_from: Optional[int] = None):
    os.makedirs(os.path.join(run_dir, "metrics"), exist_ok=True)
    self.path = os.path.join(run_dir, "metrics", f"{role}.csv")
    self._role = role
    self._tb = tensorboard
    self._step_key = step_key
    self._writer: Optional[csv.DictWriter] = None
    if resume_from and os.path.exists(self.path):
      truncate(self.path, resume_from)
      with open(self.path, newline="") as f:
        header = next(csv.reader(f), None)
      self._file = open(self.path, "a", newline="")
      if header:
        self._writer = csv.DictWriter(self._file, fieldnames=header)
    else:
      self._file = open(self.path, "w", newline="")

  def write(self, row: Dict[str, float]) -> None:
    if self._writer is None:
      self._writer = csv.DictWriter(self._file, fieldnames=list(row))
      self._writer.writeheader()
    self._writer.writerow(row)
    self._file.flush()
    if self._tb is not None:
      self._tb.add_scalars(self._role, int(row.get(self._step_key, 0)), row, skip=self._step_key)

  def position(self) -> int:
    self._file.flush()
    return os.path.getsize(self.path)

  def close(self) -> None:
    self._file.close()


def last_step(path: str, step_key: str) -> Optional[int]:
  """The `step_key` of the last row of a metrics CSV (None: no file or no rows)."""
  if not os.path.exists(path):
    return None
  with open(path, newline="") as f:
    rows = list(csv.DictReader(f))
  return int(float(rows[-1][step_key])) if rows else None


def open_metric_logs(run_dir: str, roles, positions: Optional[Dict] = None) -> Tuple[TensorBoard, Dict[str, MetricsLogger]]:
  """TensorBoard and one `MetricsLogger` per role; `positions` (a resumed run's, from
  `metric_log_positions` in its checkpoint; {} when it had none) drops what was logged after them."""
  tb = TensorBoard(run_dir, resume_from=None if positions is None else positions.get("tensorboard", {}))
  positions = positions or {}
  return tb, {role: MetricsLogger(run_dir, role, tb, resume_from=positions.get(role)) for role in roles}


def metric_log_positions(tb: TensorBoard, loggers: Dict[str, MetricsLogger]) -> Dict:
  """Where each log ends now, for a checkpoint (`open_metric_logs` continues from there)."""
  return {"tensorboard": tb.position(), **{role: log.position() for role, log in loggers.items()}}


class Progress:
  """Prints one status line at most every `seconds` (0: none); with `periodic` False only the
  lines forced out (a run's closing lines)."""

  def __init__(self, prefix: str, seconds: float, periodic: bool = True):
    self._prefix = prefix
    self._seconds = seconds
    self._last = 0.0
    self.periodic = periodic

  def maybe_print(self, text: str, force: bool = False) -> bool:
    """Prints `text` if its time has come (or `force`); whether it did."""
    now = time.monotonic()
    if self._seconds > 0 and (force or (self.periodic and now - self._last >= self._seconds)):
      self._last = now
      print(f"[{self._prefix}] {text}", flush=True)
      return True
    return False
