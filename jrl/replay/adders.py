"""Adders: turn a vector env's steps into n-step transitions and replay blocks.

Pure numpy and independent of the replay backend: `NStepTransitionAdder`
emits transitions, `SequenceAdder` trajectories, `RewardClipAdder` clips rewards
before either sees them, and `BlockWriter` groups rows into fixed-size items for any
writer with `insert(block, priority)`. Which of them a run uses is its item kind's
choice (`jrl.replay.kinds`). What they hold between steps, `state()`, is data (arrays and plain
values, as a checkpoint keeps it); `restore(state)` continues from it.
"""

from typing import Any, Dict, List, Optional, Protocol

import jax
import numpy as np

from jrl.replay.frames import FramedRows
from jrl.types import Trajectory, Transition, as_named


def _concat(parts: List[Any]) -> Any:
  if type(parts[0]) is Transition:  # the hot path: flat fields, no tree walk
    return Transition(*[np.concatenate(column) for column in zip(*parts)])
  return jax.tree_util.tree_map(lambda *xs: np.concatenate(xs), *parts)


def _map(fn, tree: Any) -> Any:
  if type(tree) is Transition:  # the hot path: flat fields, no tree walk
    return Transition(*[fn(x) for x in tree])
  return jax.tree_util.tree_map(fn, tree)


def _rows(tree: Any, index) -> Any:
  return _map(lambda x: x[index], tree)


def _num_rows(tree: Any) -> int:
  if type(tree) is Transition:
    return len(tree.reward)
  return len(jax.tree_util.tree_leaves(tree)[0])


