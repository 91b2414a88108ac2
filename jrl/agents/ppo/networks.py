"""PPO networks: separate MLP policy (categorical logits) and value function."""

from typing import Callable, NamedTuple

import flax.linen as nn
import jax.numpy as jnp

from jrl.agents.ppo.config import Config
from jrl.errors import ConfigError
from jrl.networks import MLP
from jrl.specs import EnvSpec
from jrl.types import Array, Params, PRNGKey


class ActorCritic(nn.Module):
  num_actions: int
  hidden_sizes: tuple

  @nn.compact
  def __call__(self, obs):
    logits = nn.Dense(self.num_actions)(MLP(self.hidden_sizes)(obs))
    value = nn.Dense(1)(MLP(self.hidden_sizes)(obs))[..., 0]
    return logits, value


class Networks(NamedTuple):
  init: Callable[[PRNGKey], Params]
  apply: Callable[[Params, Array], tuple]  # obs [B, ...] -> (logits [B, A], value [B])


def make_networks(spec: EnvSpec, cfg: Config) -> Networks:
  if not spec.discrete:
    raise ConfigError("agent", f"{cfg.__module__.split('.')[-2]} supports Discrete action spaces only (no continuous head yet); "
                               f"the env has a Box of shape {spec.action_shape}")
  module = ActorCritic(spec.num_actions, tuple(cfg.hidden_sizes))
  dummy = jnp.zeros((1,) + spec.observation_shape, jnp.float32)
  return Networks(init=lambda key: module.init(key, dummy), apply=module.apply)
