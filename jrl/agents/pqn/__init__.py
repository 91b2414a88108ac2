"""PQN: the five pure pieces (config, networks, learner, policy, replay spec), and the pieces
to compose your own: the default minibatch `loss`, `q_lambda_targets`, `make_optimizer`."""

from jrl.agents.pqn.acting import epsilon_schedule, make_policy
from jrl.agents.pqn.config import Config
from jrl.agents.pqn.learning import (LossFn, Minibatch, TrainingState, loss, make_learner, make_optimizer,
                                     q_lambda_targets)
from jrl.agents.pqn.networks import LayerNormMLP, Networks, QNetwork, make_networks
from jrl.replay.spec import ReplaySpec


def make_replay_spec(cfg: Config) -> ReplaySpec:
  return cfg.replay_spec()


__all__ = ["Config", "Networks", "TrainingState", "make_networks", "make_learner", "make_policy", "make_replay_spec",
           "loss", "LossFn", "Minibatch", "q_lambda_targets", "make_optimizer", "epsilon_schedule", "QNetwork",
           "LayerNormMLP"]
