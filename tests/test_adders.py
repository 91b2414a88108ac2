"""The n-step adder against a hand-computed trajectory, and block writing."""

import numpy as np
import pytest

from jrl.replay.adders import BlockWriter, NStepTransitionAdder
from jrl.types import Transition

GAMMA = 0.9


def _step(adder, obs, action, reward, terminated, truncated, next_obs):
  return adder.add(np.array(obs, np.float32)[:, None], np.array(action, np.int32), np.array(reward, np.float32),
                   np.array(terminated), np.array(truncated), np.array(next_obs, np.float32)[:, None])


def _rows(t: Transition):
  return sorted((float(o[0]), int(a), round(float(r), 5), round(float(d), 5), float(n[0]))
                for o, a, r, d, n in zip(*t))


def test_n_step_returns_discounts_and_bootstraps_across_termination_and_truncation():
  # Env 0: obs 10,11,12,13 with rewards 1,2,3,4; terminates on the 4th step (final obs 99).
  # Env 1: obs 20,21 with rewards 1,1; truncated on the 2nd step (final obs 77); then a new
  #        episode 30,31,32 with rewards 1,1,1 (next obs 33).
  adder = NStepTransitionAdder(num_envs=2, n_step=3, discount=GAMMA)
  out0 = _step(adder, [10, 20], [0, 1], [1, 1], [False, False], [False, False], [11, 21])
  out1 = _step(adder, [11, 21], [1, 0], [2, 1], [False, False], [False, True], [12, 77])
  out2 = _step(adder, [12, 30], [0, 1], [3, 1], [False, False], [False, False], [13, 31])
  out3 = _step(adder, [13, 31], [1, 0], [4, 1], [True, False], [False, False], [99, 32])
  out4 = _step(adder, [40, 32], [0, 1], [1, 1], [False, False], [False, False], [41, 33])

  assert _rows(out0) == []
  # Truncation: bootstrap from the final observation with gamma^k.
  assert _rows(out1) == [(20.0, 1, 1.9, 0.81, 77.0), (21.0, 0, 1.0, 0.9, 77.0)]
  # Env 0's first full window: 1 + .9*2 + .81*3, gamma^3.
  assert _rows(out2) == [(10.0, 0, 5.23, 0.729, 13.0)]
  # Termination: every pending window flushed, no bootstrap (discount 0).
  assert _rows(out3) == [(11.0, 1, 7.94, 0.0, 99.0), (12.0, 0, 6.6, 0.0, 99.0), (13.0, 1, 4.0, 0.0, 99.0)]
  # Env 1's second episode: no transition spans the truncation boundary.
  assert _rows(out4) == [(30.0, 1, 2.71, 0.729, 33.0)]


def test_one_step_adder_is_plain_transitions():
  adder = NStepTransitionAdder(num_envs=1, n_step=1, discount=GAMMA)
  out = _step(adder, [1], [0], [5], [False], [False], [2])
  assert _rows(out) == [(1.0, 0, 5.0, 0.9, 2.0)]
  out = _step(adder, [2], [1], [7], [True], [False], [3])
  assert _rows(out) == [(2.0, 1, 7.0, 0.0, 3.0)]


def test_rejects_non_positive_n_step():
  with pytest.raises(ValueError, match="n_step"):
    NStepTransitionAdder(num_envs=1, n_step=0, discount=GAMMA)


class _ListWriter:
  def __init__(self):
    self.blocks = []

  def insert(self, block, priority):
    self.blocks.append((block, priority))


def test_block_writer_writes_exact_blocks_in_order_and_keeps_the_rest():
  sink = _ListWriter()
  writer = BlockWriter(sink, block_size=4, initial_priority=2.0)

  def transitions(start, count):
    x = np.arange(start, start + count, dtype=np.float32)
    return Transition(x[:, None], x.astype(np.int32), x, x, x[:, None])

  writer.add(transitions(0, 3))
  assert sink.blocks == []
  writer.add(transitions(3, 6))  # 9 staged -> two blocks, one left over
  assert [list(b.reward) for b, _ in sink.blocks] == [[0, 1, 2, 3], [4, 5, 6, 7]]
  assert all(p == 2.0 for _, p in sink.blocks)
  assert writer.transitions_written == 8
  writer.add(transitions(9, 3))
  assert list(sink.blocks[-1][0].reward) == [8, 9, 10, 11]
  assert sink.blocks[-1][0].observation.shape == (4, 1)



