"""IMPALA configuration."""

import dataclasses
from typing import Tuple

from jrl.agents import on_policy
from jrl.errors import require_positive, require_unit_interval
from jrl.networks import check_network_fields
from jrl.replay.spec import ReplaySpec


@dataclasses.dataclass(frozen=True)
class Config:
  """IMPALA: actor-critic with V-trace off-policy correction (Espeholt et al., 2018).

  Defaults reach a greedy return of 475 on CartPole-v1 within 200k env steps.
  """
  discount: float = 0.99
  vtrace_lambda: float = 1.0
  clip_rho_threshold: float = 1.0     # rho-bar, for the value targets
  clip_pg_rho_threshold: float = 1.0  # for the policy-gradient advantages
  entropy_cost: float = 0.01
  baseline_cost: float = 0.5
  learning_rate: float = 5e-4
  max_grad_norm: float = 40.0
  sequence_length: int = 32           # steps per trajectory
  batch_size: int = 8                 # trajectories per update
  hidden_sizes: Tuple[int, ...] = (64, 64)
  torso: str = "auto"               # auto (by observation shape), mlp, nature_cnn, impala_resnet, small_cnn
  greedy_eval: bool = True          # evaluations act on the policy's mode; false: on samples of it (as it acts)
  reward_clip: float = 0.0          # each step's reward clipped to [-c, c] before replay (1 for Atari); 0: off

  def __post_init__(self):
    require_positive(self, "learning_rate", "max_grad_norm", "batch_size", "clip_rho_threshold",
                     "clip_pg_rho_threshold")
    require_unit_interval(self, "discount", "vtrace_lambda")
    check_network_fields(self.hidden_sizes, self.torso)
    self.replay_spec()  # validates the replay fields (sequence_length and reward_clip: the item kind's)

  def replay_spec(self) -> ReplaySpec:
    """A queue of a few calls' worth of trajectories; each is used by exactly one call."""
    return on_policy.trajectory_queue_spec(self.sequence_length, self.batch_size, self.reward_clip)
