"""jrl's own replay server (jrl.replay.service), which a program without Reverb (the Ray engine on the core
stack) serves: Reverb's rate limiter to the item (hand-worked, and against a real Reverb table where Reverb
is installed), the seeded buffer behind it, each writer's inserts in its order, the queue of trajectories,
priorities, frames, checkpoints; its writer and batches over a handle whose calls run on threads, as an
engine's do."""

import concurrent.futures
import threading

import numpy as np
import pytest

from jrl.experiment import checkpoint_formats
from jrl.replay.kinds import TrajectoryQueue
from jrl.replay.service import RateLimiter, ReplayServer, ServedReplayClient, table_limiter
from jrl.replay.spec import ReplaySpec
from jrl.types import Transition

BLOCK = 2


def _block(first: int) -> Transition:
  x = np.arange(first, first + BLOCK, dtype=np.float32)
  return Transition(x[:, None], x.astype(np.int32), x, np.full(BLOCK, 0.5, np.float32), x[:, None] + 1)


def _allowed(limiter: RateLimiter, inserts: int) -> int:
  """Items sampled one at a time after `inserts` inserts, until the limiter holds a sample."""
  for _ in range(inserts):
    assert limiter.can_insert(1)
    limiter.inserts += 1
  sampled = 0
  while limiter.can_sample(1):
    limiter.samples += 1
    sampled += 1
  return sampled


def test_the_rate_limiter_is_reverbs_sample_to_insert_ratio_worked_by_hand():
  # samples_per_insert 2, min size 3, error buffer 4: min_diff = 2 * 3 - 4 = 2, max_diff = 2 * 3 + 4 = 10.
  limiter = RateLimiter.sample_to_insert_ratio(2.0, 3, 4.0)
  assert (limiter.min_diff, limiter.max_diff) == (2.0, 10.0)
  assert _allowed(limiter, 2) == 0       # below the minimum size no sample passes
  limiter = RateLimiter.sample_to_insert_ratio(2.0, 3, 4.0)
  # At the minimum size (inserts - deletes = 3) a sample passes while 3 * 2 - samples - 1 >= 2.
  assert _allowed(limiter, 3) == 4       # s = 0, 1, 2, 3
  assert limiter.can_insert(2)           # (3 + 2) * 2 - 4 = 6 <= 10
  limiter.inserts += 2
  assert limiter.can_insert(2) and not limiter.can_insert(3)  # (5 + 3) * 2 - 4 = 12 > 10: sample first
  assert _allowed(limiter, 0) == 4       # 10 - s - 1 >= 2 for s = 4 .. 7
  # A queue of 3: samples only what was inserted, inserts only while fewer than 3 wait.
  queue = RateLimiter.queue(3)
  assert _allowed(queue, 3) == 3 and queue.can_insert(3) and not queue.can_insert(4)


def test_the_tables_limiter_is_the_reverb_tables_for_each_item_kind():
  spec = ReplaySpec(block_size=BLOCK, max_size=40, min_size=8, samples_per_insert=4.0)
  limiter = table_limiter(spec, error_buffer_items=10.0)
  assert (limiter.samples_per_insert, limiter.min_size) == (4.0, spec.min_items)
  assert (limiter.min_diff, limiter.max_diff) == (4.0 * spec.min_items - 10.0, 4.0 * spec.min_items + 10.0)
  # Reverb's least error buffer: 2 x max(1, samples_per_insert).
  assert table_limiter(spec, error_buffer_items=1.0).max_diff == 4.0 * spec.min_items + 8.0
  queue = table_limiter(ReplaySpec(kind=TrajectoryQueue(sequence_length=4), block_size=1, max_size=6, min_size=1), 0.0)
  assert (queue.min_diff, queue.max_diff, queue.min_size) == (0.0, 6.0, 1)  # Reverb's Queue(6)


@pytest.mark.needs_reverb
def test_the_rate_limiter_allows_what_a_reverb_table_allows():
  """The same inserts, then samples until one is held, on a real Reverb table and on RateLimiter: after
  each round the table's completed samples (its own count) are the limiter's."""
  from jrl import compat
  compat.import_reverb()
  import reverb
  import tensorflow as tf
  table = reverb.Table("t", reverb.selectors.Uniform(), reverb.selectors.Fifo(), 1000,
                       reverb.rate_limiters.SampleToInsertRatio(samples_per_insert=2.0, min_size_to_sample=3,
                                                                error_buffer=4.0),
                       signature=tf.TensorSpec((1,), tf.float32))
  server = reverb.Server([table])
  address = f"localhost:{server.port}"
  client = reverb.Client(address)
  limiter = RateLimiter.sample_to_insert_ratio(2.0, 3, 4.0)
  try:
    for inserts in (2, 1, 2, 1, 0):
      for i in range(inserts):
        client.insert(np.float32(i), {"t": 1.0})
      ours = limiter.samples + _allowed(limiter, inserts)
      dataset = reverb.TrajectoryDataset.from_table_signature(address, "t", max_in_flight_samples_per_worker=1,
                                                              rate_limiter_timeout_ms=300)
      try:
        for _ in dataset.as_numpy_iterator():
          pass
      except tf.errors.DeadlineExceededError:
        pass
      completed = client.server_info()["t"].rate_limiter_info.sample_stats.completed
      assert completed == ours, (inserts, completed, ours)
  finally:
    server.stop()


