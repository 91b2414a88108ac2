"""Pieces shared by the agents for bounded Box actions (SAC, TD3): the twin critic, the check of
the action space, and the map between the normalised box [-1, 1]^A, where their policies act,
and the env's bounds."""

from typing import Sequence

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from jrl.errors import ConfigError
from jrl.networks import MLP
from jrl.specs import EnvSpec
from jrl.types import Array


class TwinQ(nn.Module):
  """Two independent Q MLPs on (obs, action): (obs [B, ...], action [B, A] in [-1, 1]) -> q [2, B]."""
  hidden_sizes: Sequence[int]

  @nn.compact
  def __call__(self, obs, action):
    x = jnp.concatenate([obs.reshape(obs.shape[0], -1), action], axis=-1)
    return jnp.stack([nn.Dense(1)(MLP(self.hidden_sizes)(x))[..., 0] for _ in range(2)])  # [2, B]


def check_bounded_box(agent: str, spec: EnvSpec) -> int:
  """The action dimension A of a bounded 1-D Box; ConfigError('agent', ...) for anything else."""
  if spec.discrete:
    raise ConfigError("agent", f"{agent} needs a Box action space, the env has a Discrete one "
                               f"({spec.num_actions} actions)")
  if len(spec.action_shape) != 1 or not np.all(np.isfinite(spec.action_low)) or not np.all(np.isfinite(spec.action_high)):
    raise ConfigError("agent", f"{agent} needs a bounded 1-D Box action space, got shape {spec.action_shape} "
                               f"with bounds [{spec.action_low}, {spec.action_high}]")
  return spec.action_shape[0]


def to_env(action: Array, low: np.ndarray, high: np.ndarray) -> Array:
  """[-1, 1] -> the env's action bounds [low, high]."""
  return low + (action + 1.0) * 0.5 * (high - low)


def from_env(action: Array, low: np.ndarray, high: np.ndarray) -> Array:
  """The env's bounds [low, high] -> [-1, 1]."""
  return 2.0 * (action - low) / (high - low) - 1.0
