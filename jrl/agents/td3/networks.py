"""TD3 networks: a deterministic tanh policy and twin Q critics, in the normalised action box [-1, 1]."""

from typing import Any, Optional, Sequence

import flax.linen as nn
import jax.numpy as jnp

from jrl.agents import continuous
from jrl.agents.td3.config import Config
from jrl.networks import MLP
from jrl.specs import EnvSpec


class DeterministicPolicy(nn.Module):
  """obs [B, ...] -> action [B, A] in [-1, 1] (tanh of a linear layer on an MLP)."""
  action_dim: int
  hidden_sizes: Sequence[int]

  @nn.compact
  def __call__(self, obs):
    return jnp.tanh(nn.Dense(self.action_dim)(MLP(self.hidden_sizes)(obs)))


Networks = continuous.Networks
"""TD3's networks (`jrl.agents.continuous.Networks`): policy_apply: obs [B, *obs_shape] -> action [B, A]
in [-1, 1]; q_apply: obs [B, *obs_shape], action [B, A] in [-1, 1] -> q [2, B]."""


def make_networks(spec: EnvSpec, cfg: Config, module: Optional[Any] = None,
                  critic: Optional[Any] = None) -> Networks:
  """The policy `module` (obs [B, *obs_shape] -> action [B, A] in [-1, 1]) and the twin `critic`
  ((obs [B, ...], action [B, A] in [-1, 1]) -> q [2, B]): each a flax module or an (init, apply)
  pair; None: MLPs of `cfg.hidden_sizes`."""
  policy = lambda action_dim: DeterministicPolicy(action_dim, tuple(cfg.hidden_sizes))
  return continuous.make_networks("td3", spec, cfg.hidden_sizes, policy, module, critic)
