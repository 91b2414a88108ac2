"""The MinAtar paper's DQN (Young & Tian, 2019; its examples/dqn.py) as a jrl agent module, to tell
apart what jrl's DQN settings change from what the paper ran where jrl falls short of its anchor.

    python -m launch.train --agent bench.minatar_paper_dqn --env MinAtar/Asterix-v1 --deterministic \\
        --steps 1000000 --batch_size 32 --samples_per_insert 32 --updates_per_call 8 --n_step 1 \\
        --min_replay_size 5000 --max_replay_size 100000 --target_update_period 1000 \\
        --epsilon_decay_steps 100000 --epsilon_final 0.1 --learning_rate 2.5e-4

jrl's DQN pieces with the paper's two other choices: one-step Q-learning targets (the target
network's max, not double Q: `double_q` is False here) and its optimiser, centred RMSProp with
squared-gradient decay 0.95 and 0.01 added to the root (outside it, as PyTorch's RMSprop does),
without gradient clipping. The flags above give the rest: batch 32 and one update per env step
(samples per insert 32), replay 100k from 5k, target copies every 1,000 updates, epsilon 1 to 0.1
over 100k steps, lr 2.5e-4. The network is the same (MinAtar's 16x3x3 conv and 128 units: jrl's
`small_cnn`). MinAtar's gym ids (`-v1`) keep the minimal action set; the paper's script used all 6
actions.
"""

import dataclasses
import sys
from typing import Optional, Sequence

import optax

from jrl import dqn
from jrl.types import LearnerFns


@dataclasses.dataclass(frozen=True)
class Config(dqn.Config):
  """jrl's DQN Config, with the paper's max-Q targets by default."""
  double_q: bool = False            # online net picks the next action, target net values it; False: target net max


Networks = dqn.Networks
TrainingState = dqn.TrainingState
make_networks = dqn.make_networks
make_policy = dqn.make_policy
make_replay_spec = dqn.make_replay_spec


def make_learner(networks: Networks, cfg: Config) -> LearnerFns:
  optimizer = optax.rmsprop(cfg.learning_rate, decay=0.95, eps=0.01, eps_in_sqrt=False, centered=True)
  return dqn.make_learner(networks, cfg, optimizer=optimizer)


def main(argv: Optional[Sequence[str]] = None) -> int:
  from launch.train import main as train
  return train(["--agent", "bench.minatar_paper_dqn", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
  sys.exit(main())
