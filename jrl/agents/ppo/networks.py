"""PPO networks: the shared actor-critic (separate policy and value MLPs)."""

from typing import Any, Optional

from jrl.agents import actor_critic
from jrl.agents.ppo.config import Config
from jrl.specs import EnvSpec

Networks = actor_critic.Networks


def make_networks(spec: EnvSpec, cfg: Config, module: Optional[Any] = None) -> Networks:
  """`module`: a flax module obs [B, *obs_shape] -> (policy output, value [B]), or an (init, apply)
  pair; None: the default actor-critic on `cfg.torso` (see `jrl.agents.actor_critic`): a
  categorical head for Discrete actions, a Gaussian for Box ones."""
  return actor_critic.make_networks("ppo", spec, cfg.hidden_sizes, module, cfg.torso)
