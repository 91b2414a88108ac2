"""TD3 configuration."""

import dataclasses
from typing import Tuple

from jrl.errors import require_non_negative, require_positive, require_unit_interval
from jrl.networks import check_network_fields
from jrl.replay.kinds import Transitions
from jrl.replay.spec import ReplaySpec


@dataclasses.dataclass(frozen=True)
class Config:
  """Twin delayed deep deterministic policy gradient (Fujimoto et al., 2018).

  Noise scales are in the normalised action box [-1, 1] (a fraction of half the env's range).
  Defaults reach a greedy return of -200 on Pendulum-v1 within 30k env steps.
  """
  discount: float = 0.99             # gamma
  n_step: int = 1                    # steps summed before bootstrapping
  tau: float = 0.005                 # Polyak step size of the target actor and critics
  actor_learning_rate: float = 1e-3
  critic_learning_rate: float = 1e-3
  batch_size: int = 256
  hidden_sizes: Tuple[int, ...] = (256, 256)
  policy_delay: int = 2              # critic updates per actor and target update
  target_noise: float = 0.2          # std of the target policy smoothing noise
  target_noise_clip: float = 0.5     # the smoothing noise is clipped to [-c, c]
  exploration_noise: float = 0.1     # std of the Gaussian noise added to the acting policy's actions
  uniform_steps: int = 1_000         # env steps (of one actor) acting uniformly at random before the policy
  # Replay.
  min_replay_size: int = 1_000       # transitions
  max_replay_size: int = 1_000_000   # transitions
  samples_per_insert: float = 256.0  # transitions sampled per transition inserted (256 = one update per env step)
  block_size: int = 8                # transitions per replay item

  def __post_init__(self):
    require_positive(self, "actor_learning_rate", "critic_learning_rate", "batch_size", "policy_delay",
                     "block_size")
    require_non_negative(self, "target_noise", "target_noise_clip", "exploration_noise", "uniform_steps")
    require_unit_interval(self, "tau")
    check_network_fields(self.hidden_sizes)
    self.replay_spec()  # validates the replay fields (n_step and discount: the item kind's)

  def replay_spec(self) -> ReplaySpec:
    """n-step transitions in blocks."""
    return ReplaySpec(kind=Transitions(n_step=self.n_step, discount=self.discount), block_size=self.block_size,
                      max_size=self.max_replay_size, min_size=self.min_replay_size,
                      samples_per_insert=self.samples_per_insert)
