"""A custom agent as a module of five pieces, run by the unchanged command line and shells:

    python -m launch.train --agent examples.my_agent --env CartPole-v1 --steps 20000 [--weight_decay 1e-4]
    python -m launch.train --agent examples.my_agent --distributed --num_actors 2 --steps 20000
    python -m examples.my_agent --steps 20000          # the first line, any train flag may follow

DQN's pieces, recombined without forking them: this file's LayerNorm torso
(`examples.own_loop.QHead`), the squared-TD + weight-decay loss of
`examples.custom_loss`, and a config that adds its own field (a flag: `--weight_decay`).
The module must be importable where the nodes run (from the repo root, or on PYTHONPATH).
"""

import dataclasses
import sys
from typing import Optional, Sequence

from examples.custom_loss import make_loss
from examples.own_loop import QHead
from jrl import dqn
from jrl.errors import ConfigError
from jrl.replay.spec import ReplaySpec
from jrl.specs import EnvSpec
from jrl.types import LearnerFns, PolicyFns


@dataclasses.dataclass(frozen=True)
class Config(dqn.Config):
  """DQN's fields, and this agent's own."""
  weight_decay: float = 1e-4  # L2 penalty on all parameters, added to the squared TD error

  def __post_init__(self):
    super().__post_init__()
    if self.weight_decay < 0:
      raise ConfigError("weight_decay", f"must be >= 0, got {self.weight_decay}")


Networks = dqn.Networks
TrainingState = dqn.TrainingState


def make_networks(spec: EnvSpec, cfg: Config) -> Networks:
  return dqn.make_networks(spec, cfg, module=QHead(spec.num_actions))


def make_learner(networks: Networks, cfg: Config) -> LearnerFns:
  return dqn.make_learner(networks, cfg, loss=make_loss(cfg.weight_decay))


def make_policy(networks: Networks, cfg: Config, evaluation: bool = False) -> PolicyFns:
  return dqn.make_policy(networks, cfg, evaluation)


def make_replay_spec(cfg: Config) -> ReplaySpec:
  return cfg.replay_spec()


def main(argv: Optional[Sequence[str]] = None) -> int:
  from launch.train import main as train
  argv = list(sys.argv[1:] if argv is None else argv)
  return train(["--agent", "examples.my_agent", *argv])


if __name__ == "__main__":
  sys.exit(main())
