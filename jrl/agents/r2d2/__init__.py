"""R2D2: the five pure pieces (config, networks, learner, policy, replay spec)."""

from jrl.agents.r2d2.acting import RecurrentActorState, make_policy
from jrl.agents.r2d2.config import Config
from jrl.agents.r2d2.learning import TrainingState, make_learner, r2d2_loss
from jrl.agents.r2d2.networks import Networks, make_networks, unroll

loss = r2d2_loss  # the default loss, under the name the other agents use


def make_replay_spec(cfg: Config):
  return cfg.replay_spec()


__all__ = ["Config", "Networks", "TrainingState", "RecurrentActorState", "make_networks", "make_learner",
           "loss", "r2d2_loss", "make_policy", "make_replay_spec", "unroll"]
