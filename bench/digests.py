"""The `--deterministic` parameter digests of every agent, and the device backend's: the bytes a
redesign must keep (or explain). Prints one line per run and writes a JSON table.

  .venv/bin/python bench/digests.py [--out digests.json] [--only dqn,ppo]

Each run is a short `python -m launch.train` in a temporary folder, as a user would start it.
Compare two tables (before and after a change) with `--compare OLD.json NEW.json`, both made on
one machine: XLA's CPU kernels round differently on another processor, so the same code gives
other digests there (every one of the eight differed between two of our machines).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name -> the flags of its run (every run: seed 0, no progress lines).
RUNS = {
    "dqn": ["--agent", "dqn", "--env", "CartPole-v1", "--deterministic", "--steps", "3000"],
    "ppo": ["--agent", "ppo", "--env", "CartPole-v1", "--deterministic", "--steps", "4096"],
    "impala": ["--agent", "impala", "--env", "CartPole-v1", "--deterministic", "--steps", "4000"],
    "sac": ["--agent", "sac", "--env", "Pendulum-v1", "--deterministic", "--steps", "1500"],
    "r2d2": ["--agent", "r2d2", "--env", "CartPole-v1", "--deterministic", "--steps", "2000"],
    "device-dqn": ["--agent", "dqn", "--env", "gymnax:CartPole-v1", "--backend", "device", "--steps", "6000"],
    "device-ppo": ["--agent", "ppo", "--env", "gymnax:CartPole-v1", "--backend", "device", "--steps", "8192"],
    "device-r2d2": ["--agent", "r2d2", "--env", "gymnax:CartPole-v1", "--backend", "device", "--steps", "4000"],
}


def digest_of(flags):
  with tempfile.TemporaryDirectory() as folder:
    run_dir = os.path.join(folder, "run")
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "launch.train", *flags, "--seed", "0", "--eval_every", "1000",
                          "--eval_episodes", "2", "--progress_seconds", "0", "--run_dir", run_dir],
                         cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
      raise SystemExit(f"digests: {' '.join(flags)} failed:\n{out.stderr[-2000:]}")
    summary = json.load(open(os.path.join(run_dir, "summary.json")))
    return summary["params_digest"], time.monotonic() - start


def compare(old_path, new_path) -> int:
  old, new = json.load(open(old_path)), json.load(open(new_path))
  changed = 0
  for name in sorted(set(old) | set(new)):
    a, b = old.get(name), new.get(name)
    same = a == b
    changed += not same
    print(f"{name:12s} {str(a)[:16]:16s} {str(b)[:16]:16s} {'same' if same else 'CHANGED'}")
  return 1 if changed else 0


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out", default="digests.json")
  parser.add_argument("--only", default="", help="comma-separated run names (default: all)")
  parser.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"))
  args = parser.parse_args()
  if args.compare:
    sys.exit(compare(*args.compare))
  names = [n for n in args.only.split(",") if n] or list(RUNS)
  table = {}
  for name in names:
    table[name], seconds = digest_of(RUNS[name])
    print(f"{name:12s} {table[name]} ({seconds:.0f} s)", flush=True)
  with open(args.out, "w") as f:
    json.dump(table, f, indent=2)
  print(f"digests: {len(table)} runs -> {args.out}")


if __name__ == "__main__":
  main()
