"""On-device replay (`--backend device`): windows that turn env steps into rows, and a ring
buffer of rows, all pure JAX. Which window a run uses is its item kind's choice
(`jrl.replay.kinds`: `ItemKind.device_init` and `device_add`); `jrl.run.device.loop` runs them.

n-step transitions. `NStepWindow` keeps the last n vector steps and, once full,
emits every step exactly one transition per env: the one that *starts* n - 1
steps earlier, summed up to n rewards and cut at the first episode end inside
the window (discount 0 on termination, gamma^k after k steps otherwise,
bootstrapping from the true final observation). This is the same set of
transitions as `jrl.replay.adders.NStepTransitionAdder` writes (one per env
step), each emitted n - 1 steps later and with a fixed shape, so it compiles.

Sequences (R2D2). `SequenceWindow` keeps the last `length` vector steps and every `period`
steps, once full, emits one `RecurrentSequence` per env with the core state its first step
began from: the sequences `jrl.replay.sequence_adder.OverlappingSequenceAdder` writes, at the
same steps, stored in a `Ring` of sequences (`[S, N, T, ...]`, counted in sequences).

Replay. `Ring` stores transitions (or sequences) as rows of one vector step, `[S, N, ...]`
(S = max_size // N slots, FIFO). A learner call draws `U x B` transitions,
each uniform over the stored ones, stratified by env: batch column b draws its
env from the group `[b N / B, (b + 1) N / B)` (one env, or B / N columns per
env) and a uniform slot. With the env axis and the batch axis both split over
the mesh's devices, every column's group lives on that column's device, so the
gather runs locally on each device (`make_gather`, a `shard_map`),
and the samples do not depend on the number of devices. Sampling is per transition
(no blocks: there is no per-call cost to amortise on device). Prioritized replay
draws over the whole buffer (inverse CDF of p^alpha) and gathers across devices.
"""

from typing import Any, NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.shard_map import shard_map
from jax.sharding import Mesh, PartitionSpec as P

from jrl.errors import ConfigError
from jrl.replay.sequence_adder import RecurrentSequence
from jrl.types import Transition


class NStepWindow(NamedTuple):
  """The last n vector steps, oldest first; leaves `[n, N, ...]`."""
  observation: jax.Array
  action: jax.Array
  reward: jax.Array       # [n, N] r_{t+1}
  terminated: jax.Array   # [n, N] bool
  done: jax.Array         # [n, N] bool: terminated or truncated
  next_observation: jax.Array  # [n, N, *obs] observation after the step (true final one at an end)
  steps: jax.Array        # [] int32 vector steps added (capped at n)


def window_init(n: int, obs: jax.Array, action: jax.Array) -> NStepWindow:
  zeros = lambda x: jnp.zeros((n,) + x.shape, x.dtype)
  num_envs = obs.shape[0]
  return NStepWindow(zeros(obs), zeros(action), jnp.zeros((n, num_envs), jnp.float32),
                     jnp.zeros((n, num_envs), bool), jnp.zeros((n, num_envs), bool), zeros(obs),
                     jnp.zeros((), jnp.int32))


def window_add(window: NStepWindow, obs, action, reward, terminated, truncated, next_obs,
               gamma: float) -> Tuple[NStepWindow, Transition, jax.Array]:
  """Adds one vector step; returns (window, transitions [N, ...] of the oldest step, valid [])."""
  n = window.reward.shape[0]
  push = lambda hist, new: jnp.concatenate([hist[1:], new[None].astype(hist.dtype)], axis=0)
  done = jnp.logical_or(terminated, truncated)
  window = NStepWindow(push(window.observation, obs), push(window.action, action), push(window.reward, reward),
                       push(window.terminated, terminated), push(window.done, done),
                       push(window.next_observation, next_obs), jnp.minimum(window.steps + 1, n))
  # alive[k]: no episode ended at steps 0 .. k-1 of the window.
  ended_before = jnp.cumsum(window.done.astype(jnp.int32), axis=0) - window.done.astype(jnp.int32)
  alive = (ended_before == 0).astype(jnp.float32)                      # [n, N]
  powers = jnp.asarray(gamma ** np.arange(n), jnp.float32)[:, None]    # [n, 1]
  reward_sum = jnp.sum(alive * powers * window.reward, axis=0)
  ends = jnp.logical_and(alive > 0, window.done)                       # [n, N] at most one per env
  any_end = ends.any(axis=0)
  last = jnp.where(any_end, jnp.argmax(ends, axis=0), n - 1)           # [N] index of the last step used
  index = last.reshape((1, -1) + (1,) * (window.next_observation.ndim - 2))
  bootstrap = jnp.take_along_axis(window.next_observation, index, axis=0)[0]
  terminated_at_end = jnp.take_along_axis(window.terminated, last[None], axis=0)[0]
  discount = jnp.where(any_end & terminated_at_end, 0.0, jnp.asarray(gamma, jnp.float32) ** (last + 1))
  transitions = Transition(window.observation[0], window.action[0], reward_sum,
                           discount.astype(jnp.float32), bootstrap)
  return window, transitions, window.steps >= n


