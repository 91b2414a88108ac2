"""Replay: the seeded buffer, batch assembly, priorities and a real Reverb server."""

import numpy as np
import pytest

from jrl.replay.adders import BlockWriter
from jrl.replay.batches import PrefetchIterator, assemble, item_priorities, items_per_call
from jrl.replay.buffer import SampledItems, SeededReplayBuffer
from jrl.replay.spec import ReplaySpec
from jrl.types import Transition

BLOCK = 4


def _block(first: int, block=BLOCK) -> Transition:
  x = np.arange(first, first + block, dtype=np.float32)
  return Transition(np.stack([x, -x], 1), x.astype(np.int32), x, np.full(block, 0.5, np.float32), np.stack([x + 1, -x], 1))


def test_seeded_buffer_same_seed_same_samples_and_fifo_eviction():
  spec = ReplaySpec(block_size=BLOCK, max_size=5 * BLOCK, min_size=BLOCK)
  a, b = SeededReplayBuffer(spec, seed=3), SeededReplayBuffer(spec, seed=3)
  for i in range(7):
    a.insert(_block(10 * i), 1.0)
    b.insert(_block(10 * i), 1.0)
  sa, sb = a.sample(32), b.sample(32)
  np.testing.assert_array_equal(sa.keys, sb.keys)
  np.testing.assert_array_equal(sa.data.reward, sb.data.reward)
  assert a.size == 5 and sa.table_size == 5
  # Items 0 and 1 were evicted; keys 2..6 remain and each key's data is its own block.
  assert set(sa.keys.tolist()) <= {2, 3, 4, 5, 6}
  for key, rewards in zip(sa.keys, sa.data.reward):
    np.testing.assert_array_equal(rewards, _block(10 * int(key)).reward)
  np.testing.assert_allclose(sa.probabilities, 0.2)


def test_seeded_buffer_prioritized_probabilities_and_updates():
  spec = ReplaySpec(block_size=BLOCK, max_size=3 * BLOCK, min_size=BLOCK, prioritized=True, priority_exponent=0.5)
  buffer = SeededReplayBuffer(spec, seed=0)
  for i, p in enumerate([1.0, 4.0, 16.0]):
    buffer.insert(_block(i), p)
  sample = buffer.sample(2000)
  expected = {0: 1 / 7, 1: 2 / 7, 2: 4 / 7}  # p^0.5 normalised
  for key, prob in zip(sample.keys, sample.probabilities):
    assert prob == pytest.approx(expected[int(key)])
  freq = np.bincount(sample.keys.astype(int), minlength=3) / 2000
  np.testing.assert_allclose(freq, [1 / 7, 2 / 7, 4 / 7], atol=0.04)
  buffer.update_priorities({0: 0.0, 1: 0.0, 2: 9.0})
  assert set(buffer.sample(50).keys.tolist()) == {2}
  buffer.insert(_block(3), 1.0)  # evicts key 0; an update of it is ignored
  buffer.update_priorities({0: 100.0})
  assert 0 not in set(buffer.sample(200).keys.tolist())


def test_assemble_deals_every_transition_once_with_importance_weights():
  data = Transition(*[np.stack([x, x + 100]) for x in _block(0)])  # two items of 4
  sampled = SampledItems(np.array([7, 9], np.uint64), np.array([0.1, 0.4]), 10, data)
  prepared = assemble(sampled, updates_per_call=2, batch_size=4, importance_exponent=0.5,
                      rng=np.random.default_rng(0))
  assert prepared.batch.transitions.reward.shape == (2, 4)
  assert sorted(prepared.batch.transitions.reward.reshape(-1).tolist()) == [0, 1, 2, 3, 100, 101, 102, 103]
  # Each transition keeps its own fields together, and knows its item.
  t = prepared.batch.transitions
  np.testing.assert_array_equal(t.next_observation[..., 0], t.observation[..., 0] + 1)
  np.testing.assert_array_equal(prepared.item_index, (t.reward >= 100).astype(int))
  # w = (N P)^-beta / max: item 0 -> 1^-0.5 = 1, item 1 -> 4^-0.5 = 0.5 (normalised per batch).
  raw = np.where(prepared.item_index == 0, 1.0, 0.5)
  np.testing.assert_allclose(prepared.batch.weights, raw / raw.max(axis=1, keepdims=True))
  assert items_per_call(4, 128, 8) == 64 and items_per_call(1, 10, 4) == 3


def test_item_priorities_mix_max_and_mean():
  keys = np.array([5, 6, 7], np.uint64)
  index = np.array([[0, 0, 1], [1, 1, 0]])
  td = np.array([[1.0, 3.0, 2.0], [2.0, 8.0, 2.0]])
  priorities = item_priorities(td, keys, index)
  assert priorities == {5: pytest.approx(0.9 * 3 + 0.1 * 2), 6: pytest.approx(0.9 * 8 + 0.1 * 4)}


