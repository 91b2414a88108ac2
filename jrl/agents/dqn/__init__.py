"""DQN: the five pure pieces (config, networks, learner, policy, replay spec), and the
pieces to compose your own: the default `loss`, `td_errors`, `make_optimizer`, `TrainingState`."""

from jrl.agents.dqn.acting import make_policy
from jrl.agents.dqn.config import Config
from jrl.agents.dqn.learning import LossFn, TrainingState, loss, make_learner, make_optimizer, td_errors
from jrl.agents.dqn.networks import Networks, make_networks
from jrl.replay.spec import ReplaySpec


def make_replay_spec(cfg: Config) -> ReplaySpec:
  return cfg.replay_spec()


__all__ = ["Config", "Networks", "TrainingState", "make_networks", "make_learner", "make_policy", "make_replay_spec",
           "loss", "LossFn", "td_errors", "make_optimizer"]
