"""IMPALA: the five pure pieces; the actor-critic network is shared with PPO."""

from jrl.agents import actor_critic
from jrl.agents.impala.acting import make_policy
from jrl.agents.impala.config import Config
from jrl.agents.impala.learning import make_learner


def make_networks(spec, cfg: Config) -> actor_critic.Networks:
  return actor_critic.make_networks("impala", spec, cfg.hidden_sizes)


def make_replay_spec(cfg: Config):
  return cfg.replay_spec()


__all__ = ["Config", "make_networks", "make_learner", "make_policy", "make_replay_spec"]
