"""N seeds of one device run: as one vmapped program against N runs one after another.

  .venv/bin/python bench/device_sweep.py [--seeds 16] [--steps 500000] [--agent ppo] [--env gymnax:CartPole-v1]
                                         [--out device_sweep.json]

Both arms are the user's command (`python -m launch.sweep --backend device`, and the same with
`--one_by_one`), each timed from start to exit with a JAX compilation cache of its own that
starts empty: the vmapped arm compiles its one program, the other compiles once and its later
seeds load the cached program (as a user's second run would). Prints each arm's wall time, their
ratio and every seed's best and final evaluation, and writes them to --out.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_arm(name: str, args, extra, folder: str):
  cache = tempfile.mkdtemp(prefix=f"jax-cache-{name}-")
  run_dir = os.path.join(folder, name)
  command = [sys.executable, "-m", "launch.sweep", "--agent", args.agent, "--env", args.env, "--backend", "device",
             "--seeds", f"0-{args.seeds - 1}", "--steps", str(args.steps), "--run_dir", run_dir,
             "--progress_seconds", "30", *extra]
  start = time.monotonic()
  done = subprocess.run(command, cwd=ROOT, env=dict(os.environ, JRL_JAX_CACHE=cache), capture_output=True, text=True)
  wall = time.monotonic() - start
  if done.returncode != 0:
    sys.exit(f"{name} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
  seeds = []
  for seed in range(args.seeds):
    name_dir = next(d for d in os.listdir(run_dir) if d.endswith(f"-s{seed}"))
    with open(os.path.join(run_dir, name_dir, "summary.json")) as f:
      summary = json.load(f)
    seeds.append({"seed": seed, "final": summary["eval_return"], "best": summary["best_eval_return"],
                  "steps_to_threshold": summary["steps_to_threshold"], "digest": summary["params_digest"][:16]})
  print(f"{name:10s} {wall:8.1f} s | reached the threshold: "
        f"{sum(s['steps_to_threshold'] is not None for s in seeds)}/{args.seeds} | finals "
        + " ".join(f"{s['final']:.0f}" for s in seeds), flush=True)
  return {"wall_seconds": round(wall, 1), "seeds": seeds}


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--seeds", type=int, default=16)
  parser.add_argument("--steps", type=int, default=500_000)
  parser.add_argument("--agent", default="ppo")
  parser.add_argument("--env", default="gymnax:CartPole-v1")
  parser.add_argument("--out", default="device_sweep.json")
  args = parser.parse_args()
  folder = tempfile.mkdtemp(prefix="device-sweep-")
  print(f"{args.seeds} seeds of {args.agent} on {args.env}, {args.steps} env steps each, in {folder}", flush=True)
  vmapped = run_arm("vmapped", args, [], folder)
  one_by_one = run_arm("one_by_one", args, ["--one_by_one"], folder)
  ratio = vmapped["wall_seconds"] / one_by_one["wall_seconds"]
  print(f"vmapped / one by one: {ratio:.3f} of the wall time", flush=True)
  with open(args.out, "w") as f:
    json.dump({"agent": args.agent, "env": args.env, "seeds": args.seeds, "steps": args.steps,
               "vmapped": vmapped, "one_by_one": one_by_one, "wall_ratio": round(ratio, 3)}, f, indent=1)


if __name__ == "__main__":
  main()
