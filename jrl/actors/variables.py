"""Variable source and client: how actors and inference servers get parameters from a learner."""

from typing import Any, Optional, Protocol, Tuple

import jax


class VariableSource(Protocol):
  def get_variables(self) -> Tuple[Any, int]:
    """Returns (params, version); the version increases with every learner call."""


class VariableClient:
  """Pulls parameters from a source every `update_period` calls to `maybe_update`.

  `params` live on `device` (default: this process's first device) and are replaced only when the
  source reports a new version: a jitted policy then reads them in place, with no host to
  device copy per call (sources over RPC hand out numpy). Arrays already on that device
  are not copied.
  """

  def __init__(self, source: VariableSource, update_period: int = 1, device: Optional[jax.Device] = None):
    self._source = source
    self._period = max(1, update_period)
    self._calls = 0
    self._device = device if device is not None else jax.local_devices()[0]  # this process's, in a multi-process run
    self.version = -1
    self.params: Any = None
    self.copies = 0  # parameter sets placed on the device (one per new version)
    self.update()

  @property
  def device(self) -> jax.Device:
    return self._device

  def place_on(self, device: jax.Device) -> None:
    """Keeps `params` on `device` from now on: moved there now and put there at every refresh (an
    embedded run's policy acting on the CPU while the learner updates on a GPU: --actor_device)."""
    if device != self._device:
      self._device = device
      self.params = jax.device_put(self.params, device)

  def maybe_update(self) -> None:
    self._calls += 1
    if self._calls >= self._period:
      self._calls = 0
      self.update()

  def update(self) -> None:
    params, version = self._source.get_variables()
    if version != self.version or self.params is None:
      self.params = jax.device_put(params, self._device)
      self.version = version
      self.copies += 1