class _ReferenceNStepAdder:
  """The straightforward adder this module had before its fast paths (every step masked and concatenated)."""

  def __init__(self, num_envs: int, n_step: int, discount: float):
    if n_step < 1:
      raise ValueError(f"n_step must be >= 1, got {n_step}")
    self._n = n_step
    self._gamma = float(discount)
    self._num_envs = num_envs
    self._count = np.zeros(num_envs, np.int64)  # valid steps in the window, <= n
    self._obs = None  # [n, E, *obs] oldest first
    self._act = None  # [n, E, *act]
    self._rew = np.zeros((n_step, num_envs), np.float32)
    self._powers = self._gamma ** np.arange(n_step, dtype=np.float64)

  def add(self, obs, action, reward, terminated, truncated, next_obs, extras=None) -> Transition:
    obs, action = np.asarray(obs), np.asarray(action)
    if self._obs is None:
      self._obs = np.zeros((self._n,) + obs.shape, obs.dtype)
      self._act = np.zeros((self._n,) + action.shape, action.dtype)
    for hist, new in ((self._obs, obs), (self._act, action), (self._rew, reward)):
      hist[:-1] = hist[1:]
      hist[-1] = new
    self._count = np.minimum(self._count + 1, self._n)
    done = np.logical_or(terminated, truncated)

    parts = []
    full = (self._count == self._n) & ~done
    if full.any():
      returns = (self._powers[:, None] * self._rew).sum(0).astype(np.float32)
      parts.append(Transition(self._obs[0, full], self._act[0, full], returns[full],
                              np.full(int(full.sum()), self._gamma ** self._n, np.float32),
                              np.asarray(next_obs)[full]))
    for env in np.flatnonzero(done):
      parts.append(self._flush(env, bool(terminated[env]), np.asarray(next_obs)[env]))
      self._count[env] = 0
    return Transition(*[np.concatenate(c) for c in zip(*parts)]) if parts else None

  def _flush(self, env: int, terminated: bool, final_obs: np.ndarray) -> Transition:
    count = int(self._count[env])
    starts = range(self._n - count, self._n)
    rewards = self._rew[:, env].astype(np.float64)
    returns, discounts = [], []
    for s in starts:
      horizon = self._n - s
      returns.append((self._powers[:horizon] * rewards[s:]).sum())
      discounts.append(0.0 if terminated else self._gamma ** horizon)
    return Transition(self._obs[self._n - count:, env], self._act[self._n - count:, env],
                      np.asarray(returns, np.float32), np.asarray(discounts, np.float32),
                      np.repeat(final_obs[None], count, axis=0))


@pytest.mark.parametrize("n_step", [1, 3, 5])
def test_adder_fast_paths_store_exactly_what_the_plain_adder_stored(n_step):
  """A random stream with terminations and truncations: the same transitions, in the same
  order, to the byte; and no returned array is overwritten by later steps."""
  rng = np.random.default_rng(n_step)
  num_envs = 5
  fast, ref = NStepTransitionAdder(num_envs, n_step, GAMMA), _ReferenceNStepAdder(num_envs, n_step, GAMMA)
  obs = rng.normal(size=(num_envs, 3)).astype(np.float32)
  outputs, copies = [], []
  for t in range(400):
    action = rng.integers(0, 4, num_envs).astype(np.int32)
    reward = rng.normal(size=num_envs).astype(np.float32)
    ends = t % 40 >= 30  # stretches of episode ends (every env in its steady state otherwise)
    terminated = rng.random(num_envs) < (0.2 if ends else 0.0)
    truncated = ~terminated & (rng.random(num_envs) < (0.1 if ends else 0.0))
    next_obs = rng.normal(size=(num_envs, 3)).astype(np.float32)
    got = fast.add(obs, action, reward, terminated, truncated, next_obs)
    want = ref.add(obs, action, reward, terminated, truncated, next_obs)
    if want is None:
      assert len(got.reward) == 0
    else:
      for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert g.tobytes() == w.tobytes()
      outputs.append(got)
      copies.append([np.copy(x) for x in got])
    obs = next_obs
  assert sum(len(o.reward) for o in outputs) > 1500
  for out, saved in zip(outputs, copies):  # nothing handed out was changed afterwards
    for x, y in zip(out, saved):
      assert x.tobytes() == y.tobytes()


def test_adder_continues_exactly_after_pickling():
  import pickle
  rng = np.random.default_rng(5)
  a, b = NStepTransitionAdder(3, 3, GAMMA), None
  obs = rng.normal(size=(3, 2)).astype(np.float32)
  for t in range(40):
    if t == 20:
      b = pickle.loads(pickle.dumps(a))
    step = (obs, rng.integers(0, 2, 3).astype(np.int32), rng.normal(size=3).astype(np.float32),
            rng.random(3) < 0.1, np.zeros(3, bool), rng.normal(size=(3, 2)).astype(np.float32))
    got = a.add(*step)
    if b is not None:
      assert all(x.tobytes() == y.tobytes() for x, y in zip(got, b.add(*step)))
    obs = step[-1]
