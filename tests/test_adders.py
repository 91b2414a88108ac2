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
