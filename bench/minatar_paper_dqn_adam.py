"""An ablation of `bench.minatar_paper_dqn`: the paper's one-step max-Q targets with jrl's optimiser
(Adam, gradient norm clipped at `max_grad_norm`) instead of the paper's centred RMSProp, which is
jrl's `dqn` with `--double_q false`. With the flags of that module's docstring (`--agent
bench.minatar_paper_dqn_adam`), it tells whether jrl's shortfall on Asterix comes from the
optimiser or from the targets.
"""

import sys
from typing import Optional, Sequence

from bench.minatar_paper_dqn import (Config, Networks, TrainingState, make_networks, make_policy,  # noqa: F401
                                     make_replay_spec)
from jrl import dqn
from jrl.types import LearnerFns


def make_learner(networks: Networks, cfg: Config) -> LearnerFns:
  return dqn.make_learner(networks, cfg)


def main(argv: Optional[Sequence[str]] = None) -> int:
  from launch.train import main as train
  return train(["--agent", "bench.minatar_paper_dqn_adam", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
  sys.exit(main())
