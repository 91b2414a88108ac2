"""R2D2 configuration."""

import dataclasses
from typing import Tuple

from jrl.errors import require_positive, require_unit_interval
from jrl.networks import check_network_fields
from jrl.replay.kinds import ReplayedSequences
from jrl.replay.spec import ReplaySpec


@dataclasses.dataclass(frozen=True)
class Config:
  """R2D2: recurrent Q-learning from replayed sequences (Kapturowski et al., 2019).

  Sizes are for CartPole-size problems: defaults reach a greedy return of 400 on
  jrl/MaskedCartPole-v1 (velocities hidden) within 200k env steps.
  """
  # Sequences: `sequence_length` steps stored per item, a new one every `sequence_period`
  # steps (overlap = length - period); the first `burn_in` steps only warm up the core.
  sequence_length: int = 20
  sequence_period: int = 10
  burn_in: int = 5
  # Loss and targets.
  discount: float = 0.99
  n_step: int = 3                   # steps summed before bootstrapping, inside a sequence
  value_rescaling: bool = True      # h(x) = sign(x)(sqrt(|x|+1)-1) + eps x on the targets (rlax)
  target_update_period: int = 200   # updates between target copies
  priority_max_weight: float = 0.9  # eta: sequence priority = eta max|td| + (1 - eta) mean|td|
  # Optimiser.
  learning_rate: float = 1e-3
  adam_eps: float = 1e-3
  max_grad_norm: float = 10.0
  batch_size: int = 32              # sequences per update
  # Network: torso, LSTM core, linear Q head.
  torso: str = "auto"               # auto (by observation shape), mlp, nature_cnn, impala_resnet, small_cnn
  hidden_sizes: Tuple[int, ...] = (64,)  # the MLP torso's layers
  lstm_size: int = 64
  # Exploration (counted in env steps of one actor).
  epsilon_init: float = 1.0
  epsilon_final: float = 0.01
  epsilon_decay_steps: int = 20_000
  eval_epsilon: float = 0.0
  # Replay, counted in sequences.
  min_replay_size: int = 200
  max_replay_size: int = 10_000
  samples_per_insert: float = 32.0  # sequences sampled per sequence inserted
  prioritized: bool = True
  priority_exponent: float = 0.9
  importance_exponent: float = 0.6

  def __post_init__(self):
    require_positive(self, "n_step", "batch_size", "learning_rate", "adam_eps", "target_update_period",
                     "epsilon_decay_steps", "max_grad_norm", "lstm_size")
    # The item kind's first: the learner's unroll needs sequences longer than their burn-in.
    self.replay_spec()  # validates the replay fields (sequence_length, sequence_period, burn_in: the kind's)
    require_unit_interval(self, "discount", "priority_max_weight", "epsilon_init", "epsilon_final", "eval_epsilon",
                          "priority_exponent", "importance_exponent")
    check_network_fields(self.hidden_sizes, self.torso)

  def replay_spec(self) -> ReplaySpec:
    """Overlapping sequences with their start core states, sampled by priority, counted in sequences."""
    kind = ReplayedSequences(sequence_length=self.sequence_length, sequence_period=self.sequence_period,
                             burn_in=self.burn_in)
    return ReplaySpec(kind=kind, block_size=1, max_size=self.max_replay_size, min_size=self.min_replay_size,
                      samples_per_insert=self.samples_per_insert, prioritized=self.prioritized,
                      priority_exponent=self.priority_exponent, importance_exponent=self.importance_exponent)
