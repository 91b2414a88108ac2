"""From sampled replay items to learner batches, and from TD errors back to priorities.

Item layout and i.i.d.-ness: an item is a block of consecutive transitions (one
Reverb call per block instead of per env step). Drawing a batch from a few whole
blocks would correlate it in time, so one learner call samples
N = ceil(U * B / block_size) items at once, pools their transitions and deals a
random permutation of them into the U batches. Each transition in a block was
drawn with its block's probability, so importance weights use the item
probability, and each batch mixes transitions from about min(N, B) items.
"""

import math
import queue
import threading
from typing import Any, Callable, Dict, Iterator, NamedTuple, Optional

import jax
import numpy as np

from jrl.timing import QUEUE_WAIT
from jrl.types import LearnerBatch, Transition

# R2D2's mixture of max and mean for the priority of a multi-transition item.
PRIORITY_MAX_WEIGHT = 0.9


class SampledItems(NamedTuple):
  """Items as a replay (the seeded buffer, or Reverb) returns them."""
  keys: np.ndarray           # [N] uint64 item keys, for priority updates
  probabilities: np.ndarray  # [N] probability with which each item was drawn
  table_size: int            # items in the table when sampled
  data: Any                  # Transition [N, block_size, ...] or Trajectory [N, T, ...]


class PreparedBatch(NamedTuple):
  batch: LearnerBatch      # leaves [U, B, ...]
  item_keys: np.ndarray    # [N] keys of the sampled items
  item_index: np.ndarray   # [U, B] index into item_keys of each transition


def items_per_call(updates_per_call: int, batch_size: int, block_size: int) -> int:
  return math.ceil(updates_per_call * batch_size / block_size)