class SequenceWindow(NamedTuple):
  """The last `length` vector steps, oldest first; leaves `[T, N, ...]` as RecurrentSequence's
  fields (start_state: the core state each step began from, `[T, N, S]`)."""
  steps: RecurrentSequence
  added: jax.Array  # [] int32 vector steps added


def sequence_window_init(length: int, obs: jax.Array, action: jax.Array, start_state: jax.Array) -> SequenceWindow:
  zeros = lambda x: jnp.zeros((length,) + x.shape, x.dtype)
  scalars = jnp.zeros((length, obs.shape[0]), jnp.float32)
  return SequenceWindow(RecurrentSequence(zeros(obs), zeros(action), scalars, scalars, scalars, zeros(obs),
                                          zeros(start_state)), jnp.zeros((), jnp.int32))


def sequence_window_add(window: SequenceWindow, obs, action, reward, terminated, truncated, next_obs,
                        start_state, period: int) -> Tuple[SequenceWindow, RecurrentSequence, jax.Array]:
  """Adds one vector step; returns (window, the sequences [N, T, ...] of the last T steps,
  whether they are due: T steps in, then every `period` steps)."""
  length = window.steps.reward.shape[0]
  push = lambda hist, new: jnp.concatenate([hist[1:], new[None].astype(hist.dtype)], axis=0)
  done = jnp.logical_or(terminated, truncated)
  step = RecurrentSequence(obs, action, reward, 1.0 - terminated.astype(jnp.float32), done.astype(jnp.float32),
                           next_obs, start_state)
  window = SequenceWindow(jax.tree_util.tree_map(push, window.steps, step), window.added + 1)
  sequences = jax.tree_util.tree_map(lambda x: jnp.swapaxes(x, 0, 1), window.steps)  # [N, T, ...]
  sequences = sequences._replace(start_state=sequences.start_state[:, 0])
  due = jnp.logical_and(window.added >= length, (window.added - length) % period == 0)
  return window, sequences, due