class ThreadHandle:
  """A `Handle` whose calls run on a pool of threads of this process, as an engine serves a node's methods."""

  def __init__(self, target, threads: int = 8):
    self._target, self._pool = target, concurrent.futures.ThreadPoolExecutor(threads)
    self.address = "in-process"

  def call(self, method, *args, **kwargs):
    return getattr(self._target, method)(*args, **kwargs)

  def future(self, method, *args, **kwargs):
    return self._pool.submit(getattr(self._target, method), *args, **kwargs)


def _server(spec, error_buffer=100.0, restore_from=None):
  return ReplayServer(spec, error_buffer, seed=0, write=checkpoint_formats.write, read=checkpoint_formats.read,
                      restore_from=restore_from)


def test_each_writers_inserts_are_applied_in_the_order_it_sent_them():
  server = _server(ReplaySpec(block_size=BLOCK, max_size=100, min_size=BLOCK))
  # Insert 1 arrives first: it waits (and answers None after the wait slice) until 0 is in.
  assert server.insert("w", 1, [_block(10)], [1.0]) is None
  assert server.insert("w", 0, [_block(0)], [1.0]) == 1
  assert server.insert("w", 1, [_block(10)], [1.0]) == 2
  assert server.insert("w", 1, [_block(10)], [1.0]) == 2  # a repeat (its answer was lost): taken once
  assert server.insert("other", 0, [_block(20)], [1.0]) == 3  # another writer has its own order
  sampled = server.sample(60)  # within the error buffer: 3 x samples_per_insert - 60 >= min_diff
  assert sorted(set(sampled.keys.tolist())) == [0, 1, 2]
  for key, reward in zip(sampled.keys, sampled.data.reward[:, 0]):
    assert reward == {0: 0.0, 1: 10.0, 2: 20.0}[int(key)]
  assert tuple(server.info()) == (3, 3, 60)


def test_a_queue_hands_out_its_oldest_items_once_and_holds_inserts_when_full():
  spec = ReplaySpec(kind=TrajectoryQueue(sequence_length=BLOCK), block_size=1, max_size=3, min_size=1)
  server = _server(spec)
  for i in range(spec.max_items):
    assert server.insert("w", i, [_block(10 * i)], [1.0]) == i + 1
  assert server.insert("w", spec.max_items, [_block(99)], [1.0]) is None  # full: held
  first = server.sample(2)
  assert first.keys.tolist() == [0, 1] and first.data.reward[:, 0].tolist() == [0.0, 10.0]
  assert server.insert("w", spec.max_items, [_block(99)], [1.0]) is not None  # room again
  assert server.sample(2).keys.tolist() == [2, 3]
  assert server.sample(1) is None  # nothing waits: held (answers None after the slice)


def test_priorities_checkpoint_and_restore_continue_the_same_samples(tmp_path):
  spec = ReplaySpec(block_size=BLOCK, max_size=10, min_size=BLOCK, prioritized=True, priority_exponent=1.0)
  server = _server(spec)
  for i in range(4):
    server.insert("w", i, [_block(10 * i)], [1.0])
  server.update_priorities({0: 0.0, 1: 0.0, 2: 0.0, 3: 5.0})
  assert set(server.sample(20).keys.tolist()) == {3}
  server.checkpoint(str(tmp_path / "replay"))
  restored = _server(spec, restore_from=str(tmp_path / "replay"))
  assert tuple(restored.info()) == tuple(server.info())
  a, b = server.sample(7), restored.sample(7)
  np.testing.assert_array_equal(a.keys, b.keys)
  np.testing.assert_array_equal(a.data.reward, b.data.reward)


def test_the_writer_and_batches_over_a_threaded_handle_resend_what_the_limiter_held():
  """An actor's writer inserting faster than samples_per_insert allows is held (its inserts sent again
  until taken), and the learner's batches, sampling on their own thread, release it."""
  spec = ReplaySpec(block_size=BLOCK, max_size=1000, min_size=4, samples_per_insert=1.0)
  server = _server(spec, error_buffer=8.0)
  client = ServedReplayClient(ThreadHandle(server))
  stop = threading.Event()
  writer = client.writer(spec, 1, stop, deadline_s=30.0, log=print)
  batches = client.batches(spec, _block(0), updates_per_call=1, batch_size=2, seed=0, place=lambda b: b, depth=1,
                           stop=stop)
  done = threading.Event()

  def write():
    for i in range(40):
      writer.insert(_block(10 * i), 1.0)
    writer.flush()
    done.set()

  thread = threading.Thread(target=write)
  thread.start()
  taken = 0
  while not done.is_set() and taken < 200:
    next(batches)
    taken += 1
  thread.join(30)
  stop.set()
  assert done.is_set() and writer.items_inserted == 40
  info = server.info()
  assert info.items_inserted == 40 and info.size == 40
  # Held to samples_per_insert 1 within the error buffer: samples stayed within 8 of inserts - min_size.
  assert abs(info.items_sampled - (info.items_inserted - spec.min_items)) <= 8 + 2
