"""Acting throughput of the Launchpad program: inference in the actors vs on a central server.

For each number of actors, one real local_mp program per placement (`--inference actor`:
each actor runs the jitted policy; `server`: actors send observations to one batched
inference server). Acting is measured without the learner's rate limit: min_replay_size
is above the step budget, so the learner never samples and Reverb never holds an insert
(the learner node still runs and serves parameters). Steady-state rate: per actor, the
median steps/s of the second half of its metric rows, summed over actors. The server's
mean batch (requests per batch) and each run's report verdict are printed too.

  .venv/bin/python bench/distributed_throughput.py [--actors 8] [--steps 40000] [--num_envs 8]
  .venv/bin/python bench/distributed_throughput.py --pixels [--steps 8000]   # ALE/Breakout-v5, Nature CNN

`--pixels`: Atari frames (the atari preset, (84, 84, 4) uint8, 28 KB per observation) and DQN's
Nature-DQN CNN (torso auto), where a central server batching a large network can pay; the env is
`--env` (any id) and the agent `--agent` otherwise. Replay holds every inserted transition (nothing
samples): a pixel run of S steps keeps about S x 56 KB in the Reverb node.
"""

import argparse
import csv
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def steady_rate(run_dir: str) -> float:
  total = 0.0
  for path in glob.glob(os.path.join(run_dir, "metrics", "actor*.csv")):
    with open(path) as f:
      rates = [float(row["steps_per_second"]) for row in csv.DictReader(f)]
    late = rates[len(rates) // 2:] or rates
    total += statistics.median(late) if late else 0.0
  return total


def run(n: int, placement: str, args) -> dict:
  run_dir = tempfile.mkdtemp(prefix=f"bench-{placement}{n}-")
  budget = args.steps
  cmd = [sys.executable, "-m", "launch.train", "--distributed", "--num_actors", str(n), "--inference", placement,
         "--agent", args.agent, "--env", args.env,
         "--steps", str(budget), "--num_envs", str(args.num_envs),
         # No learning, so no rate limit: replay never reaches the size the learner needs to sample.
         "--min_replay_size", str(10 * budget), "--max_replay_size", str(20 * budget),
         "--eval_every", str(10 * budget), "--eval_episodes", "1", "--progress_seconds", "0",
         "--checkpoint_every_seconds", "0", "--run_dir", os.path.join(run_dir, "run")]
  if args.timeout_ms:
    cmd += ["--inference_timeout_ms", str(args.timeout_ms)]
  out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
  if out.returncode:
    sys.exit(f"{placement} x{n} failed:\n{out.stderr[-3000:]}")
  with open(os.path.join(run_dir, "run", "summary.json")) as f:
    summary = json.load(f)
  details, rates = summary["details"], summary["rates"]
  return {"rate": steady_rate(os.path.join(run_dir, "run")), "batch_mean": details.get("inference_batch_mean"),
          "run_rate": rates.get("run_env_steps_per_second") or float("nan"),
          "batch_sizes": details.get("inference_batch_sizes", {}),
          "bottleneck": summary.get("bottleneck_advice") or "-", "busy_cores": rates.get("busy_cores")}


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--actors", default="8")
  parser.add_argument("--placements", default="actor,server")
  parser.add_argument("--steps", type=int, default=40_000)
  parser.add_argument("--num_envs", type=int, default=8)
  parser.add_argument("--timeout_ms", type=float, default=0.0, help="--inference_timeout_ms (0: the default)")
  parser.add_argument("--agent", default="dqn")
  parser.add_argument("--env", default="CartPole-v1")
  parser.add_argument("--pixels", action="store_true", help="--env ALE/Breakout-v5 (Nature CNN), 8000 steps unless given")
  args = parser.parse_args()
  if args.pixels:
    args.env = "ALE/Breakout-v5" if args.env == "CartPole-v1" else args.env
    args.steps = 8_000 if args.steps == 40_000 else args.steps
  try:
    load = os.getloadavg()[0]
  except OSError:
    load = float("nan")
  print(f"{args.agent} on {args.env}; {os.cpu_count()} CPU cores, load {load:.1f}; {args.num_envs} envs per actor, "
        f"{args.steps} env steps per run; "
        "acting without the learner's rate limit (min_replay_size above the budget: no sampling, no held inserts)",
        flush=True)
  results = {}
  for n in (int(x) for x in args.actors.split(",")):
    for placement in args.placements.split(","):
      results[n, placement] = r = run(n, placement, args)
      batch = (f", server batch mean {r['batch_mean']:.2f} of {n} (sizes: batches {r['batch_sizes']})"
               if r["batch_mean"] else "")
      print(f"actors {n} placement {placement:6s} {r['rate']:9,.0f} env-steps/s steady, {r['run_rate']:,.0f} over the "
            f"whole run (start-up and compilation included){batch}; busy cores "
            f"{r['busy_cores'] or float('nan'):.1f}; report: {r['bottleneck']}", flush=True)
  print(f"\nsteady state (whole run in brackets)\n{'actors':>6} {'actor (local policy)':>20} {'server (central)':>17} "
        f"{'server/actor':>12} {'batch mean':>10}")
  for n in sorted({k[0] for k in results}):
    actor, server = results.get((n, "actor")), results.get((n, "server"))
    ratio = server["rate"] / actor["rate"] if actor and server and actor["rate"] else float("nan")
    batch = server["batch_mean"] if server and server["batch_mean"] else float("nan")
    whole = server["run_rate"] / actor["run_rate"] if actor and server and actor["run_rate"] else float("nan")
    print(f"{n:>6} {actor['rate'] if actor else float('nan'):>20,.0f} "
          f"{server['rate'] if server else float('nan'):>17,.0f} {ratio:>6.2f} ({whole:.2f}) {batch:>10.2f}")


if __name__ == "__main__":
  main()
