"""The host's share of a vmapped device sweep: one seed against N, side by side in one run.

  .venv/bin/python bench/device_host_share.py [--seeds 16] [--steps 500000] [--syncs 32]
                                              [--agent ppo] [--env gymnax:CartPole-v1] [--arms both|typed|same]
                                              [--out host_share.json]

The device-loop issue asks that the host's work of a sweep (each run report's `eval` + `other`
seconds) not grow with its runs. Two pairs of arms, each arm its own process:

  as typed     `python -m launch.sweep --backend device --seeds 0` and `--seeds 0-(N-1)`, jrl's
               defaults: chunks are sized by wall time (about a second each), so on an
               accelerator, where N vmapped seeds take about one seed's time, both sync with the
               host about as often. On a CPU, N seeds take about N times the compute and so sync
               about N times as often: this pair's ratio there is that of the chunk counts more
               than of the host's work per sync.
  same syncs   the same two sweeps with chunks of a fixed length (`run_device_sweep`'s
               `chunk_steps`, steps / --syncs), so both make the same number of host syncs: the
               accelerator's condition, reproduced on any machine. Its ratio is the one the issue
               means.

For each arm: wall, loop, compile and host seconds (eval + other), the number of host syncs
(`details.host_syncs`) and host milliseconds per sync, and the process's seconds outside its runs
(the process's wall less a run's: start-up and imports, flag checks, each run's report and plots,
and for the as-typed arms `launch.sweep`'s sweep report; what a user waits for beyond the runs). `--arms same` runs the same-syncs pair
only. Prints a table and writes --out. Run it on a quiet machine: the host figures are seconds
of wall.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)


def child(spec: dict) -> None:
  """One sweep in this process with fixed chunks (`spec`: agent, env, seeds, steps, chunk_steps, folder)."""
  from jrl.agents import get_agent
  from jrl.experiment.config import ExperimentConfig
  from jrl.run.device.sweep import run_device_sweep
  exp = ExperimentConfig(agent=spec["agent"], env=spec["env"], backend="device", steps=spec["steps"],
                         progress_seconds=30)
  seeds = list(range(spec["seeds"]))
  run_device_sweep(exp, get_agent(spec["agent"]).Config(), seeds,
                   [os.path.join(spec["folder"], f"s{seed}") for seed in seeds], chunk_steps=spec["chunk_steps"])


def figures(run_dirs, wall: float) -> dict:
  """An arm's figures from its runs' summaries (every run of a vmapped sweep reports the sweep's phases)."""
  summaries = []
  for run_dir in run_dirs:
    with open(os.path.join(run_dir, "summary.json")) as f:
      summaries.append(json.load(f))
  phases = summaries[0]["phase_seconds"]["main"]
  details = summaries[0]["details"]
  host = phases["eval"] + phases["other"]
  syncs = details.get("host_syncs")
  return {"wall_seconds": round(wall, 1), "loop_seconds": round(phases["device_loop"], 2),
          "compile_seconds": round(phases["compile"], 2), "host_seconds": round(host, 3), "host_syncs": syncs,
          "host_ms_per_sync": round(1e3 * host / syncs, 2) if syncs else None,
          "outside_runs_seconds": round(wall - max(s["wall_seconds"] for s in summaries), 2),
          "best_min": min(s["best_eval_return"] for s in summaries)}


def run(command, folder: str) -> float:
  start = time.monotonic()
  done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                        env=dict(os.environ, JRL_JAX_CACHE=os.path.join(folder, "jax-cache")))
  if done.returncode != 0:
    raise SystemExit(f"{' '.join(command)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
  return time.monotonic() - start


def as_typed(args, seeds: int, folder: str) -> dict:
  run_dir = os.path.join(folder, f"typed-{seeds}")
  wall = run([sys.executable, "-m", "launch.sweep", "--agent", args.agent, "--env", args.env, "--backend", "device",
              "--seeds", f"0-{seeds - 1}" if seeds > 1 else "0", "--steps", str(args.steps), "--run_dir", run_dir,
              "--progress_seconds", "30"], folder)
  return figures([os.path.join(run_dir, d) for d in sorted(os.listdir(run_dir))
                  if os.path.isfile(os.path.join(run_dir, d, "summary.json"))], wall)


def same_syncs(args, seeds: int, folder: str) -> dict:
  run_dir = os.path.join(folder, f"fixed-{seeds}")
  spec = {"agent": args.agent, "env": args.env, "seeds": seeds, "steps": args.steps,
          "chunk_steps": args.steps // args.syncs, "folder": run_dir}
  wall = run([sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)], folder)
  return figures([os.path.join(run_dir, f"s{seed}") for seed in range(seeds)], wall)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--seeds", type=int, default=16)
  parser.add_argument("--steps", type=int, default=500_000)
  parser.add_argument("--syncs", type=int, default=32, help="host syncs of the 'same syncs' arms")
  parser.add_argument("--agent", default="ppo")
  parser.add_argument("--env", default="gymnax:CartPole-v1")
  parser.add_argument("--arms", choices=("both", "typed", "same"), default="both")
  parser.add_argument("--out", default="host_share.json")
  parser.add_argument("--child", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child:
    child(json.loads(args.child))
    return 0
  folder = tempfile.mkdtemp(prefix="host-share-")
  record = {"date": time.strftime("%Y-%m-%d"), "seeds": args.seeds, "steps": args.steps, "syncs": args.syncs,
            "agent": args.agent, "env": args.env, "arms": {}}
  pairs = {"typed": [("as typed", as_typed)], "same": [("same syncs", same_syncs)]}
  for name, arm in pairs.get(args.arms, pairs["typed"] + pairs["same"]):
    for seeds in (1, args.seeds):
      record["arms"][f"{name}, {seeds} seed{'s' if seeds > 1 else ''}"] = arm(args, seeds, folder)
      print(f"{name}, {seeds} seeds: {record['arms'][list(record['arms'])[-1]]}", flush=True)
    one, many = (record["arms"][f"{name}, {n} seed{'s' if n > 1 else ''}"] for n in (1, args.seeds))
    record[f"{name}: host ratio"] = round(many["host_seconds"] / one["host_seconds"], 2)
    record[f"{name}: host share of a single run's wall"] = round(one["host_seconds"] / one["wall_seconds"], 3)
  with open(args.out, "w") as f:
    json.dump(record, f, indent=1)
  print("\n| arm | wall s | loop s | compile s | host s (eval + other) | host syncs | host ms/sync | outside runs s |")
  print("|---|---:|---:|---:|---:|---:|---:|---:|")
  for name, a in record["arms"].items():
    print(f"| {name} | {a['wall_seconds']} | {a['loop_seconds']} | {a['compile_seconds']} | {a['host_seconds']} | "
          f"{a['host_syncs']} | {a['host_ms_per_sync']} | {a['outside_runs_seconds']} |")
  for key in record:
    if key.endswith("ratio") or key.endswith("wall"):
      print(f"{key}: {record[key]}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
