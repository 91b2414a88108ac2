"""PPO configuration."""

import dataclasses
from typing import Tuple

from jrl.agents import on_policy
from jrl.errors import require_non_negative, require_positive, require_unit_interval
from jrl.networks import check_network_fields
from jrl.replay.spec import ReplaySpec


@dataclasses.dataclass(frozen=True)
class Config:
  """PPO with the clipped surrogate objective and GAE (Schulman et al., 2017).

  One learner call consumes `batch_size` trajectories of `sequence_length`
  steps and runs `num_epochs` passes of `num_minibatches` minibatches over them.
  Defaults reach a greedy return of 475 on CartPole-v1 within 100k env steps.
  """
  discount: float = 0.99
  gae_lambda: float = 0.95
  clip_epsilon: float = 0.2
  entropy_cost: float = 0.01
  value_cost: float = 0.5
  value_clip_epsilon: float = 0.0   # > 0: the value clipped to within this of the old one in its loss (clip_vloss); 0: off
  learning_rate: float = 1e-3
  adam_eps: float = 1e-5
  max_grad_norm: float = 0.5
  normalize_advantages: bool = True
  num_epochs: int = 8
  num_minibatches: int = 4
  sequence_length: int = 64          # steps per trajectory
  batch_size: int = 8                # trajectories per learner call (num_envs of one actor fills one)
  hidden_sizes: Tuple[int, ...] = (64, 64)
  torso: str = "auto"               # auto (by observation shape), mlp, nature_cnn, impala_resnet, small_cnn
  greedy_eval: bool = True          # evaluations act on the policy's mode; false: on samples of it (as it acts)
  reward_clip: float = 0.0          # each step's reward clipped to [-c, c] before replay (1 for Atari); 0: off

  def __post_init__(self):
    require_positive(self, "learning_rate", "max_grad_norm", "num_epochs", "num_minibatches", "batch_size",
                     "clip_epsilon")
    require_unit_interval(self, "discount", "gae_lambda")
    require_non_negative(self, "value_clip_epsilon")
    self.replay_spec()  # validates the replay fields (sequence_length and reward_clip: the item kind's)
    on_policy.check_num_minibatches(self.batch_size, self.sequence_length, self.num_minibatches)
    check_network_fields(self.hidden_sizes, self.torso)

  def replay_spec(self) -> ReplaySpec:
    """A queue of a few calls' worth of trajectories; each is used by exactly one call."""
    return on_policy.trajectory_queue_spec(self.sequence_length, self.batch_size, self.reward_clip)
