"""Metrics sinks: one CSV per role plus TensorBoard event files, and a progress line."""

import csv
import os
import time
from typing import Dict, Optional

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter


class MetricsLogger:
  """Appends rows to `metrics/<role>.csv` and scalars to TensorBoard under `<role>/`.

  The CSV columns are fixed by the first row; later rows must carry the same keys.
  """

  def __init__(self, run_dir: str, role: str, tensorboard: Optional[EventFileWriter] = None,
               step_key: str = "actor_steps"):
    os.makedirs(os.path.join(run_dir, "metrics"), exist_ok=True)
    self.path = os.path.join(run_dir, "metrics", f"{role}.csv")
    self._role = role
    self._tb = tensorboard
    self._step_key = step_key
    self._file = open(self.path, "w", newline="")
    self._writer: Optional[csv.DictWriter] = None

  def write(self, row: Dict[str, float]) -> None:
    if self._writer is None:
      self._writer = csv.DictWriter(self._file, fieldnames=list(row))
      self._writer.writeheader()
    self._writer.writerow(row)
    self._file.flush()
    if self._tb is not None:
      step = int(row.get(self._step_key, 0))
      values = [summary_pb2.Summary.Value(tag=f"{self._role}/{k}", simple_value=float(v))
                for k, v in row.items() if k != self._step_key and isinstance(v, (int, float))]
      self._tb.add_event(event_pb2.Event(wall_time=time.time(), step=step,
                                         summary=summary_pb2.Summary(value=values)))

  def close(self) -> None:
    self._file.close()


def make_tensorboard(run_dir: str) -> EventFileWriter:
  return EventFileWriter(os.path.join(run_dir, "tensorboard"))


class Progress:
  """Prints one status line at most every `seconds`."""

  def __init__(self, prefix: str, seconds: float):
    self._prefix = prefix
    self._seconds = seconds
    self._last = 0.0

  def maybe_print(self, text: str, force: bool = False) -> None:
    now = time.monotonic()
    if self._seconds > 0 and (force or now - self._last >= self._seconds):
      self._last = now
      print(f"[{self._prefix}] {text}", flush=True)
