"""SAC: the five pure pieces (config, networks, learner, policy, replay spec), and the pieces
to compose your own: the default `Losses` (critic, actor, temperature), `TrainingState`."""

from jrl.agents.sac.acting import make_policy
from jrl.agents.sac.config import Config
from jrl.agents.sac.learning import (Losses, TrainingState, actor_loss, critic_loss, make_learner, sample_actions,
                                     temperature_loss)
from jrl.agents.sac.networks import Networks, make_networks, tanh_gaussian
from jrl.replay.spec import ReplaySpec

loss = Losses()  # the default losses, as `make_learner(..., loss=...)` takes them


def make_replay_spec(cfg: Config) -> ReplaySpec:
  return cfg.replay_spec()


__all__ = ["Config", "Networks", "TrainingState", "make_networks", "make_learner", "make_policy", "make_replay_spec",
           "loss", "Losses", "critic_loss", "actor_loss", "temperature_loss", "sample_actions", "tanh_gaussian"]
