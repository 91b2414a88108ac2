"""Variable source and client: how actors get parameters from a learner."""

from typing import Any, Protocol, Tuple


class VariableSource(Protocol):
  def get_variables(self) -> Tuple[Any, int]:
    """Returns (params, version); the version increases with every learner call."""


class VariableClient:
  """Pulls parameters from a source every `update_period` calls to `maybe_update`."""

  def __init__(self, source: VariableSource, update_period: int = 1):
    self._source = source
    self._period = max(1, update_period)
    self._calls = 0
    self.params, self.version = source.get_variables()

  def maybe_update(self) -> None:
    self._calls += 1
    if self._calls >= self._period:
      self._calls = 0
      self.update()

  def update(self) -> None:
    self.params, self.version = self._source.get_variables()