def sequences_written(vector_steps, num_envs: int, length: int, period: int):
  """Sequences a `SequenceWindow` has emitted after `vector_steps` steps (exact integers, for the
  host's learner-call schedule; an int, or an array for an array of step counts)."""
  if np.ndim(vector_steps) == 0:
    return 0 if vector_steps < length else num_envs * (1 + (vector_steps - length) // period)
  steps = np.asarray(vector_steps, np.int64)
  return np.where(steps < length, 0, num_envs * (1 + (steps - length) // period))


class Ring(NamedTuple):
  """FIFO replay of transition rows; leaves `[S, N, ...]`."""
  data: Any       # Transition or RecurrentSequence, leaves [S, N, ...]
  rows: jax.Array  # [] int32 rows inserted so far
  priority: Optional[jax.Array] = None  # [S, N] float32 (prioritized replay), else None


# New transitions enter with the priority the host's BlockWriter gives new items.
INITIAL_PRIORITY = 1.0


def ring_init(example: Any, slots: int, prioritized: bool = False) -> Ring:
  """`example`: transitions (or sequences) [N, ...] of one vector step."""
  num_envs = jax.tree_util.tree_leaves(example)[0].shape[0]
  return Ring(jax.tree_util.tree_map(lambda x: jnp.zeros((slots,) + x.shape, x.dtype), example),
              jnp.zeros((), jnp.int32), jnp.zeros((slots, num_envs), jnp.float32) if prioritized else None)


def ring_insert(ring: Ring, row: Any, valid: jax.Array) -> Ring:
  """Writes `row` (transitions or sequences of one vector step) at the next slot when `valid`;
  otherwise the ring is left as it was (a full ring's oldest row stays readable)."""
  slots = jax.tree_util.tree_leaves(ring.data)[0].shape[0]
  slot = ring.rows % slots

  def put(store, x):
    new = jnp.where(valid, x.astype(store.dtype), jax.lax.dynamic_index_in_dim(store, slot, 0, keepdims=False))
    return jax.lax.dynamic_update_index_in_dim(store, new, slot, 0)

  data = jax.tree_util.tree_map(put, ring.data, row)
  priority = ring.priority
  if priority is not None:
    priority = put(priority, jnp.full(priority.shape[1:], INITIAL_PRIORITY, jnp.float32))
  return Ring(data, ring.rows + valid.astype(jnp.int32), priority)


def sample_prioritized(key: jax.Array, ring: Ring, lead: Tuple[int, int], priority_exponent: float,
                       importance_exponent: float) -> Tuple[jax.Array, jax.Array, jax.Array]:
  """(slot, env, weights) [U, B]: transitions drawn with probability p^alpha / sum p^alpha over the
  stored ones (inverse CDF), and importance weights (size * P)^-beta normalised per batch, as
  the seeded buffer and Reverb's prioritized sampler do, per transition instead of per block."""
  slots, num_envs = ring.priority.shape
  filled = jnp.minimum(ring.rows, slots)
  stored = (jnp.arange(slots) < filled)[:, None]
  p = jnp.where(stored, ring.priority ** priority_exponent, 0.0).reshape(-1)
  cdf = jnp.cumsum(p)
  total = cdf[-1]
  flat = jnp.searchsorted(cdf, jax.random.uniform(key, lead) * total, side="right")
  flat = jnp.clip(flat, 0, slots * num_envs - 1)
  probability = p[flat] / total
  weights = (jnp.maximum(filled * num_envs, 1) * probability) ** (-importance_exponent)
  weights = weights / jnp.max(weights, axis=1, keepdims=True)
  return flat // num_envs, flat % num_envs, weights.astype(jnp.float32)


def update_priorities(ring: Ring, slot: jax.Array, env: jax.Array, td_abs: jax.Array) -> Ring:
  """New priorities |TD| of the sampled transitions (the largest where one was drawn twice)."""
  priority = ring.priority.at[slot, env].set(0.0).at[slot, env].max(td_abs.astype(jnp.float32))
  return ring._replace(priority=priority)


def check_sizes(num_envs: int, batch_size: int, num_devices: int) -> None:
  if num_envs % num_devices:
    raise ConfigError("num_envs", f"must be divisible by the {num_devices} learner devices, got {num_envs}")
  if num_envs % batch_size and batch_size % num_envs:
    raise ConfigError("num_envs", f"and batch_size must divide one another on the device backend (each batch "
                                  f"column samples its own group of envs), got {num_envs} and {batch_size}")


def sample_indices(key: jax.Array, ring: Ring, lead: Tuple[int, int], num_envs: int) -> Tuple[jax.Array, jax.Array]:
  """(slot [U, B], env [U, B]): uniform slots among those filled, envs stratified by column."""
  updates, batch = lead
  slots = jax.tree_util.tree_leaves(ring.data)[0].shape[0]
  filled = jnp.maximum(jnp.minimum(ring.rows, slots), 1)
  slot_key, env_key = jax.random.split(key)
  slot = jax.random.randint(slot_key, lead, 0, filled)
  group = max(1, num_envs // batch)                          # envs per column
  first = (np.arange(batch) * num_envs) // batch             # [B] first env of each column's group
  env = jnp.asarray(first, jnp.int32)[None] + jax.random.randint(env_key, lead, 0, group)
  return slot, env


def make_gather(mesh: Mesh, num_envs: int):
  """gather(ring_data [S, N, ...], slot [U, B], env [U, B]) -> Transition [U, B, ...], local to each device.

  `mesh` is the learner's 1-D mesh (`jrl.learners.sharding.make_mesh`): its one axis splits the
  ring's env axis and the batch columns alike, so each device reads only its own envs' rows."""
  (axis,) = mesh.axis_names
  local_envs = num_envs // mesh.devices.size

  def local(data, slot, env):
    env = env - jax.lax.axis_index(axis) * local_envs
    return jax.tree_util.tree_map(lambda x: x[slot, env], data)

  def gather(data, slot, env):
    data_spec = jax.tree_util.tree_map(lambda _: P(None, axis), data)
    return shard_map(local, mesh=mesh, in_specs=(data_spec, P(None, axis), P(None, axis)),
                     out_specs=data_spec, check_rep=False)(data, slot, env)

  return gather
