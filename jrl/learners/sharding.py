"""Data-parallel sharding of the learner over a device mesh (pjit: jit + NamedSharding).

Parameters and optimiser state are replicated; a learner call's batches
`[U, B, ...]` are split along B over the mesh's `data` axis. The loss is a
mean over the global batch, so XLA inserts the gradient all-reduce and the
update equals the single-device one up to float summation order.
"""

import functools
from typing import Optional, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jrl.errors import ConfigError

DATA_AXIS = "data"


def make_mesh(num_devices: int = 0, devices: Optional[Sequence[jax.Device]] = None) -> Mesh:
  """A 1-D mesh over `num_devices` devices (0: all devices, of every process)."""
  devices = list(jax.devices() if devices is None else devices)
  if num_devices < 0 or num_devices > len(devices):
    raise ConfigError("learner_devices", f"must be in [0, {len(devices)}] (0 = all), got {num_devices}")
  if num_devices:
    devices = devices[:num_devices]
  return Mesh(np.asarray(devices), (DATA_AXIS,))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Splits axis 1 (B) of `[U, B, ...]` leaves over the data axis."""
  return NamedSharding(mesh, PartitionSpec(None, DATA_AXIS))


def check_batch_size(batch_size: int, mesh: Mesh) -> None:
  n = mesh.devices.size
  if batch_size % n:
    raise ConfigError("batch_size", f"must be divisible by the {n} learner devices, got {batch_size}")


def put_batch(batch, mesh: Mesh):
  """Places a host batch as arrays sharded over the mesh.

  With several processes each passes its own slice of the global batch (its
  rows of B, in process order); the result is the global array.
  """
  sharding = batch_sharding(mesh)
  if jax.process_count() == 1:
    return _placer(sharding)(batch)  # arrays already placed so pass through

  def place(x):
    if isinstance(x, jax.Array) and x.sharding == sharding:
      return x
    return jax.make_array_from_process_local_data(sharding, np.asarray(x))

  return jax.tree_util.tree_map(place, batch)


@functools.lru_cache(maxsize=None)
def _placer(sharding: NamedSharding):
  """A jitted identity that places its inputs with `sharding`: JAX's C++ dispatch moves
  host arrays onto the devices in ~30 us a batch, where `jax.device_put` walks each leaf
  in Python (~300 us for a learner batch on a 2-core host), the prefetch thread's
  largest cost after sampling."""
  return jax.jit(lambda batch: batch, in_shardings=sharding, out_shardings=sharding)


def local_copy(tree):
  """This process's first replica of replicated arrays: plain single-device arrays
  that actors and evaluators can use outside the mesh (no copy is made)."""
  return jax.tree_util.tree_map(lambda x: x.addressable_shards[0].data, tree)
