"""DQN: the five pure pieces (config, networks, learner, policy, replay spec)."""

from jrl.agents.dqn.acting import make_policy
from jrl.agents.dqn.config import Config
from jrl.agents.dqn.learning import make_learner
from jrl.agents.dqn.networks import make_networks


def make_replay_spec(cfg: Config):
  return cfg.replay_spec()


__all__ = ["Config", "make_networks", "make_learner", "make_policy", "make_replay_spec"]
