"""Overlapping sequences with the recurrent state at their start (R2D2's replay items);
their learner batches are `jrl.replay.batches.assemble_sequence_batches`.

Pure numpy and independent of the replay backend, like `jrl.replay.adders`.
"""

import collections
from typing import Any, Dict, NamedTuple, Optional

import jax.numpy as jnp
import numpy as np

from jrl.types import Array

# The extras key under which a recurrent policy reports, for each env, the core state it
# started the step from (after the reset at an episode start), flattened to [B, S].
START_STATE_KEY = "core_state"


class RecurrentSequence(NamedTuple):
  """`T` consecutive steps of one env and the core state the policy had at the first.

  Fields `[T, ...]` (stacked: `[B, T, ...]`) as in `jrl.types.Trajectory`; episodes may
  end inside: `end_of_episode[t]` marks the step that ended one (its `next_observation`
  is the true final observation) and step t + 1 starts the next with a fresh core state.
  """
  observation: Array       # [T, *obs_shape]
  action: Array            # [T, *action_shape]
  reward: Array            # [T] r_{t+1}
  discount: Array          # [T] 0 where the episode terminated at this step, else 1
  end_of_episode: Array    # [T] 1 where the episode ended here (terminated or truncated)
  next_observation: Array  # [T, *obs_shape]
  start_state: Array       # [S] the policy's core state at step 0


def is_first(end_of_episode: Array) -> Array:
  """[T, ...] True where a new episode starts inside the sequence (after an end), False at
  step 0: the stored start state is already the state step 0 began from."""
  ended = jnp.asarray(end_of_episode) > 0
  return jnp.concatenate([jnp.zeros_like(ended[:1]), ended[:-1]])


def example_sequence(observation: np.ndarray, action: np.ndarray, start_state: np.ndarray,
                     length: int) -> RecurrentSequence:
  """Zeros shaped like one item (for table signatures), from one step's observation, action
  and start state."""
  stack = lambda x: np.zeros((length,) + np.shape(x), np.asarray(x).dtype)
  scalar = np.float32(0)
  return RecurrentSequence(stack(observation), stack(action), stack(scalar), stack(scalar), stack(scalar),
                           stack(observation), np.zeros(np.shape(start_state), np.asarray(start_state).dtype))


class OverlappingSequenceAdder:
  """Sequences of `length` steps from a vector env, a new one every `period` steps per env.

  All envs step together, so every env completes a sequence at the same steps: the first
  after `length` steps, then every `period` steps (consecutive sequences share
  `length - period` steps). Sequences do not wait for episode ends (see RecurrentSequence).
  The policy's extras must hold START_STATE_KEY ([E, S]); the value at a sequence's
  first step is stored with it.
  """

  def __init__(self, num_envs: int, length: int, period: int):
    if length < 1 or not 1 <= period <= length:
      raise ValueError(f"need length >= 1 and 1 <= period <= length, got {length}, {period}")
    self._num_envs, self._length, self._period = num_envs, length, period
    self._steps: "collections.deque" = collections.deque(maxlen=length)
    self._count = 0  # vector steps added

  def add(self, obs, action, reward, terminated, truncated, next_obs,
          extras: Optional[Dict[str, np.ndarray]] = None) -> RecurrentSequence:
    """Adds one vector step; returns the sequences completed by it ([E, T, ...] or none)."""
    if not extras or START_STATE_KEY not in extras:
      raise ValueError(f"the policy reports no '{START_STATE_KEY}' in its extras: not a recurrent policy")
    self._steps.append((np.asarray(obs), np.asarray(action), np.asarray(reward, np.float32),
                        1.0 - np.asarray(terminated, np.float32),
                        np.logical_or(terminated, truncated).astype(np.float32), np.asarray(next_obs),
                        np.asarray(extras[START_STATE_KEY])))
    self._count += 1
    if self._count < self._length or (self._count - self._length) % self._period:
      return self._empty()
    fields = [np.stack(xs, axis=1) for xs in zip(*self._steps)]  # [E, T, ...]
    return RecurrentSequence(*fields[:6], start_state=fields[6][:, 0])

  def state(self) -> Dict[str, Any]:
    """The last `length` steps (each: observation, action, reward, discount, end of episode, next
    observation, start state, [E, ...]) and the vector steps added, as data."""
    return {"steps": list(self._steps), "count": self._count}

  def restore(self, state: Dict[str, Any]) -> None:
    """Continues from `state()` (an adder made with the same arguments)."""
    self._steps = collections.deque((tuple(step) for step in state["steps"]), maxlen=self._length)
    self._count = state["count"]

  def _empty(self) -> RecurrentSequence:
    first = self._steps[0]
    return RecurrentSequence(*[np.zeros((0, self._length) + x.shape[1:], x.dtype) for x in first[:6]],
                             start_state=np.zeros((0,) + first[6].shape[1:], first[6].dtype))
