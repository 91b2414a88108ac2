"""On-device replay for the device loop: the windows and ring buffer live with the item kinds
(`jrl.replay.on_device`: n-step and sequence windows, the ring, its uniform and prioritized
sampling; `jrl.replay.kinds` says which a run uses); here, the gather that reads sampled rows
on each device of the learner mesh.
"""

import jax
from jax.experimental.shard_map import shard_map
from jax.sharding import Mesh, PartitionSpec as P

from jrl.learners.sharding import DATA_AXIS
from jrl.replay.on_device import (INITIAL_PRIORITY, NStepWindow, Ring, SequenceWindow, check_sizes, ring_init,
                                  ring_insert, sample_indices, sample_prioritized, sequence_window_add,
                                  sequence_window_init, sequences_written, update_priorities, window_add, window_init)

__all__ = ["INITIAL_PRIORITY", "NStepWindow", "Ring", "SequenceWindow", "check_sizes", "make_gather", "ring_init",
           "ring_insert", "sample_indices", "sample_prioritized", "sequence_window_add", "sequence_window_init",
           "sequences_written", "update_priorities", "window_add", "window_init"]


def make_gather(mesh: Mesh, num_envs: int):
  """gather(ring_data [S, N, ...], slot [U, B], env [U, B]) -> Transition [U, B, ...], local to each device."""
  local_envs = num_envs // mesh.devices.size

  def local(data, slot, env):
    env = env - jax.lax.axis_index(DATA_AXIS) * local_envs
    return jax.tree_util.tree_map(lambda x: x[slot, env], data)

  def gather(data, slot, env):
    data_spec = jax.tree_util.tree_map(lambda _: P(None, DATA_AXIS), data)
    out_spec = jax.tree_util.tree_map(lambda _: P(None, DATA_AXIS), data)
    return shard_map(local, mesh=mesh, in_specs=(data_spec, P(None, DATA_AXIS), P(None, DATA_AXIS)),
                     out_specs=out_spec, check_rep=False)(data, slot, env)

  return gather
