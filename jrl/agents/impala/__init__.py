"""IMPALA: the five pure pieces; it shares PPO's actor-critic network."""

from jrl.agents.impala.acting import make_policy
from jrl.agents.impala.config import Config
from jrl.agents.impala.learning import make_learner
from jrl.agents.ppo.networks import make_networks as _make_actor_critic


def make_networks(spec, cfg: Config):
  return _make_actor_critic(spec, cfg)


def make_replay_spec(cfg: Config):
  return cfg.replay_spec()


__all__ = ["Config", "make_networks", "make_learner", "make_policy", "make_replay_spec"]
