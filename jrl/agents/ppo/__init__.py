"""PPO: the five pure pieces (config, networks, learner, policy, replay spec)."""

from jrl.agents.ppo.acting import make_policy
from jrl.agents.ppo.config import Config
from jrl.agents.ppo.learning import make_learner
from jrl.agents.ppo.networks import make_networks


def make_replay_spec(cfg: Config):
  return cfg.replay_spec()


__all__ = ["Config", "make_networks", "make_learner", "make_policy", "make_replay_spec"]
