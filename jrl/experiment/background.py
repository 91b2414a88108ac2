"""A run's file writes on a thread of their own (metric and evaluator rows, TensorBoard events,
progress lines, best-policy snapshots), in order, while the run's host thread waits on its device.

The device loop's host thread would otherwise write every run's rows between chunks while the
device sits idle. With a background writer it hands them over and dispatches the next chunk; the
writer works while the host thread waits for that chunk (`working()`: the host thread's wait
releases the GIL, so the two do not contend for it), and pauses while the host thread does its
own bookkeeping between chunks. The run core drains the writer before anything that reads what
was written (a checkpoint's log positions) and when it closes the logs. One writer can serve
many runs (a vmapped sweep's).
"""

import contextlib
import queue
import threading
from typing import Callable, Iterator, Optional


class BackgroundWriter:
  """Runs submitted writes one after another on its own thread, while it may (`working`, `drain`);
  the first error stops the writes after it and is raised in the submitting thread (at the next
  `submit` or `drain`)."""

  def __init__(self, name: str = "jrl-writer"):
    self._queue: "queue.Queue[Optional[Callable[[], None]]]" = queue.Queue()
    self._error: Optional[BaseException] = None
    self._may_work = threading.Event()
    self._thread = threading.Thread(target=self._work, name=name, daemon=True)
    self._thread.start()

  def submit(self, write: Callable[[], None]) -> None:
    self._raise()
    self._queue.put(write)

  @contextlib.contextmanager
  def working(self) -> Iterator[None]:
    """Lets the writer work for the duration (the host thread waits on its device meanwhile)."""
    self._may_work.set()
    try:
      yield
    finally:
      self._may_work.clear()

  def drain(self) -> None:
    """Returns once every write submitted so far is done (raising the first that failed)."""
    with self.working():
      self._queue.join()
    self._raise()

  def close(self) -> None:
    """Drains, then ends the thread."""
    try:
      self.drain()
    finally:
      self._queue.put(None)
      self._may_work.set()
      self._thread.join()

  def _raise(self) -> None:
    if self._error is not None:
      error, self._error = self._error, None
      raise error

  def _work(self) -> None:
    while True:
      write = self._queue.get()
      try:
        if write is None:
          return
        self._may_work.wait()
        if self._error is None:
          write()
      except BaseException as e:  # noqa: BLE001 - handed to the submitting thread
        self._error = e
      finally:
        self._queue.task_done()
