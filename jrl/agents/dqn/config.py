"""DQN configuration."""

import dataclasses
from typing import Tuple

from jrl.errors import require_positive, require_unit_interval
from jrl.networks import check_network_fields
from jrl.replay.kinds import Transitions
from jrl.replay.spec import ReplaySpec


@dataclasses.dataclass(frozen=True)
class Config:
  """DQN with double Q-learning (or max-Q targets), n-step targets and optional prioritized replay.

  Defaults solve CartPole-v1 (greedy return 475) within 50k env steps.
  """
  # Loss and targets.
  discount: float = 0.99            # gamma
  n_step: int = 3                   # steps summed before bootstrapping
  double_q: bool = True             # online net picks the next action, target net values it; False: target net max
  huber_delta: float = 1.0          # Huber loss transition point
  target_update_period: int = 250   # updates between target copies (used when target_update_tau == 0)
  target_update_tau: float = 0.0    # Polyak step size per update; 0 means periodic copies
  # Optimiser.
  learning_rate: float = 1e-3
  adam_eps: float = 1e-8
  max_grad_norm: float = 10.0
  batch_size: int = 128
  # Network.
  hidden_sizes: Tuple[int, ...] = (128, 128)
  dueling: bool = False
  torso: str = "auto"               # auto (by observation shape), mlp, nature_cnn, impala_resnet, small_cnn
  reward_clip: float = 0.0          # each step's reward clipped to [-c, c] before replay (1 for Atari); 0: off
  # Exploration (counted in env steps of one actor).
  epsilon_init: float = 1.0
  epsilon_final: float = 0.05
  epsilon_decay_steps: int = 10_000
  eval_epsilon: float = 0.0         # evaluation is greedy by default
  # Replay.
  min_replay_size: int = 1_000      # transitions
  max_replay_size: int = 100_000    # transitions
  samples_per_insert: float = 128.0  # transitions sampled per transition inserted (128 = one update per env step)
  block_size: int = 8               # transitions per replay item
  prioritized: bool = False
  priority_exponent: float = 0.6
  importance_exponent: float = 0.4

  def __post_init__(self):
    require_positive(self, "batch_size", "learning_rate", "target_update_period",
                     "epsilon_decay_steps", "max_grad_norm", "huber_delta", "block_size")
    require_unit_interval(self, "target_update_tau", "epsilon_init", "epsilon_final", "eval_epsilon",
                          "priority_exponent", "importance_exponent")
    check_network_fields(self.hidden_sizes, self.torso)
    self.replay_spec()  # validates the replay fields (n_step, discount and reward_clip: the item kind's)

  def replay_spec(self) -> ReplaySpec:
    """n-step transitions in blocks, clipped as `reward_clip` says."""
    kind = Transitions(n_step=self.n_step, discount=self.discount, reward_clip=self.reward_clip)
    return ReplaySpec(kind=kind, block_size=self.block_size, max_size=self.max_replay_size,
                      min_size=self.min_replay_size, samples_per_insert=self.samples_per_insert,
                      prioritized=self.prioritized, priority_exponent=self.priority_exponent,
                      importance_exponent=self.importance_exponent)
