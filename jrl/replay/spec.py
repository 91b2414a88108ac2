"""What an agent asks of replay: table kind, item layout and rate limiting."""

import dataclasses

from jrl.errors import ConfigError, require_positive


@dataclasses.dataclass(frozen=True)
class ReplaySpec:
  """Replay settings an agent derives from its config.

  Items are blocks of `block_size` transitions: Reverb costs ~150 us per call,
  so one item per env step caps inserts near 6k/s, while a block amortises the
  call. Learner batches are drawn from many blocks at once and shuffled across
  them (see `jrl.replay.batches`), which keeps batches close to i.i.d.
  """
  block_size: int = 8
  max_size: int = 100_000           # transitions
  min_size: int = 1_000             # transitions before the learner may sample
  samples_per_insert: float = 32.0  # transitions sampled per transition inserted
  prioritized: bool = False
  priority_exponent: float = 0.6    # alpha
  importance_exponent: float = 0.4  # beta
  # On-policy data: items are trajectories of `sequence_length` steps in a FIFO
  # queue, each sampled once (block_size, samples_per_insert and priorities unused).
  sequence_length: int = 0          # 0: items are blocks of n-step transitions
  # Off-policy sequences (R2D2): items are sequences of `replay_sequence_length` steps, one
  # every `replay_sequence_period` steps of each env (they overlap), with the recurrent state
  # at their start (`jrl.replay.sequence_adder`); stored and sampled as blocks of one item
  # (uniform or prioritized, at `samples_per_insert` sequences per sequence inserted).
  replay_sequence_length: int = 0
  replay_sequence_period: int = 0

  @property
  def sequences(self) -> bool:
    return self.sequence_length > 0

  @property
  def replayed_sequences(self) -> bool:
    return self.replay_sequence_length > 0

  def __post_init__(self):
    require_positive(self, "block_size", "max_size")
    if self.min_size < self.block_size:
      raise ConfigError("min_replay_size", f"must be >= block_size ({self.block_size}), got {self.min_size}")
    if self.max_size < self.min_size:
      raise ConfigError("max_replay_size", f"must be >= min_replay_size ({self.min_size}), got {self.max_size}")
    require_positive(self, "samples_per_insert")

  @property
  def max_items(self) -> int:
    return max(1, self.max_size // self.block_size)

  @property
  def min_items(self) -> int:
    return max(1, self.min_size // self.block_size)
