"""PPO: the five pure pieces (config, networks, learner, policy, replay spec), and the
pieces to compose your own: the default minibatch `loss`, `gae_advantages`, `make_optimizer`."""

from jrl.agents.ppo.acting import make_policy
from jrl.agents.ppo.config import Config
from jrl.agents.ppo.learning import (LossFn, Minibatch, TrainingState, clipped_policy_loss, gae_advantages, loss,
                                     make_learner, make_optimizer)
from jrl.agents.ppo.networks import Networks, make_networks
from jrl.replay.spec import ReplaySpec


def make_replay_spec(cfg: Config) -> ReplaySpec:
  return cfg.replay_spec()


__all__ = ["Config", "Networks", "TrainingState", "make_networks", "make_learner", "make_policy", "make_replay_spec",
           "loss", "LossFn", "Minibatch", "gae_advantages", "clipped_policy_loss", "make_optimizer"]
