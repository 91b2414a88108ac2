"""TD3: the five pure pieces (config, networks, learner, policy, replay spec), and the pieces to
compose your own: the default `Losses` (critic, actor), `critic_targets`, `TrainingState`."""

from jrl.agents.td3.acting import make_policy
from jrl.agents.td3.config import Config
from jrl.agents.td3.learning import (Losses, TrainingState, actor_loss, critic_loss, critic_targets, make_learner,
                                     smoothed_target_action)
from jrl.agents.td3.networks import DeterministicPolicy, Networks, make_networks
from jrl.replay.spec import ReplaySpec

loss = Losses()  # the default losses, as `make_learner(..., loss=...)` takes them


def make_replay_spec(cfg: Config) -> ReplaySpec:
  return cfg.replay_spec()


__all__ = ["Config", "Networks", "TrainingState", "make_networks", "make_learner", "make_policy", "make_replay_spec",
           "loss", "Losses", "critic_loss", "actor_loss", "critic_targets", "smoothed_target_action",
           "DeterministicPolicy"]
