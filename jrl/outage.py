"""A client's view of a lost service: waited out for a while, reported once per interval."""

import time
from typing import Callable, Optional

LOG_EVERY_SECONDS = 10.0


class ServiceLost(RuntimeError):
  """A service stayed unreachable past the client's deadline."""


class Outage:
  """Tracks one service's outage as one client sees it.

  `failing(reason)` while the service does not answer: logs when the outage
  begins, then once per `log_every_s` (not once per failed call), and raises
  ServiceLost once it has lasted `deadline_s`. `ok()` when it answers again:
  logs how long it was gone.
  """

  def __init__(self, service: str, deadline_s: float, log: Callable[[str], None] = print,
               log_every_s: float = LOG_EVERY_SECONDS):
    self.service, self._deadline_s, self._log, self._log_every_s = service, deadline_s, log, log_every_s
    self.since: Optional[float] = None
    self._last_log = 0.0

  def failing(self, reason: str, since: Optional[float] = None) -> None:
    """The service failed to answer (`since`: when the unanswered request began)."""
    now = time.monotonic()
    if self.since is None:
      self.since, self._last_log = (now if since is None else since), now
      self._log(f"{self.service} lost ({reason}); retrying for up to {self._deadline_s:g}s")
    elif now - self._last_log >= self._log_every_s:
      self._last_log = now
      self._log(f"{self.service} still lost after {now - self.since:.0f}s ({reason})")
    if now - self.since >= self._deadline_s:
      raise ServiceLost(f"{self.service} lost for {now - self.since:.0f}s ({reason}); gave up after "
                        f"service_deadline_seconds={self._deadline_s:g}")

  def ok(self) -> None:
    if self.since is not None:
      self._log(f"{self.service} back after {time.monotonic() - self.since:.1f}s")
      self.since = None
