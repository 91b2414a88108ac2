"""R2D2: the five pure pieces (config, networks, learner, policy, replay spec), and the
pieces to compose your own: the default `loss`, `n_step_targets`, `unroll`, `make_optimizer`."""

from jrl.agents.r2d2.acting import RecurrentActorState, make_policy
from jrl.agents.r2d2.config import Config
from jrl.agents.r2d2.learning import (LossFn, LossOutput, TrainingState, make_learner, make_optimizer, n_step_targets,
                                      r2d2_loss)
from jrl.agents.r2d2.networks import Networks, make_networks, unroll
from jrl.replay.spec import ReplaySpec

loss = r2d2_loss  # the default loss, under the name the other agents use


def make_replay_spec(cfg: Config) -> ReplaySpec:
  return cfg.replay_spec()


__all__ = ["Config", "Networks", "TrainingState", "RecurrentActorState", "make_networks", "make_learner",
           "make_policy", "make_replay_spec", "loss", "r2d2_loss", "LossFn", "LossOutput", "n_step_targets",
           "unroll", "make_optimizer"]
