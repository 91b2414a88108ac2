"""A seeded in-process replay buffer with the same item interface as Reverb.

Reverb's samplers cannot be seeded, so `--deterministic` runs use this buffer:
same seed, same samples, same bytes. Items are blocks of transitions, evicted
first-in first-out; sampling is uniform or prioritized (p_i^alpha / sum p^alpha),
as Reverb's Uniform and Prioritized samplers do. With `spec.frame_stack` the observations'
frames are held once each in a `jrl.replay.frames.FrameStore` and the stacks rebuilt as sampled.
"""

from typing import Any, Dict, Optional

import jax
import numpy as np

from jrl.replay import frames
from jrl.replay.batches import SampledItems
from jrl.replay.spec import ReplaySpec
from jrl.types import as_named


class SeededReplayBuffer:
  """FIFO item storage with seeded uniform or prioritized sampling; for an item kind sampled
  once (`TrajectoryQueue`) a queue: the oldest items, each sampled once. `queue` False keeps
  sampled items of such a kind too (to measure sampling, as `launch.advise` does)."""

  def __init__(self, spec: ReplaySpec, seed: int, queue: Optional[bool] = None):
    self._spec = spec
    self._queue = spec.kind.sampled_once if queue is None else queue
    self._capacity = spec.max_items
    self._rng = np.random.default_rng(seed)
    self._storage: Optional[Any] = None
    self._priorities = np.zeros(self._capacity, np.float64)
    self._inserted = 0
    self._consumed = 0  # queue mode: items sampled (and so removed)
    self._frames = frames.FrameStore(spec.frame_capacity()) if spec.frame_stack else None

  @property
  def size(self) -> int:
    return min(self._inserted, self._capacity)

  @property
  def items_inserted(self) -> int:
    return self._inserted

  def add_frames(self, ids: np.ndarray, frames_: np.ndarray) -> None:
    """Frames first seen by a frame-sharing adder, before the items that reference them."""
    self._frames.add(ids, frames_)

  def insert(self, block: Any, priority: float) -> None:
    if self._frames is not None:  # frame ids -> the store's arrival numbers
      block, numbers = frames.encode_item(block, self._frames)
      self._frames.item_added(self._inserted, numbers)
    if self._storage is None:
      self._storage = jax.tree_util.tree_map(lambda x: np.zeros((self._capacity,) + x.shape, x.dtype), block)
    if self._queue and self._inserted - self._consumed >= self._capacity:
      raise RuntimeError(f"replay queue is full ({self._capacity} items): the learner is not keeping up")
    slot = self._inserted % self._capacity
    for store, x in zip(jax.tree_util.tree_leaves(self._storage), jax.tree_util.tree_leaves(block)):
      store[slot] = x
    self._priorities[slot] = priority
    self._inserted += 1
    if self._frames is not None:
      self._frames.items_before(self._consumed if self._queue else self._inserted - self._capacity)

  def sample(self, num_items: int) -> SampledItems:
    if self._queue:
      return self._pop(num_items)
    size = self.size
    if size < self._spec.min_items:
      raise RuntimeError(f"replay holds {size} items, fewer than min_size {self._spec.min_items}")
    if self._spec.prioritized:
      weights = self._priorities[:size] ** self._spec.priority_exponent
      probs = weights / weights.sum()
      slots = self._rng.choice(size, size=num_items, p=probs)
      item_probs = probs[slots]
    else:
      slots = self._rng.integers(0, size, size=num_items)
      item_probs = np.full(num_items, 1.0 / size)
    keys = self._keys_of(slots)
    return SampledItems(keys, item_probs, size, self._items(slots))

  def _items(self, slots: np.ndarray) -> Any:
    data = jax.tree_util.tree_map(lambda store: store[slots], self._storage)
    return frames.decode_items(data, self._frames) if self._frames is not None else data

  def _pop(self, num_items: int) -> SampledItems:
    available = self._inserted - self._consumed
    if available < num_items:
      raise RuntimeError(f"replay queue holds {available} items, {num_items} were asked for")
    keys = np.arange(self._consumed, self._consumed + num_items)
    self._consumed += num_items
    data = self._items(keys % self._capacity)
    return SampledItems(keys.astype(np.uint64), np.ones(num_items), available, data)

  def state(self) -> Dict[str, Any]:
    """Contents, counters and the sampling RNG's state, as data (the items as the item kind's rows,
    leaves [capacity, ...]; None before the first): a restored buffer samples what this one would."""
    return {"_capacity": self._capacity, "_rng": self._rng.bit_generator.state, "_storage": self._storage,
            "_priorities": self._priorities, "_inserted": self._inserted, "_consumed": self._consumed,
            "_frames": self._frames.state() if self._frames is not None else None}

  def restore(self, state: Dict[str, Any]) -> None:
    if (self._frames is None) != (state["_frames"] is None):
      raise ValueError("the saved replay and this run disagree on frame sharing (ReplaySpec.frame_stack): "
                       "a checkpoint of an Atari run written before frame sharing cannot be resumed")
    row_type, storage = self._spec.kind.row_type, state["_storage"]
    self._storage = as_named(row_type, storage) if storage is not None and row_type is not None else storage
    self._capacity, self._priorities = state["_capacity"], state["_priorities"]
    self._inserted, self._consumed = state["_inserted"], state["_consumed"]
    self._rng.bit_generator.state = state["_rng"]
    if self._frames is not None:
      self._frames.restore(state["_frames"])

  def update_priorities(self, priorities: Dict[int, float]) -> None:
    oldest = self._inserted - self.size
    for key, priority in priorities.items():
      if key >= oldest:  # items already evicted are ignored, as in Reverb
        self._priorities[key % self._capacity] = priority

  def _keys_of(self, slots: np.ndarray) -> np.ndarray:
    # The key is the insertion index; slot = key % capacity.
    newest_slot = (self._inserted - 1) % self._capacity
    base = self._inserted - 1 - newest_slot
    keys = np.where(slots <= newest_slot, base + slots, base - self._capacity + slots)
    return keys.astype(np.uint64)
