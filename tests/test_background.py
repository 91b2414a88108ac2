"""jrl.experiment.background.BackgroundWriter: a run's writes in order, on their own thread, only
while the host thread waits on its device (or drains), with the first error handed back."""

import threading
import time

import pytest

from jrl.experiment.background import BackgroundWriter


def test_writes_wait_for_the_host_to_wait_then_run_in_order():
  writer, done = BackgroundWriter(), []
  for i in range(100):
    writer.submit(lambda i=i: done.append((i, threading.current_thread().name)))
  time.sleep(0.2)
  assert done == []  # the host thread is not waiting on its device: nothing is written
  writer.drain()
  assert [i for i, _ in done] == list(range(100)) and {name for _, name in done} == {"jrl-writer"}
  writer.submit(lambda: done.append((100, "")))
  with writer.working():
    deadline = time.monotonic() + 10
    while len(done) < 101 and time.monotonic() < deadline:
      time.sleep(0.01)
  assert len(done) == 101
  writer.close()


def test_the_first_failed_write_stops_the_rest_and_is_raised_to_the_host():
  writer, done = BackgroundWriter(), []
  writer.submit(lambda: done.append(1))
  writer.submit(lambda: 1 / 0)
  writer.submit(lambda: done.append(3))
  with pytest.raises(ZeroDivisionError):
    writer.drain()
  assert done == [1]
  writer.submit(lambda: done.append(4))  # the error was handed over: writing goes on
  writer.close()
  assert done == [1, 4]
