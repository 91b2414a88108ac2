"""SAC networks: a tanh-Gaussian policy and twin Q critics, in the normalised action box [-1, 1]."""

from typing import Any, Callable, NamedTuple, Optional, Sequence

import distrax
import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from jrl.agents import continuous
from jrl.agents.modules import init_apply
from jrl.agents.sac.config import Config
from jrl.networks import MLP
from jrl.specs import EnvSpec
from jrl.types import Array, Params, PRNGKey


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


class Networks(NamedTuple):
  policy_init: Callable[[PRNGKey], Params]
  policy_apply: Callable[[Params, Array], tuple]   # obs [B, *obs_shape] -> (mean [B, A], log_std [B, A])
  q_init: Callable[[PRNGKey], Params]
  q_apply: Callable[[Params, Array, Array], Array]  # obs [B, *obs_shape], action [B, A] in [-1, 1] -> q [2, B]
  action_low: np.ndarray
  action_high: np.ndarray

  def to_env(self, action: Array) -> Array:
    """[-1, 1] -> the env's action bounds."""
    return continuous.to_env(action, self.action_low, self.action_high)

  def from_env(self, action: Array) -> Array:
    return continuous.from_env(action, self.action_low, self.action_high)


def make_networks(spec: EnvSpec, cfg: Config, module: Optional[Any] = None,
                  critic: Optional[Any] = None) -> Networks:
  """The policy `module` (obs [B, *obs_shape] -> (mean [B, A], log_std [B, A]), before tanh) and
  the twin `critic` ((obs [B, ...], action [B, A] in [-1, 1]) -> q [2, B]): each a flax module
  or an (init, apply) pair; None: MLPs of `cfg.hidden_sizes`."""
  action_dim = continuous.check_bounded_box("sac", spec)
  policy = module if module is not None else GaussianPolicyHead(action_dim, tuple(cfg.hidden_sizes),
                                                                 cfg.log_std_min, cfg.log_std_max)
  critic = critic if critic is not None else continuous.TwinQ(tuple(cfg.hidden_sizes))
  obs = jnp.zeros((1,) + spec.observation_shape, jnp.float32)
  act = jnp.zeros((1, action_dim), jnp.float32)
  policy_init, policy_apply = init_apply(policy, obs)
  q_init, q_apply = init_apply(critic, obs, act)
  return Networks(policy_init=policy_init, policy_apply=policy_apply, q_init=q_init, q_apply=q_apply,
                  action_low=np.asarray(spec.action_low, np.float32), action_high=np.asarray(spec.action_high, np.float32))
