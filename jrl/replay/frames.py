"""Frame-shared observations: stacks of frames stored one frame per step.

An Atari observation stacks the last K frames on its last axis ([84, 84, 4] as the `atari`
preset makes them), so a step repeats K - 1 frames of the step before and a transition holds
two such stacks: 56,460 bytes, about 56 GB for the standard 1M transitions. Storing each frame
once (as Dopamine's circular buffer and Acme's adders do) takes about one frame, 7,056 bytes, per
transition. With `ReplaySpec(frame_stack=K)` replay does so, and what the learner samples is
byte-identical:

- `FrameEncoder` follows each env's stream of stacks and names every frame by an id (int64,
  numbered in the order frames are first seen, from a random base: unique across encoders): a
  stack equal to the env's last one keeps its ids, a stack that shifts the last one by a frame
  (the next step) adds one, and any other (an episode's first stack, however the stacking
  wrapper padded it) gets an id per frame. Equality is checked on the bytes, so ids always
  rebuild the stack; a stack's ids increase from its oldest frame to its newest (no id twice in
  a row: Reverb merges a repeated reference).
- `FrameSharingAdder` wraps an item kind's adder: the rows it emits (transitions, on-policy
  trajectories, R2D2's sequences) carry ids [..., K] in `observation` and `next_observation`,
  and the frames seen first in that step travel with them (`FramedRows`) to the writer, which
  takes them (`add_frames`) before any item that references them.
- `FrameStore` holds the seeded buffer's frames in a ring numbered by arrival, which grows
  rather than overwrite a frame that an item still in replay references; `decode` rebuilds
  the stacks of sampled items.
- In Reverb (`jrl.replay.reverb_replay.ReverbItemWriter`) each frame is one step of a frame
  column, and an item's observation columns reference the steps of its frames, as Acme's
  adders reference overlapping steps of a chunked trajectory; the table returns the frames in
  the item's order (`table_item` is its layout) and `from_table` rebuilds the stacks.
"""

import collections
import os
import sys
from typing import Any, Dict, NamedTuple, Optional, Tuple

import numpy as np

FRAME_FIELDS = ("observation", "next_observation")  # the row fields that hold stacks
MIN_CAPACITY = 4096  # frames a ring starts with at least: room for the rows still in adders and partial blocks


def _frame_fields(row: Any) -> Tuple[str, ...]:
  fields = getattr(row, "_fields", ())
  missing = [f for f in FRAME_FIELDS if f not in fields]
  if missing:
    raise TypeError(f"frame sharing needs rows with {', '.join(FRAME_FIELDS)} fields, got {type(row).__name__}")
  return FRAME_FIELDS


def stack_frames(frames: np.ndarray, lead: int) -> np.ndarray:
  """Frames [*lead, K, *frame] -> stacks [*lead, *frame, K] (the stacked axis last), written frame
  by frame into the strided output rather than by a transposing copy, which numpy does slowly when
  the last axis is as short as a stack."""
  k = frames.shape[lead]
  out = np.empty(frames.shape[:lead] + frames.shape[lead + 1:] + (k,), frames.dtype)
  for j in range(k):
    out[..., j] = frames[(slice(None),) * lead + (j,)]
  return out


def _pixel_words(stacks: np.ndarray) -> Optional[np.ndarray]:
  """Stacks [..., K] as one unsigned word per pixel ([...]), where K frames of a pixel fill 2, 4
  or 8 bytes (Atari: 4 uint8 frames) on a little-endian machine; else None."""
  size = stacks.dtype.itemsize * stacks.shape[-1]
  if size not in (2, 4, 8) or sys.byteorder != "little" or not stacks.flags.c_contiguous:
    return None
  return stacks.view(np.dtype(f"u{size}"))[..., 0]


