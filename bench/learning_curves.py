"""Many runs' learning curves drawn one after another against drawn by worker processes, in one run.

  .venv/bin/python bench/learning_curves.py [--curves 16,64] [--workers 0,1,2]

A vmapped sweep's runs end together and their curves are drawn together
(`jrl.run.core.draw_learning_curves`). For each number of curves, this writes that many
run folders of metrics shaped like a device PPO run's (33 training rows, 14 evaluations, each
folder its own numbers) and times drawing them with each number of worker processes (0: in this
process, one after another), with matplotlib already imported here, as at a run's end. Prints
seconds per arm and the ratios to drawing here; `plot_workers` says which the sweep would use on
this machine.
"""

import argparse
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from jrl.experiment import plots  # noqa: E402
from jrl.run.core import draw_learning_curves  # noqa: E402


def write_runs(folder: str, count: int):
  """`count` run folders with metrics CSVs: [Curve]."""
  curves = []
  for k in range(count):
    run_dir = os.path.join(folder, f"run{k}")
    os.makedirs(os.path.join(run_dir, "metrics"))
    with open(os.path.join(run_dir, "metrics", "actor.csv"), "w") as f:
      f.write("actor_steps,episode_return\n" + "".join(f"{1024 * (i + 1)},{min(500, 10 + i * (15 + k % 7))}\n"
                                                       for i in range(33)))
    with open(os.path.join(run_dir, "metrics", "evaluator.csv"), "w") as f:
      f.write("actor_steps,eval_return\n" + "".join(f"{2560 * (i + 1)},{min(500.0, 9.5 + i * (40 + k % 5))}\n"
                                                    for i in range(14)))
    curves.append(plots.Curve(run_dir, f"ppo on gymnax:CartPole-v1, seed {k} (device, {count} runs vmapped)", 475.0))
  return curves


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--curves", default="16,64")
  parser.add_argument("--workers", default="0,1,2")
  args = parser.parse_args(argv)
  plots.new_figure()  # matplotlib imported, as in a run's process at its end
  cores = plots.available_cores()
  print(f"{cores} cores\n\n| curves | workers | seconds | over drawn here | plot_workers here |\n|---:|---:|---:|---:|---:|")
  for count in (int(c) for c in args.curves.split(",")):
    folder = tempfile.mkdtemp(prefix="curves-")
    try:
      curves = write_runs(folder, count)
      here = None
      for workers in (int(w) for w in args.workers.split(",")):
        start = time.monotonic()
        draw_learning_curves(curves, workers)
        seconds = time.monotonic() - start
        here = seconds if workers == 0 else here
        ratio = f"{seconds / here:.2f}" if here else "-"
        print(f"| {count} | {workers} | {seconds:.2f} | {ratio} | {plots.plot_workers(count, cores)} |", flush=True)
    finally:
      shutil.rmtree(folder, ignore_errors=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
