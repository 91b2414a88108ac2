"""TD3 networks: a deterministic tanh policy and twin Q critics, in the normalised action box [-1, 1]."""

from typing import Any, Callable, NamedTuple, Optional, Sequence

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from jrl.agents import continuous
from jrl.agents.modules import init_apply
from jrl.agents.td3.config import Config
from jrl.networks import MLP
from jrl.specs import EnvSpec
from jrl.types import Array, Params, PRNGKey


class DeterministicPolicy(nn.Module):
  """obs [B, ...] -> action [B, A] in [-1, 1] (tanh of a linear layer on an MLP)."""
  action_dim: int
  hidden_sizes: Sequence[int]

  @nn.compact
  def __call__(self, obs):
    return jnp.tanh(nn.Dense(self.action_dim)(MLP(self.hidden_sizes)(obs)))


class Networks(NamedTuple):
  policy_init: Callable[[PRNGKey], Params]
  policy_apply: Callable[[Params, Array], Array]    # obs [B, *obs_shape] -> action [B, A] in [-1, 1]
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
  """The policy `module` (obs [B, *obs_shape] -> action [B, A] in [-1, 1]) and the twin `critic`
  ((obs [B, ...], action [B, A] in [-1, 1]) -> q [2, B]): each a flax module or an (init, apply)
  pair; None: MLPs of `cfg.hidden_sizes`."""
  action_dim = continuous.check_bounded_box("td3", spec)
  policy = module if module is not None else DeterministicPolicy(action_dim, tuple(cfg.hidden_sizes))
  critic = critic if critic is not None else continuous.TwinQ(tuple(cfg.hidden_sizes))
  obs = jnp.zeros((1,) + spec.observation_shape, jnp.float32)
  act = jnp.zeros((1, action_dim), jnp.float32)
  policy_init, policy_apply = init_apply(policy, obs)
  q_init, q_apply = init_apply(critic, obs, act)
  return Networks(policy_init=policy_init, policy_apply=policy_apply, q_init=q_init, q_apply=q_apply,
                  action_low=np.asarray(spec.action_low, np.float32), action_high=np.asarray(spec.action_high, np.float32))
