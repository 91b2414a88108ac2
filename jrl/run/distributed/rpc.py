"""Calls between a program's nodes: waiting for a reply without outliving the program's stop,
waiting out a lost service, and a variable source that refreshes in the background. Over any
engine's `Handle` (`jrl.run.distributed.engine`)."""

import concurrent.futures
import threading
import time
from typing import Any, Callable, Optional

from jrl.errors import Stopped
from jrl.outage import Outage, ServiceLost
from jrl.run.distributed.node_io import log

# A call to a service that has answered before counts as lost after this long without a reply.
REPLY_PATIENCE_SECONDS = 2.0


def wait_unless_stopped(future: concurrent.futures.Future, stop: threading.Event) -> Any:
  """The result of a call's future; Stopped if the program stops first (a dead peer must not keep
  this node alive past the program's stop)."""
  while True:
    try:
      return future.result(timeout=0.05)  # returns as soon as the reply is in
    except concurrent.futures.TimeoutError:
      if stop.is_set():
        raise Stopped("program stopping")


class ServiceCall:
  """Calls one method of another node, waiting out its outages.

  A server that is gone shows as a reply that does not come (courier waits for one to listen on
  its address again; Ray for a restarted actor): once the service has answered before, a call
  unanswered for REPLY_PATIENCE_SECONDS counts as an outage; an error reply is retried with
  backoff. Both are logged once per interval and end in ServiceLost after `deadline_s`. Before
  the first answer the service may still be starting, and the call waits.
  """

  def __init__(self, handle, method: str, service: str, deadline_s: float, stop: threading.Event,
               log_fn: Optional[Callable[[str], None]] = None):
    self._handle, self._method, self._stop = handle, method, stop
    self._outage = Outage(service, deadline_s, log_fn or log)
    self._answered = False

  def __call__(self, *args):
    backoff = 0.1
    while True:
      start = time.monotonic()
      future = self._handle.future(self._method, *args)
      try:
        result = self._reply(future, start)
      except (Stopped, ServiceLost):
        raise
      except Exception as e:  # the call failed: retry until the deadline
        self._outage.failing(f"{type(e).__name__}: {e}")
        if self._stop.wait(backoff):
          raise Stopped("program stopping")
        backoff = min(2 * backoff, 2.0)
        continue
      self._answered = True
      self._outage.ok()
      return result

  def _reply(self, future, start: float):
    while True:
      try:
        return future.result(timeout=0.05)
      except concurrent.futures.TimeoutError:
        if self._stop.is_set():
          future.cancel()
          raise Stopped("program stopping")
        waited = time.monotonic() - start
        if self._answered and waited >= REPLY_PATIENCE_SECONDS:
          try:
            self._outage.failing(f"no reply for {waited:.0f}s", since=start)
          except ServiceLost:
            future.cancel()
            raise


class AsyncRemoteVariables:
  """Variable source over RPC that refreshes in the background: each call returns the newest
  parameters received and keeps one request in flight (the learner's `get_variables`)."""

  def __init__(self, learner, stop: threading.Event):
    self._learner = learner
    self._latest = wait_unless_stopped(learner.future("get_variables"), stop)
    self._future = learner.future("get_variables")

  def get_variables(self):
    if self._future.done():
      self._latest = self._future.result()
      self._future = self._learner.future("get_variables")
    return self._latest