def assemble(sampled: SampledItems, updates_per_call: int, batch_size: int,
             importance_exponent: Optional[float], rng: np.random.Generator) -> PreparedBatch:
  """Deals the pooled transitions of `sampled` into [U, B] batches.

  `importance_exponent` None means uniform replay (all weights 1).
  """
  num_items, block = sampled.data.reward.shape[:2]
  needed = updates_per_call * batch_size
  if num_items * block < needed:
    raise ValueError(f"{num_items} items of {block} transitions cannot fill {needed}")
  chosen = rng.permutation(num_items * block)[:needed]
  lead = (updates_per_call, batch_size)
  transitions = Transition(*[x.reshape((num_items * block,) + x.shape[2:])[chosen].reshape(lead + x.shape[2:])
                             for x in sampled.data])
  item_index = (chosen // block).reshape(lead)
  if importance_exponent is None:
    weights = np.ones(lead, np.float32)
  else:
    probs = sampled.probabilities[item_index]
    weights = (sampled.table_size * probs) ** (-importance_exponent)
    weights = (weights / weights.max(axis=1, keepdims=True)).astype(np.float32)
  return PreparedBatch(LearnerBatch(transitions, weights), sampled.keys, item_index)


def assemble_sequence_batches(sampled: SampledItems, updates_per_call: int, batch_size: int,
                              importance_exponent: Optional[float]):
  """U x B sampled sequences as one learner call: leaves [U, B, T, ...] (batch-major, as the
  shell shards axis 1), importance weights [U, B] normalised per batch (1 for uniform replay).

  `sampled` holds U * B items; each row is its own item,
  so the learner's per-row priorities are the items' priorities.
  """
  lead = (updates_per_call, batch_size)
  needed = updates_per_call * batch_size
  if len(sampled.keys) < needed:
    raise ValueError(f"{len(sampled.keys)} sequences cannot fill {updates_per_call} batches of {batch_size}")
  data = jax.tree_util.tree_map(lambda x: x[:needed].reshape(lead + x.shape[1:]), sampled.data)
  if importance_exponent is None:
    weights = np.ones(lead, np.float32)
  else:
    weights = (sampled.table_size * sampled.probabilities[:needed].reshape(lead)) ** (-importance_exponent)
    weights = (weights / weights.max(axis=1, keepdims=True)).astype(np.float32)
  return PreparedBatch(LearnerBatch(data, weights), sampled.keys[:needed], np.arange(needed).reshape(lead))


def items_per_fetch(spec, updates_per_call: int, batch_size: int) -> int:
  """Items one learner call consumes (`spec` a `jrl.replay.spec.ReplaySpec`), as its item kind
  says: enough transition blocks for U x B transitions, or U x B sequences."""
  return spec.kind.items_per_fetch(spec, updates_per_call, batch_size)


def make_assembler(spec, updates_per_call: int, batch_size: int,
                   rng: np.random.Generator) -> Callable[[SampledItems], PreparedBatch]:
  """Sampled items (`items_per_fetch` of them) -> one learner call's PreparedBatch, as the spec's item kind says."""
  return spec.kind.make_assembler(spec, updates_per_call, batch_size, rng)


def item_priorities(td_abs: np.ndarray, item_keys: np.ndarray, item_index: np.ndarray) -> Dict[int, float]:
  """Per-item priority from the |TD| of its sampled transitions: 0.9 max + 0.1 mean."""
  flat_idx = item_index.reshape(-1)
  flat_td = np.asarray(td_abs, np.float64).reshape(-1)
  num = len(item_keys)
  maxima = np.zeros(num)
  sums = np.zeros(num)
  counts = np.zeros(num)
  np.maximum.at(maxima, flat_idx, flat_td)
  np.add.at(sums, flat_idx, flat_td)
  np.add.at(counts, flat_idx, 1)
  seen = counts > 0
  mixed = PRIORITY_MAX_WEIGHT * maxima + (1 - PRIORITY_MAX_WEIGHT) * sums / np.maximum(counts, 1)
  return {int(k): float(p) for k, p, s in zip(item_keys, mixed, seen) if s}


class PrefetchIterator:
  """Runs `produce` on a background thread, keeping up to `depth` results ready.

  The producer's work (sampling, assembling, device placement) overlaps the
  learner's update. An error in the producer is raised by `__next__`. `timer` (a
  `jrl.timing.PhaseTimer` of this thread) is started with the thread and
  charges the waits on a full queue to `queue_wait`; `produce` may time its own phases.
  """

  def __init__(self, produce: Callable[[], PreparedBatch], depth: int = 2,
               stop: Optional[threading.Event] = None, timer=None):
    self._produce = produce
    self.timer = timer
    self._queue: "queue.Queue" = queue.Queue(maxsize=depth)
    # Set by `close()`, or by the caller (e.g. Launchpad's stop event): `__next__`
    # then ends the iteration instead of waiting on a producer that may never return.
    self._stop = stop if stop is not None else threading.Event()
    self._thread = threading.Thread(target=self._run, name="prefetch", daemon=True)
    self._thread.start()

  def _run(self):
    timer = self.timer
    if timer is not None:
      timer.start()
    try:
      while not self._stop.is_set():
        item = self._produce()
        if timer is not None:
          timer.enter(QUEUE_WAIT)
        while not self._stop.is_set():
          try:
            self._queue.put(item, timeout=0.1)
            break
          except queue.Full:
            continue
        if timer is not None:
          timer.exit()
    except BaseException as e:  # handed to the consumer, never swallowed
      if not self._stop.is_set():  # after a stop, nobody is left to take it (and the queue may be full)
        self._queue.put(_Failure(e))
    finally:
      if timer is not None:
        timer.stop()

  def __iter__(self) -> Iterator[PreparedBatch]:
    return self

  def __next__(self) -> PreparedBatch:
    while True:
      try:
        item = self._queue.get(timeout=0.2)
        break
      except queue.Empty:
        if self._stop.is_set():
          raise StopIteration
    if isinstance(item, _Failure):
      raise RuntimeError(f"replay sampling failed: {item.error}") from item.error
    return item

  def close(self):
    self._stop.set()


class _Failure(NamedTuple):
  error: BaseException