class NStepTransitionAdder:
  """n-step transitions from a vector env, episode boundaries handled.

  For a window of n steps starting at t the transition is
  (o_t, a_t, sum_{k<n} gamma^k r_{t+k+1}, gamma^n, o_{t+n}). When an episode
  ends inside the window the remaining windows are flushed with the true final
  observation: discount 0 on termination (no bootstrap), gamma^k on truncation
  (bootstrap from the final observation).

  This is the actor's hot path (every env step). The steady state, where every env has a
  full window and none ended, takes no masks and no gathers; every other step (episode
  ends, and the first n-1 steps) is one vectorised gather over envs and window starts,
  with no Python loop over envs: with short episodes, ends come nearly every vector step.
  Returns are float64 sums, oldest reward first, cast to float32.
  """

  def __init__(self, num_envs: int, n_step: int, discount: float):
    if n_step < 1:
      raise ValueError(f"n_step must be >= 1, got {n_step}")
    self._n = n_step
    self._gamma = float(discount)
    self._num_envs = num_envs
    self._count = np.zeros(num_envs, np.int64)  # valid steps in the window, <= n
    self._obs: Optional[np.ndarray] = None      # [n, E, *obs] oldest first
    self._act: Optional[np.ndarray] = None      # [n, E, *act]
    self._rew = np.zeros((n_step, num_envs), np.float32)
    self._powers = self._gamma ** np.arange(n_step, dtype=np.float64)
    self._set_tables()  # and `_all_full`: every env's window holds n steps

  def add(self, obs, action, reward, terminated, truncated, next_obs, extras=None) -> Transition:
    """Adds one vector step; returns the transitions completed by it (`extras` are not kept)."""
    obs, action = np.asarray(obs), np.asarray(action)
    if self._obs is None:
      self._obs = np.zeros((self._n,) + obs.shape, obs.dtype)
      self._act = np.zeros((self._n,) + action.shape, action.dtype)
    n = self._n
    for hist, new in ((self._obs, obs), (self._act, action), (self._rew, reward)):
      if n > 1:
        hist[:-1] = hist[1:]
      hist[-1] = new
    if not self._all_full:
      np.minimum(self._count + 1, n, out=self._count)
      self._all_full = bool(self._count.min() == n)
    done = np.logical_or(terminated, truncated)
    any_done = done.any()
    next_obs = np.asarray(next_obs)

    if self._all_full and not any_done:  # the steady state
      return Transition(self._obs[0].copy(), self._act[0].copy(), self._returns(),
                        np.full(self._num_envs, self._gamma ** n, np.float32), next_obs.copy())

    # Every other case in one gather: each full window whose env goes on (its oldest start),
    # then every window of each env whose episode ended (env by env, oldest start first),
    # which bootstraps from the true final observation.
    full = self._count == n
    if any_done:
      full &= ~done
    full_envs = np.flatnonzero(full)
    ended = np.flatnonzero(done) if any_done else full_envs[:0]
    counts = self._count[ended]
    envs = np.concatenate([full_envs, np.repeat(ended, counts)])
    starts = np.concatenate([np.zeros(len(full_envs), np.int64),
                             np.nonzero(self._starts[None, :] >= (n - counts)[:, None])[1]])
    transitions = Transition(self._obs[starts, envs], self._act[starts, envs],
                             self._window_returns()[starts, envs].astype(np.float32),
                             np.where(np.asarray(terminated)[envs], 0.0, self._horizon_discounts[n - starts])
                             .astype(np.float32),
                             next_obs[envs])
    if any_done:
      self._count[ended] = 0
      self._all_full = False
    return transitions

  def state(self) -> Dict[str, Any]:
    """The open windows, as data: steps in each env's window [E], and the last n steps' observations
    [n, E, ...], actions [n, E, ...] and rewards [n, E], oldest first (None before the first step)."""
    copy = lambda x: None if x is None else x.copy()
    return {"count": self._count.copy(), "obs": copy(self._obs), "act": copy(self._act), "rew": self._rew.copy()}

  def restore(self, state: Dict[str, Any]) -> None:
    """Continues from `state()` (an adder made with the same arguments)."""
    copy = lambda x: None if x is None else np.array(x)
    self._count, self._obs, self._act, self._rew = (copy(state[k]) for k in ("count", "obs", "act", "rew"))
    self._set_tables()

  def _set_tables(self) -> None:
    self._powers_column = self._powers[:, None]
    self._starts = np.arange(self._n)
    self._horizon_discounts = np.asarray([self._gamma ** h for h in range(self._n + 1)])
    self._all_full = bool(self._count.min() == self._n)

  def _returns(self) -> np.ndarray:
    """[E] discounted sums of every env's window (float64 sums, as float32)."""
    return (self._powers_column * self._rew).sum(0).astype(np.float32)

  def _window_returns(self) -> np.ndarray:
    """[n, E] float64: the discounted sum of rewards from start s to the window's end, for
    every start s; summed oldest reward first, as `_returns` sums a full window."""
    rewards = self._rew.astype(np.float64)
    sums = self._powers[0] * rewards
    for k in range(1, self._n):
      sums[:-k] += self._powers[k] * rewards[k:]
    return sums


class SequenceAdder:
  """Fixed-length trajectories from a vector env: every `length` steps, one per env.

  Sequences do not overlap and do not wait for episode ends; a boundary inside
  a sequence is marked by `end_of_episode` and `discount` (see Trajectory).
  """

  def __init__(self, num_envs: int, length: int):
    if length < 1:
      raise ValueError(f"sequence length must be >= 1, got {length}")
    self._num_envs, self._length = num_envs, length
    self._steps: List[Trajectory] = []

  def add(self, obs, action, reward, terminated, truncated, next_obs,
          extras: Optional[Dict[str, np.ndarray]] = None) -> Trajectory:
    """Adds one vector step; returns the sequences completed by it ([E, T, ...] or none)."""
    self._steps.append(Trajectory(
        np.asarray(obs), np.asarray(action), np.asarray(reward, np.float32),
        1.0 - np.asarray(terminated, np.float32), np.logical_or(terminated, truncated).astype(np.float32),
        np.asarray(next_obs), {k: np.asarray(v) for k, v in (extras or {}).items()}))
    if len(self._steps) < self._length:
      return _rows(jax.tree_util.tree_map(lambda x: x[None], self._steps[0]), slice(0, 0))
    sequences = jax.tree_util.tree_map(lambda *xs: np.stack(xs, axis=1), *self._steps)  # [E, T, ...]
    self._steps = []
    return sequences

  def state(self) -> Dict[str, Any]:
    """The steps of the sequences under way, as data."""
    return {"steps": list(self._steps)}

  def restore(self, state: Dict[str, Any]) -> None:
    """Continues from `state()`."""
    self._steps = [as_named(Trajectory, step) for step in state["steps"]]


