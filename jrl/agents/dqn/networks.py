"""DQN networks: a Q-network over a Discrete action space."""

from typing import Callable, NamedTuple

import jax.numpy as jnp

from jrl.agents.dqn.config import Config
from jrl.errors import ConfigError
from jrl.networks import QNetwork
from jrl.specs import EnvSpec
from jrl.types import Array, Params, PRNGKey


class Networks(NamedTuple):
  init: Callable[[PRNGKey], Params]
  apply: Callable[[Params, Array], Array]  # obs [B, ...] -> q [B, num_actions]


def make_networks(spec: EnvSpec, cfg: Config) -> Networks:
  if not spec.discrete:
    raise ConfigError("agent", f"dqn needs a Discrete action space, the env has a continuous one "
                               f"(Box of shape {spec.action_shape})")
  module = QNetwork(num_actions=spec.num_actions, hidden_sizes=tuple(cfg.hidden_sizes), dueling=cfg.dueling)
  dummy = jnp.zeros((1,) + spec.observation_shape, jnp.float32)
  return Networks(init=lambda key: module.init(key, dummy), apply=module.apply)
