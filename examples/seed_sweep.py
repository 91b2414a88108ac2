"""Compare two agents over seeds, with a statistical report: two seed sweeps, then one report.

    .venv/bin/python -m examples.seed_sweep [--seeds 0-4] [--steps 50000] [--out runs/examples/seed_sweep]

Each sweep is `launch.sweep` (one `launch.train` process per seed, `--parallel` at once) into
its own folder under OUT; `launch.report` then reads both and writes OUT/report.md with the
final-return IQM and mean of each agent and their 95% stratified-bootstrap intervals (rliable),
learning curves and performance profiles. OUT is a folder of the examples' own by default, not
`runs/compare`, where the sweeps page has a user's `launch.report` write their comparison (the
example replaced it). The same from a shell:

    .venv/bin/python -m launch.sweep --agent dqn --env CartPole-v1 --seeds 0-4 --run_dir runs/examples/seed_sweep/dqn
    .venv/bin/python -m launch.sweep --agent ppo --env CartPole-v1 --seeds 0-4 --run_dir runs/examples/seed_sweep/ppo
    .venv/bin/python -m launch.report runs/examples/seed_sweep/dqn runs/examples/seed_sweep/ppo \\
        --out runs/examples/seed_sweep
"""

import argparse
import os
import sys
from typing import Optional, Sequence

from launch import report, sweep

OUT = os.path.join("runs", "examples", "seed_sweep")


def main(argv: Optional[Sequence[str]] = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--agents", default="dqn,ppo", help="comma-separated agents (default dqn,ppo)")
  parser.add_argument("--env", default="CartPole-v1")
  parser.add_argument("--seeds", default="0-4")
  parser.add_argument("--steps", type=int, default=50_000)
  parser.add_argument("--parallel", type=int, default=1, help="seeds run at once")
  parser.add_argument("--out", default=OUT, help=f"the comparison's folder (default {OUT})")
  args, train_flags = parser.parse_known_args(argv)  # any other flag goes to every run
  print(f"seed_sweep: {args.agents} on {args.env}, seeds {args.seeds}, into {args.out}/", flush=True)
  folders = []
  for agent in args.agents.split(","):
    folder = os.path.join(args.out, agent)
    status = sweep.main(["--agent", agent, "--env", args.env, "--seeds", args.seeds, "--run_dir", folder,
                         "--parallel", str(args.parallel), "--steps", str(args.steps), *train_flags])
    if status != 0:
      return status
    folders.append(folder)
  return report.main([*folders, "--out", args.out])


if __name__ == "__main__":
  sys.exit(main())
