"""What an agent asks of replay: its item kind, and the table's size and rate limiting."""

import dataclasses
from typing import Optional

from jrl.errors import ConfigError, require_positive
from jrl.replay.frames import MIN_CAPACITY, FrameSharingAdder
from jrl.replay.kinds import ItemKind, ReplayedSequences, TrajectoryQueue, Transitions, check_kind, legacy_kind


@dataclasses.dataclass(frozen=True, init=False)
class ReplaySpec:
  """Replay settings an agent derives from its config: what an item holds (`kind`, a
  `jrl.replay.kinds.ItemKind`: `Transitions`, `TrajectoryQueue` or `ReplayedSequences`), and
  the table's size, sampling and rate limiting. The kind decides the rest (adder, items,
  batches, learner-call schedule, table and device ring). `frame_stack` K > 0 stores
  observations that stack K frames on their last axis one frame per step (`jrl.replay.frames`;
  the builder sets it for the `atari` preset's envs): sampled batches are the same bytes.

  Transitions are written as items of `block_size`: Reverb costs ~150 us per call, so one item
  per env step caps inserts near 6k/s, while a block amortises the call. Learner batches are
  drawn from many blocks at once and shuffled across them (see `jrl.replay.batches`), which
  keeps batches close to i.i.d. Sequences are one per item.

  Specs written before item kinds named theirs with `sequence_length` (an on-policy queue) or
  `replay_sequence_length` and `replay_sequence_period` (R2D2's replayed sequences): those
  keywords are still taken, and read back (with `sequences` and `replayed_sequences`) from the kind.
  """
  block_size: int           # transitions per item
  max_size: int             # transitions (sequences: sequences)
  min_size: int             # rows before the learner may sample
  samples_per_insert: float  # rows sampled per row inserted
  prioritized: bool
  priority_exponent: float  # alpha
  importance_exponent: float  # beta
  kind: ItemKind            # what an item holds
  frame_stack: int = 0      # observations stack this many frames on their last axis, stored once each (0: off)

  def __init__(self, block_size: int = 8, max_size: int = 100_000, min_size: int = 1_000,
               samples_per_insert: float = 32.0, prioritized: bool = False, priority_exponent: float = 0.6,
               importance_exponent: float = 0.4, kind: Optional[ItemKind] = None, *, sequence_length: int = 0,
               replay_sequence_length: int = 0, replay_sequence_period: int = 0, frame_stack: int = 0):
    legacy = legacy_kind(sequence_length, replay_sequence_length, replay_sequence_period)
    if legacy is not None and kind is not None:
      raise ConfigError("kind", "name the item kind, or the fields that named it before item kinds "
                                "(sequence_length, replay_sequence_length), not both")
    kind = check_kind(legacy or kind or Transitions())
    for name, value in (("block_size", block_size), ("max_size", max_size), ("min_size", min_size),
                        ("samples_per_insert", samples_per_insert), ("prioritized", prioritized),
                        ("priority_exponent", priority_exponent), ("importance_exponent", importance_exponent),
                        ("kind", kind), ("frame_stack", frame_stack)):
      object.__setattr__(self, name, value)
    self._check()

  def _check(self) -> None:
    require_positive(self, "block_size", "max_size")
    if self.min_size < self.block_size:
      raise ConfigError("min_replay_size", f"must be >= block_size ({self.block_size}), got {self.min_size}")
    if self.max_size < self.min_size:
      raise ConfigError("max_replay_size", f"must be >= min_replay_size ({self.min_size}), got {self.max_size}")
    require_positive(self, "samples_per_insert")
    if self.frame_stack < 0 or self.frame_stack == 1:
      raise ConfigError("frame_stack", f"must be 0 (off) or the frames stacked (>= 2), got {self.frame_stack}")

  def make_adder(self, num_envs: int):
    """The item kind's adder for a vector env of `num_envs` (`ItemKind.make_adder`); with
    `frame_stack` its rows name frames by id (`jrl.replay.frames.FrameSharingAdder`)."""
    adder = self.kind.make_adder(num_envs)
    return FrameSharingAdder(adder, self.frame_stack) if self.frame_stack else adder

  def frames_in_flight(self, num_envs: int) -> int:
    """Frames a Reverb writer keeps referable (`num_envs` the envs of all its adders): those a row
    can name from when its first frame arrived until its item is written (the steps a row spans,
    the stack, a block's wait), as if every step started an episode (K new frames per env)."""
    return (self.kind.steps_per_row() + self.frame_stack + self.block_size + 2) * num_envs * self.frame_stack

  def frame_capacity(self) -> int:
    """Frames the seeded buffer's ring starts with: one per env step that the rows of a full
    replay span, and a twentieth more (each episode start adds up to `frame_stack`); it grows
    if that is not enough."""
    return max(MIN_CAPACITY, int(self.max_size / self.kind.rows_per_env_step() * 1.05))

  @property
  def max_items(self) -> int:
    return max(1, self.max_size // self.block_size)

  @property
  def min_items(self) -> int:
    return max(1, self.min_size // self.block_size)

  # The names from before item kinds, read from the kind.

  @property
  def sequences(self) -> bool:
    """Old name: the kind is an on-policy `TrajectoryQueue`."""
    return isinstance(self.kind, TrajectoryQueue)

  @property
  def replayed_sequences(self) -> bool:
    """Old name: the kind is `ReplayedSequences` (R2D2's)."""
    return isinstance(self.kind, ReplayedSequences)

  @property
  def sequence_length(self) -> int:
    """Old name: a trajectory queue's `sequence_length`, else 0."""
    return self.kind.sequence_length if self.sequences else 0

  @property
  def replay_sequence_length(self) -> int:
    """Old name: replayed sequences' `sequence_length`, else 0."""
    return self.kind.sequence_length if self.replayed_sequences else 0

  @property
  def replay_sequence_period(self) -> int:
    """Old name: replayed sequences' `sequence_period`, else 0."""
    return self.kind.sequence_period if self.replayed_sequences else 0
