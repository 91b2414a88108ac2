"""SAC networks: a tanh-Gaussian policy and twin Q critics, in the normalised action box [-1, 1]."""

from typing import Any, Optional, Sequence

import distrax
import flax.linen as nn
import jax.numpy as jnp

from jrl.agents import continuous
from jrl.agents.sac.config import Config
from jrl.networks import MLP
from jrl.specs import EnvSpec
from jrl.types import Array


class GaussianPolicyHead(nn.Module):
  action_dim: int
  hidden_sizes: Sequence[int]
  log_std_min: float
  log_std_max: float

  @nn.compact
  def __call__(self, obs):
    h = MLP(self.hidden_sizes)(obs)
    mean = nn.Dense(self.action_dim)(h)
    log_std = jnp.clip(nn.Dense(self.action_dim)(h), self.log_std_min, self.log_std_max)
    return mean, log_std


def tanh_gaussian(mean: Array, log_std: Array) -> distrax.Distribution:
  """A diagonal Gaussian squashed by tanh into [-1, 1]^d (Haarnoja et al., 2018, appendix C)."""
  return distrax.Transformed(distrax.MultivariateNormalDiag(mean, jnp.exp(log_std)), distrax.Block(distrax.Tanh(), 1))


Networks = continuous.Networks
"""SAC's networks (`jrl.agents.continuous.Networks`): policy_apply: obs [B, *obs_shape] -> (mean [B, A],
log_std [B, A]), of the Gaussian before tanh; q_apply: obs [B, *obs_shape], action [B, A] in [-1, 1]
-> q [2, B]."""


def make_networks(spec: EnvSpec, cfg: Config, module: Optional[Any] = None,
                  critic: Optional[Any] = None) -> Networks:
  """The policy `module` (obs [B, *obs_shape] -> (mean [B, A], log_std [B, A]), before tanh) and
  the twin `critic` ((obs [B, ...], action [B, A] in [-1, 1]) -> q [2, B]): each a flax module
  or an (init, apply) pair; None: MLPs of `cfg.hidden_sizes`."""
  head = lambda action_dim: GaussianPolicyHead(action_dim, tuple(cfg.hidden_sizes), cfg.log_std_min, cfg.log_std_max)
  return continuous.make_networks("sac", spec, cfg.hidden_sizes, head, module, critic)