def _same_and_shifted(stacks: np.ndarray, last: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
  """[E] bools: each env's stack equals its last one; and (where not) it is the last one moved on
  by a frame (frames 1.. of the last are frames ..K-1 of this)."""
  n = stacks.shape[0]
  words, last_words = _pixel_words(stacks), _pixel_words(last)
  if words is None or last_words is None:
    same = (stacks == last).reshape(n, -1).all(1)
    return same, ~same & (stacks[..., :-1] == last[..., 1:]).reshape(n, -1).all(1)
  word = words.dtype.type
  bits = word(8 * stacks.dtype.itemsize)
  older = word((1 << int(bits) * (stacks.shape[-1] - 1)) - 1)  # the bytes of frames 0..K-2
  same = (words == last_words).reshape(n, -1).all(1)
  shifted = ((words & older) == (last_words >> bits)).reshape(n, -1).all(1)
  return same, ~same & shifted


class FrameEncoder:
  """Frame ids of each env's stacks (see the module docstring). An encoder numbers its frames from
  a random 62-bit base of its own, so that ids are unique across encoders and sessions: the env
  groups of one actor share a writer, and a resumed run's new encoder meets rows and frames of
  the one before (ids name frames only; no sampled byte depends on them)."""

  def __init__(self, stack: int):
    if stack < 2:
      raise ValueError(f"frame sharing needs stacks of at least 2 frames, got {stack}")
    self.stack = stack
    self._next = int.from_bytes(os.urandom(8), "little") >> 2  # the next id
    self._last: Optional[np.ndarray] = None  # [E, ..., K] each env's last stack
    self._ids: Optional[np.ndarray] = None   # [E, K] its ids

  def _take(self, n: int) -> np.ndarray:
    ids = self._next + np.arange(n, dtype=np.int64)
    self._next += n
    return ids

  def encode(self, stacks: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids [E, K] of `stacks` [E, ..., K], the ids [M] and frames [M, ...] seen first here)."""
    stacks = np.asarray(stacks)
    num_envs, k = stacks.shape[0], self.stack
    if stacks.ndim < 2 or stacks.shape[-1] != k:
      raise ValueError(f"expected stacks of {k} frames on the last axis, got observations shaped {stacks.shape[1:]}")
    if self._last is None or self._last.shape != stacks.shape:
      self._last = np.zeros_like(stacks)
      self._ids = np.full((num_envs, k), -1, np.int64)
      same = np.zeros(num_envs, bool)
      shifted = same
    else:
      same, shifted = _same_and_shifted(stacks, self._last)
    ids = self._ids.copy()
    new_ids, new_frames = [], []
    moved = np.flatnonzero(shifted)
    if len(moved):  # the common step: one new frame per env
      ids[moved, :-1] = self._ids[moved, 1:]
      ids[moved, -1] = self._take(len(moved))
      new_ids.append(ids[moved, -1])
      new_frames.append(stacks[moved, ..., -1])
    fresh = np.flatnonzero(~same & ~shifted)
    if len(fresh):  # an episode's first stack (or the very first): a new id per frame
      ids[fresh] = self._take(len(fresh) * k).reshape(len(fresh), k)
      new_ids.append(ids[fresh].ravel())
      new_frames.append(np.moveaxis(stacks[fresh], -1, 1).reshape((len(fresh) * k,) + stacks.shape[1:-1]))
    np.copyto(self._last, stacks)
    self._ids = ids
    frame_shape = stacks.shape[1:-1]
    if not new_ids:
      return ids, np.zeros(0, np.int64), np.zeros((0,) + frame_shape, stacks.dtype)
    return ids, np.concatenate(new_ids), np.ascontiguousarray(np.concatenate(new_frames))

  def state(self) -> Dict[str, Any]:
    """The next id, each env's last stack [E, ..., K] and its ids [E, K] (None before the first), as data."""
    copy = lambda x: None if x is None else x.copy()
    return {"next": self._next, "last": copy(self._last), "ids": copy(self._ids)}

  def restore(self, state: Dict[str, Any]) -> None:
    copy = lambda x: None if x is None else np.array(x)
    self._next, self._last, self._ids = int(state["next"]), copy(state["last"]), copy(state["ids"])


class FramedRows(NamedTuple):
  """What a `FrameSharingAdder` emits for one step: the wrapped adder's rows (frame fields as
  ids) and the frames seen first in the step, which the writer must take before the rows."""
  rows: Any
  frame_ids: np.ndarray  # [M] int64
  frames: np.ndarray     # [M, *frame]


class FrameSharingAdder:
  """An item kind's adder whose rows name frames by id (see the module docstring)."""

  def __init__(self, adder: Any, stack: int):
    self.adder = adder
    self.encoder = FrameEncoder(stack)

  def add(self, obs, action, reward, terminated, truncated, next_obs, extras=None) -> FramedRows:
    obs_ids, ids, frames = self.encoder.encode(obs)
    next_ids, next_new, next_frames = self.encoder.encode(next_obs)
    rows = self.adder.add(obs_ids, action, reward, terminated, truncated, next_ids, extras)
    if len(next_new):
      ids, frames = (next_new, next_frames) if not len(ids) else (np.concatenate([ids, next_new]),
                                                                  np.concatenate([frames, next_frames]))
    return FramedRows(rows, ids, frames)

  def state(self) -> Dict[str, Any]:
    return {"adder": self.adder.state(), "encoder": self.encoder.state()}

  def restore(self, state: Dict[str, Any]) -> None:
    self.adder.restore(state["adder"])
    self.encoder.restore(state["encoder"])


class FrameStore:
  """The seeded buffer's frames: a ring of frames in arrival order. Items hold arrival numbers
  (`references` turns a row's ids into them as the item is inserted); the ring grows rather than
  overwrite a frame whose number an item still in replay holds (`item_added`, `items_before`
  keep the smallest number held, over the items in replay, as a sliding minimum)."""

  def __init__(self, capacity: int):
    self._capacity = max(int(capacity), 1)
    self._frames: Optional[np.ndarray] = None  # [capacity, *frame]
    self._ids: Optional[np.ndarray] = None     # [capacity] the id of the frame in each slot
    self._arrived = 0                          # frames added
    self._number_of: Dict[int, int] = {}       # id -> arrival number, for frames in the ring
    self._held: "collections.deque" = collections.deque()  # (item index, smallest number it holds), increasing

  @property
  def capacity(self) -> int:
    return self._capacity

  @property
  def frames_added(self) -> int:
    return self._arrived

  def add(self, ids: np.ndarray, frames: np.ndarray) -> None:
    """Frames first seen (ids [M], frames [M, ...]), in order."""
    m = len(ids)
    if m == 0:
      return
    if self._frames is None:
      self._frames = np.zeros((self._capacity,) + frames.shape[1:], frames.dtype)
      self._ids = np.full(self._capacity, -1, np.int64)
    oldest_held = self._held[0][1] if self._held else self._arrived
    if self._arrived + m - self._capacity > oldest_held:  # would overwrite a frame an item holds
      self._grow(self._arrived + m - oldest_held)
    numbers = self._arrived + np.arange(m)
    slots = numbers % self._capacity
    if self._arrived + m > self._capacity:
      for old in self._ids[slots]:
        self._number_of.pop(int(old), None)
    self._frames[slots] = frames
    self._ids[slots] = ids
    self._number_of.update(zip(ids.tolist(), numbers.tolist()))
    self._arrived += m

  def _grow(self, needed: int) -> None:
    capacity = max(needed, int(self._capacity * 1.25) + 1)
    frames = np.zeros((capacity,) + self._frames.shape[1:], self._frames.dtype)
    ids = np.full(capacity, -1, np.int64)
    numbers = np.arange(max(0, self._arrived - self._capacity), self._arrived)
    frames[numbers % capacity] = self._frames[numbers % self._capacity]
    ids[numbers % capacity] = self._ids[numbers % self._capacity]
    self._frames, self._ids, self._capacity = frames, ids, capacity

  def references(self, ids: np.ndarray) -> np.ndarray:
    """Arrival numbers (same shape) of the frames `ids` name; KeyError for one not in the ring."""
    flat = ids.ravel().tolist()
    try:
      return np.fromiter((self._number_of[i] for i in flat), np.int64, len(flat)).reshape(ids.shape)
    except KeyError as e:
      raise KeyError(f"frame id {e.args[0]} is not in the frame store: its rows came after the ring moved past it")

  def item_added(self, index: int, numbers: np.ndarray) -> None:
    """Item `index` (the buffer's insertion count) holds frames `numbers`."""
    smallest = int(numbers.min())
    while self._held and self._held[-1][1] >= smallest:
      self._held.pop()
    self._held.append((index, smallest))

  def items_before(self, index: int) -> None:
    """Items before `index` have left replay."""
    while self._held and self._held[0][0] < index:
      self._held.popleft()

  def decode(self, numbers: np.ndarray) -> np.ndarray:
    """Stacks [..., *frame, K] of arrival numbers [..., K]."""
    return stack_frames(self._frames[numbers % self._capacity], numbers.ndim - 1)

  def state(self) -> Dict[str, Any]:
    """The ring (frames [capacity, ...] and their ids [capacity], None before the first), the frames
    added, and the items' smallest numbers held [N, 2] (item index, number), as data."""
    held = np.asarray(list(self._held), np.int64).reshape(-1, 2)
    return {"capacity": self._capacity, "frames": self._frames, "ids": self._ids, "arrived": self._arrived,
            "held": held}

  def restore(self, state: Dict[str, Any]) -> None:
    self._capacity, self._frames, self._ids = int(state["capacity"]), state["frames"], state["ids"]
    self._arrived = int(state["arrived"])
    self._held = collections.deque((int(i), int(n)) for i, n in np.asarray(state["held"]).reshape(-1, 2).tolist())
    # Id -> number of the frames in the ring: those of the last `capacity` numbers whose slot holds
    # them (-1: a slot a growth left empty, whose frame had been overwritten before).
    self._number_of = {}
    if self._ids is not None:
      numbers = np.arange(max(0, self._arrived - self._capacity), self._arrived)
      ids = self._ids[numbers % self._capacity]
      self._number_of = dict(zip(ids[ids >= 0].tolist(), numbers[ids >= 0].tolist()))


def encode_item(block: Any, store: FrameStore) -> Tuple[Any, np.ndarray]:
  """A row block whose frame fields hold ids, with arrival numbers in their place; and all of them."""
  fields = _frame_fields(block)
  numbers = {f: store.references(np.asarray(getattr(block, f))) for f in fields}
  return block._replace(**numbers), np.concatenate([n.ravel() for n in numbers.values()])


def decode_items(data: Any, store: FrameStore) -> Any:
  """Sampled items whose frame fields hold arrival numbers, with the stacks rebuilt."""
  return data._replace(**{f: store.decode(getattr(data, f)) for f in _frame_fields(data)})


# Reverb: the frame fields of an item as columns of frames. An item has one leading axis (a
# block's rows, or a sequence's steps): its frame fields are [R, *frame, K].

def table_item(example_item: Any, stack: int) -> Tuple[Any, ...]:
  """An item as a frame-sharing Reverb table holds it, from the learner's layout: (observation
  frames [R*K, *frame], next_observation frames [R*K, *frame], the item without them)."""
  fields = _frame_fields(example_item)
  columns = [np.zeros((x.shape[0] * stack,) + x.shape[1:-1], x.dtype)
             for x in (np.asarray(getattr(example_item, f)) for f in fields)]
  return (*columns, example_item._replace(**{f: () for f in fields}))


def from_table(data: Tuple[Any, ...], stack: int) -> Any:
  """Sampled items in the table's layout (leaves [N, ...]) -> the learner's (frame fields
  [N, R, *frame, K])."""
  fields = FRAME_FIELDS
  stacks = {}
  for f, frames in zip(fields, data[:len(fields)]):
    rows = frames.shape[1] // stack
    stacks[f] = stack_frames(frames.reshape((frames.shape[0], rows, stack) + frames.shape[2:]), 2)
  return data[len(fields)]._replace(**stacks)