class ItemWriter(Protocol):
  """Where items go: the seeded buffer, or Reverb. With frame sharing (`ReplaySpec.frame_stack`)
  also `add_frames(ids, frames)`: the frames rows will name (`jrl.replay.frames`)."""

  def insert(self, block: Any, priority: float) -> None:
    ...


class BlockWriter:
  """Stages rows (transitions, or whole sequences) and writes them as items of
  exactly `block_size` rows; a block of one sequence is written as that sequence."""

  def __init__(self, writer: ItemWriter, block_size: int, initial_priority: float = 1.0, squeeze: bool = False,
               row_type: Optional[type] = None):
    self._writer = writer
    self._row_type = row_type  # the NamedTuple of the rows staged: `restore` rebuilds them as such
    self._block_size = block_size
    self._priority = initial_priority
    self._squeeze = squeeze  # items are single rows: write row i, not rows [i:i+1]
    self._staged: List[Any] = []
    self._num_staged = 0
    self.transitions_written = 0  # rows written

  def add(self, rows: Any) -> None:
    if type(rows) is FramedRows:  # frames first, so that the writer has them before any item names them
      if len(rows.frame_ids):
        self._writer.add_frames(rows.frame_ids, rows.frames)
      rows = rows.rows
    n = _num_rows(rows)
    if n == 0:
      return
    self._staged.append(rows)
    self._num_staged += n
    if self._num_staged < self._block_size:
      return
    staged = self._staged[0] if len(self._staged) == 1 else _concat(self._staged)
    num_blocks = self._num_staged // self._block_size
    if num_blocks == 1 and self._num_staged == self._block_size and not self._squeeze:
      self._writer.insert(_map(np.ascontiguousarray, staged), self._priority)  # exactly one block: as it is
    else:
      for b in range(num_blocks):
        index = b if self._squeeze else slice(b * self._block_size, (b + 1) * self._block_size)
        self._writer.insert(_map(lambda x: np.ascontiguousarray(x[index]), staged), self._priority)
    used = num_blocks * self._block_size
    self.transitions_written += used
    rest = _rows(staged, slice(used, None))
    self._staged = [rest] if _num_rows(rest) else []
    self._num_staged -= used

  def drop_staged(self) -> None:
    """Forgets the rows waiting for a full block (they are not counted as written)."""
    self._staged, self._num_staged = [], 0

  def state(self) -> Dict[str, Any]:
    """The rows waiting for a full block and the counts, as data."""
    return {"staged": list(self._staged), "num_staged": self._num_staged, "written": self.transitions_written}

  def restore(self, state: Dict[str, Any]) -> None:
    rows = lambda saved: as_named(self._row_type, saved) if self._row_type is not None else saved
    self._staged, self._num_staged = [rows(saved) for saved in state["staged"]], state["num_staged"]
    self.transitions_written = state["written"]


class RewardClipAdder:
  """Clips each step's reward to [-bound, bound] before the wrapped adder sees it (so n-step
  sums add clipped rewards); the actor's episode returns stay the env's own."""

  def __init__(self, adder, bound: float):
    self.adder, self.bound = adder, float(bound)

  def add(self, obs, action, reward, *rest, **kwargs):
    return self.adder.add(obs, action, np.clip(reward, -self.bound, self.bound).astype(np.float32), *rest, **kwargs)

  def state(self) -> Any:
    """The wrapped adder's (clipping keeps nothing)."""
    return self.adder.state()

  def restore(self, state: Any) -> None:
    self.adder.restore(state)


def make_block_writer(spec, writer: ItemWriter) -> BlockWriter:
  """Items as the spec's item kind stores them (`spec` a `jrl.replay.spec.ReplaySpec`): blocks of
  `spec.block_size` transitions, or one sequence per item."""
  return spec.kind.make_block_writer(spec, writer)
