"""The same distributed program on three hosts (a real Slurm cluster from network namespaces)
and on one host: start-up time, env steps/s summed over actors, bytes crossing hosts.

  sudo .venv/bin/python bench/multihost.py [--steps 30000] [--num_actors 4]

Needs root and Debian's slurm-wlm + munge (scripts/slurm_test_cluster.sh). Both
programs are DQN on CartPole-v1 with server inference and the same actors; the
three-host one is placed as `--placement` below, with a learner of two processes
on node1 and node2 (the one-host one runs the same two learner processes).
"Start-up" is from the launch command to the first actor metrics row; env
steps/s is the median over each actor's rows after the first, summed; bytes
crossing hosts are the traffic on the hosts' virtual links (vslurm1..3) over
the run, divided by its wall time.
"""

import argparse
import csv
import glob
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTER = os.path.join(ROOT, "scripts", "slurm_test_cluster.sh")
PLACEMENT = "replay,learner,counter,evaluator=node1 learner,inference=node2 actor=node2,node3"


def link_bytes() -> int:
  total = 0
  for i in (1, 2, 3):
    for direction in ("rx", "tx"):
      with open(f"/sys/class/net/vslurm{i}/statistics/{direction}_bytes") as f:
        total += int(f.read())
  return total // 2  # each byte crossing the bridge leaves one link and enters another


def first_actor_row(run_dir: str, start: float, found: dict) -> None:
  while "at" not in found:
    if glob.glob(os.path.join(run_dir, "metrics", "actor*.csv")):
      found["at"] = time.monotonic() - start
    time.sleep(0.1)


def actor_rate(run_dir: str) -> float:
  total = 0.0
  for path in glob.glob(os.path.join(run_dir, "metrics", "actor*.csv")):
    rates = [float(r["steps_per_second"]) for r in csv.DictReader(open(path))][1:]
    total += statistics.median(rates) if rates else 0.0
  return total


def run(args, extra, env, label):
  run_dir = tempfile.mkdtemp(prefix=f"jrl-bench-{label}-")
  os.rmdir(run_dir)
  command = [sys.executable, "-m", "launch.train", "--distributed", "--num_actors", str(args.num_actors),
             "--inference", "server", "--num_processes", "2", "--steps", str(args.steps),
             "--samples_per_insert", "32", "--progress_seconds", "0", "--run_dir", run_dir, *extra]
  found: dict = {}
  before = link_bytes() if label == "three-hosts" else 0
  start = time.monotonic()
  watcher = threading.Thread(target=first_actor_row, args=(run_dir, start, found), daemon=True)
  watcher.start()
  out = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
  wall = time.monotonic() - start
  found.setdefault("at", float("nan"))
  if out.returncode != 0:
    raise SystemExit(f"{label} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
  crossed = (link_bytes() - before) / wall if label == "three-hosts" else 0.0
  return found["at"], actor_rate(run_dir), wall, crossed


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--steps", type=int, default=30_000)
  parser.add_argument("--num_actors", type=int, default=4)
  args = parser.parse_args()
  state = tempfile.mkdtemp(prefix="jrl-slurm-")
  subprocess.run([CLUSTER, "up", state], check=True, capture_output=True)
  env = dict(os.environ, SLURM_CONF=os.path.join(state, "slurm.conf"))
  try:
    three = run(args, ["--launcher", "slurm", "--hosts", "node1,node2,node3", "--placement", PLACEMENT], env,
                "three-hosts")
    one = run(args, [], env, "one-host")
  finally:
    subprocess.run([CLUSTER, "down", state], capture_output=True)
  print(f"DQN CartPole-v1, {args.num_actors} actors, server inference, 2 learner processes, {args.steps} env steps")
  print(f"{'':12s} {'start-up s':>11s} {'env steps/s':>12s} {'wall s':>8s} {'bytes/s across hosts':>21s}")
  for label, (startup, rate, wall, crossed) in (("three hosts", three), ("one host", one)):
    print(f"{label:12s} {startup:11.1f} {rate:12.0f} {wall:8.1f} {crossed:21.0f}")
  print(f"env steps/s three hosts / one host: {three[1] / max(one[1], 1e-9):.2f}")


if __name__ == "__main__":
  main()
