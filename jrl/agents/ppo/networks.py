"""PPO networks: the shared actor-critic (separate policy and value MLPs)."""

from jrl.agents import actor_critic
from jrl.agents.ppo.config import Config
from jrl.specs import EnvSpec

Networks = actor_critic.Networks


def make_networks(spec: EnvSpec, cfg: Config) -> Networks:
  return actor_critic.make_networks("ppo", spec, cfg.hidden_sizes)