def test_prefetch_iterator_hands_over_producer_errors():
  calls = []

  def produce():
    calls.append(1)
    if len(calls) > 2:
      raise ValueError("server gone")
    return len(calls)

  it = PrefetchIterator(produce, depth=1)
  assert next(it) == 1 and next(it) == 2
  with pytest.raises(RuntimeError, match="replay sampling failed: server gone"):
    next(it)
  it.close()


@pytest.fixture
def reverb_server():
  from jrl.replay import reverb_replay
  spec = ReplaySpec(block_size=BLOCK, max_size=100 * BLOCK, min_size=2 * BLOCK, samples_per_insert=1000.0,
                    prioritized=True, priority_exponent=1.0)
  signature = reverb_replay.item_signature(_block(0))
  server = reverb_replay.start_server([reverb_replay.make_table(spec, signature, error_buffer_items=10_000)])
  yield server
  server.stop()


@pytest.mark.needs_reverb
def test_reverb_round_trip_blocks_keys_and_priorities(reverb_server):
  from jrl.replay import reverb_replay
  address = f"localhost:{reverb_server.port}"
  client = reverb_replay.reverb.Client(address)
  writer = reverb_replay.ReverbItemWriter(client)
  blocks = BlockWriter(writer, BLOCK)
  for i in range(3):
    blocks.add(_block(100 * i))
  assert writer.items_inserted == 3
  writer.flush()
  info = client.server_info()[reverb_replay.TABLE]
  assert info.current_size == 3

  sampler = reverb_replay.ReverbItemSampler(address, 30, _block(0))
  sample = sampler.sample()
  assert sample.data.observation.shape == (30, BLOCK, 2) and sample.data.reward.dtype == np.float32
  assert sample.table_size == 3
  np.testing.assert_allclose(sample.probabilities, 1 / 3)
  first_by_key = {}
  for key, rewards, obs in zip(sample.keys, sample.data.reward, sample.data.observation):
    np.testing.assert_array_equal(rewards, _block(int(rewards[0])).reward)
    np.testing.assert_array_equal(obs, _block(int(rewards[0])).observation)
    assert first_by_key.setdefault(int(key), rewards[0]) == rewards[0]  # one key, one item
  # 30 uniform draws over 3 items miss one with probability ~1.5e-5.
  assert sorted(first_by_key.values()) == [0, 100, 200]

  # Priority 0 for all but the item starting at 200: only it is sampled afterwards.
  chosen = next(k for k, r in first_by_key.items() if r == 200)
  reverb_replay.ReverbReplayClient(client).update_priorities({k: (5.0 if k == chosen else 0.0) for k in first_by_key})
  later = reverb_replay.ReverbItemSampler(address, 20, _block(0)).sample()
  assert set(later.keys.tolist()) == {chosen}
  np.testing.assert_allclose(later.probabilities, 1.0)
  writer.close()


@pytest.mark.needs_reverb
def test_reverb_writer_keeps_nested_items_field_by_field():
  """Sequences with extras (a dict: columns in sorted-key order, as the table's signature)
  come back from Reverb exactly as written, whatever the dtypes and shapes of the fields."""
  from jrl.replay import reverb_replay
  from jrl.types import Trajectory

  def sequence(i: int) -> Trajectory:
    t = np.arange(5, dtype=np.float32) + 10 * i
    return Trajectory(np.stack([t, -t, t * 2], 1), (t % 3).astype(np.int32), t / 7, np.ones(5, np.float32),
                      (t % 2).astype(np.float32), np.stack([t + 1, -t, t], 1),
                      {"zeta": np.stack([t, t + 0.5], 1), "alpha": t.astype(np.float64) * 3})

  spec = ReplaySpec(block_size=1, max_size=10, min_size=1, sequence_length=5)
  server = reverb_replay.start_server([reverb_replay.make_table(spec, reverb_replay.item_signature(sequence(0)), 0)])
  address = f"localhost:{server.port}"
  writer = reverb_replay.ReverbItemWriter(reverb_replay.reverb.Client(address))
  blocks = BlockWriter(writer, 1, squeeze=True)
  blocks.add(jax_stack([sequence(i) for i in range(3)]))
  writer.flush()
  sample = reverb_replay.ReverbItemSampler(address, 3, sequence(0)).sample()  # a queue: FIFO order
  for i in range(3):
    want = sequence(i)
    got = Trajectory(*[x[i] if not isinstance(x, dict) else {k: v[i] for k, v in x.items()} for x in sample.data])
    for w, g in zip(want[:-1], got[:-1]):
      assert g.dtype == w.dtype
      np.testing.assert_array_equal(g, w)
    assert got.extras["alpha"].dtype == np.float64
    np.testing.assert_array_equal(got.extras["alpha"], want.extras["alpha"])
    np.testing.assert_array_equal(got.extras["zeta"], want.extras["zeta"])
  writer.close()
  server.stop()


def jax_stack(items):
  import jax
  return jax.tree_util.tree_map(lambda *xs: np.stack(xs), *items)
