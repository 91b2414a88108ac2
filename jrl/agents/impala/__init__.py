"""IMPALA: the five pure pieces (the actor-critic network is shared with PPO), and the pieces
to compose your own: the default `loss`, `vtrace`, `make_optimizer`, `TrainingState`."""

from typing import Any, Optional

from jrl.agents import actor_critic
from jrl.agents.impala.acting import make_policy
from jrl.agents.impala.config import Config
from jrl.agents.impala.learning import LossFn, TrainingState, VTraceOutput, loss, make_learner, make_optimizer, vtrace
from jrl.replay.spec import ReplaySpec
from jrl.specs import EnvSpec

Networks = actor_critic.Networks


def make_networks(spec: EnvSpec, cfg: Config, module: Optional[Any] = None) -> Networks:
  """`module`: a flax module obs [B, *obs_shape] -> (policy output, value [B]), or an (init, apply)
  pair; None: the default actor-critic on `cfg.torso` (see `jrl.agents.actor_critic`): a
  categorical head for Discrete actions, a Gaussian for Box ones."""
  return actor_critic.make_networks("impala", spec, cfg.hidden_sizes, module, cfg.torso)


def make_replay_spec(cfg: Config) -> ReplaySpec:
  return cfg.replay_spec()


__all__ = ["Config", "Networks", "TrainingState", "make_networks", "make_learner", "make_policy", "make_replay_spec",
           "loss", "LossFn", "vtrace", "VTraceOutput", "make_optimizer"]
