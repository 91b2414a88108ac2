"""PQN configuration."""

import dataclasses
from typing import Tuple

from jrl.agents import on_policy
from jrl.errors import require_positive, require_unit_interval
from jrl.networks import check_network_fields
from jrl.replay.spec import ReplaySpec


@dataclasses.dataclass(frozen=True)
class Config:
  """PQN: parallel Q-learning with LayerNorm and Q(lambda) targets (Gallici et al., 2024).

  No replay buffer beyond the on-policy queue and no target network: one learner call
  consumes `batch_size` trajectories of `sequence_length` steps, computes their Q(lambda)
  targets once with the current parameters, then runs `num_epochs` passes of
  `num_minibatches` minibatches over them. Defaults reach a greedy return of 475 on
  CartPole-v1 within 100k env steps.
  """
  # Targets.
  discount: float = 0.99            # gamma
  q_lambda: float = 0.95            # lambda of the Q(lambda) targets (0: one-step Q-learning, 1: Monte Carlo)
  # Optimiser.
  learning_rate: float = 1e-3       # Adam step size (constant)
  adam_eps: float = 1e-8            # Adam epsilon
  max_grad_norm: float = 10.0       # gradients clipped to this global norm
  num_epochs: int = 4               # passes over each learner call's trajectories
  num_minibatches: int = 4          # minibatches per epoch (must divide batch_size x sequence_length)
  # Trajectories (the on-policy queue).
  sequence_length: int = 32         # steps per trajectory
  batch_size: int = 8               # trajectories per learner call (num_envs of one actor fills one)
  reward_clip: float = 0.0          # each step's reward clipped to [-c, c] before replay (1 for Atari); 0: off
  # Network.
  hidden_sizes: Tuple[int, ...] = (128, 128)  # hidden layers of the Q-network's MLP (after the torso for frames)
  torso: str = "auto"               # auto (by observation shape), mlp, nature_cnn, impala_resnet, small_cnn
  layer_norm: bool = True           # LayerNorm after each hidden Dense layer, before its ReLU
  # Exploration (counted in env steps of one actor).
  epsilon_init: float = 1.0         # acting epsilon at the start
  epsilon_final: float = 0.05       # acting epsilon once decayed
  epsilon_decay_steps: int = 20_000  # env steps of one actor over which epsilon decays linearly
  eval_epsilon: float = 0.0         # evaluation is greedy by default

  def __post_init__(self):
    require_positive(self, "learning_rate", "adam_eps", "max_grad_norm", "num_epochs", "num_minibatches",
                     "batch_size", "epsilon_decay_steps")
    require_unit_interval(self, "discount", "q_lambda", "epsilon_init", "epsilon_final", "eval_epsilon")
    self.replay_spec()  # validates the replay fields (sequence_length and reward_clip: the item kind's)
    on_policy.check_num_minibatches(self.batch_size, self.sequence_length, self.num_minibatches)
    check_network_fields(self.hidden_sizes, self.torso)

  def replay_spec(self) -> ReplaySpec:
    """A queue of a few calls' worth of trajectories; each is used by exactly one call."""
    return on_policy.trajectory_queue_spec(self.sequence_length, self.batch_size, self.reward_clip)
