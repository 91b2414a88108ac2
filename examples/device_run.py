"""A whole training run compiled into one program on the accelerator (`--backend device`).

    .venv/bin/python -m examples.device_run [--agent ppo] [--steps 200000] [--run_dir runs/device-ppo]

The same agent code as the host backend, on a gymnax env: acting, replay and learning are one
jitted loop (`jrl.run.device`), and the host only logs, evaluates and checkpoints between chunks.
The run directory holds what every run writes (config, metrics, policies, checkpoints, plot,
summary); `--resume RUN_DIR` continues it. The same from a shell:

    .venv/bin/python -m launch.train --backend device --agent ppo --env gymnax:CartPole-v1 --steps 200000
"""

import argparse
import sys
from typing import Optional, Sequence

from jrl.agents import get_agent
from jrl.experiment.config import ExperimentConfig
from jrl.experiment.files import resolve_paths


def main(argv: Optional[Sequence[str]] = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--agent", default="ppo")
  parser.add_argument("--env", default="gymnax:CartPole-v1")
  parser.add_argument("--steps", type=int, default=200_000)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--run_dir", default="")
  args = parser.parse_args(argv)
  from jrl.run.device.runner import run_device  # imports gymnax
  exp = resolve_paths(ExperimentConfig(agent=args.agent, env=args.env, backend="device", steps=args.steps,
                                       seed=args.seed, run_dir=args.run_dir, eval_every=max(args.steps // 10, 1)))
  agent_cfg = get_agent(args.agent).Config()
  summary = run_device(exp, agent_cfg)
  print(f"{args.agent} on {args.env}: best eval {summary['best_eval_return']:.1f}, "
        f"{summary['rates']['env_steps_per_second']:.0f} env-steps/s in the loop | {summary['run_dir']}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
