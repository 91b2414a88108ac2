"""SAC: the five pure pieces (config, networks, learner, policy, replay spec)."""

from jrl.agents.sac.acting import make_policy
from jrl.agents.sac.config import Config
from jrl.agents.sac.learning import make_learner
from jrl.agents.sac.networks import make_networks


def make_replay_spec(cfg: Config):
  return cfg.replay_spec()


__all__ = ["Config", "make_networks", "make_learner", "make_policy", "make_replay_spec"]
