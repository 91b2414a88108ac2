"""Total actor env-steps/s of the Launchpad program by number of actors and inference placement.

Runs one real local_mp program per (actors, placement), with a learner that
samples little (samples_per_insert 1) so that acting, not learning, is measured.
Steady-state rate: per actor, the median steps/s of the second half of its
metric rows; summed over actors.

  .venv/bin/python bench/distributed_throughput.py [--actors 1,2,4,8] [--steps 40000]
"""

import argparse
import csv
import glob
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def steady_rate(run_dir: str) -> float:
  total = 0.0
  for path in glob.glob(os.path.join(run_dir, "metrics", "actor*.csv")):
    rates = [float(row["steps_per_second"]) for row in csv.DictReader(open(path))]
    late = rates[len(rates) // 2:] or rates
    total += statistics.median(late) if late else 0.0
  return total


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--actors", default="1,2,4,8")
  parser.add_argument("--placements", default="actor,server")
  parser.add_argument("--steps", type=int, default=40_000)
  parser.add_argument("--num_envs", type=int, default=8)
  args = parser.parse_args()
  rows = []
  for n in (int(x) for x in args.actors.split(",")):
    for placement in args.placements.split(","):
      run_dir = tempfile.mkdtemp(prefix=f"bench-{placement}{n}-")
      cmd = [sys.executable, "-m", "launch.train", "--distributed", "--num_actors", str(n), "--inference", placement,
             "--steps", str(args.steps), "--num_envs", str(args.num_envs), "--samples_per_insert", "1",
             "--eval_every", str(10 * args.steps), "--eval_episodes", "2", "--progress_seconds", "0",
             "--run_dir", run_dir]
      out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
      if out.returncode:
        sys.exit(f"{placement} x{n} failed:\n{out.stderr[-2000:]}")
      rows.append((n, placement, steady_rate(run_dir)))
      print(f"actors {n} placement {placement:6s} {rows[-1][2]:9,.0f} env-steps/s", flush=True)
  print(f"\n{os.cpu_count()} CPU cores, {args.num_envs} envs per actor")
  print(f"{'actors':>6} {'actor (local policy)':>20} {'server (central)':>17} {'server/actor':>12}")
  for n in sorted({r[0] for r in rows}):
    by = {p: r for m, p, r in rows if m == n}
    ratio = by["server"] / by["actor"] if by.get("actor") else float("nan")
    print(f"{n:>6} {by.get('actor', float('nan')):>20,.0f} {by.get('server', float('nan')):>17,.0f} {ratio:>12.2f}")


if __name__ == "__main__":
  main()
