"""PPO on CartPole-v1 to the first greedy evaluation >= 475: jrl's program on Ray and on Launchpad (2 actors
each) beside RLlib's PPO (Ray 2.60's new API stack, its tuned CartPole example, 2 env runners), one box, one
evaluation protocol: 10 greedy episodes after every 4,000 env steps (RLlib's training iteration).

  python bench/ray_vs_rllib.py --seeds 0,1 --out ray_vs_rllib.json \\
      [--ray_python .venv-core/bin/python] [--launchpad_python .venv/bin/python] \\
      [--rllib_python PEER_VENV/bin/python --rllib_script ../shared/peers/rllib_time_to_solve.py]

An arm whose interpreter is missing is skipped with a line saying so. Per arm and seed: the env steps and
seconds to the threshold (seconds in the run, from its first env step, as RLlib's script counts them from
its built algorithm), env-steps/s, the whole process's wall, and its start-up (process wall less the
in-run seconds: interpreter, imports, the engine and the nodes starting, and the exit). Ratios to RLlib's
at the end. Run it alone on the machine: the arms are timed.
"""

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
THRESHOLD = 475.0
EVAL_EVERY = 4000
BUDGET = 200_000


def jrl_arm(python: str, engine: str, seed: int) -> dict:
  with tempfile.TemporaryDirectory() as folder:
    run_dir = os.path.join(folder, "run")
    start = time.monotonic()
    out = subprocess.run([python, "-m", "launch.train", "--agent", "ppo", "--env", "CartPole-v1", "--distributed",
                          "--engine", engine, "--num_actors", "2", "--seed", str(seed), "--steps", str(BUDGET),
                          "--eval_every", str(EVAL_EVERY), "--eval_episodes", "10", "--stop_at_threshold",
                          "--progress_seconds", "0", "--run_dir", run_dir],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    process_wall = time.monotonic() - start
    if out.returncode != 0:
      return {"arm": f"jrl-{engine}", "seed": seed, "error": out.stderr.strip().splitlines()[-1:]}
    with open(os.path.join(run_dir, "summary.json")) as f:
      summary = json.load(f)
    hit = None
    with open(os.path.join(run_dir, "metrics", "evaluator.csv")) as f:
      for row in csv.DictReader(f):
        if float(row["eval_return"]) >= THRESHOLD:
          hit = row
          break
    in_run = summary["wall_seconds"]
    return {"arm": f"jrl-{engine}", "seed": seed,
            "steps_to_threshold": summary["steps_to_threshold"],
            "seconds_to_threshold": hit and round(float(hit["wall_seconds"]), 1),
            "env_steps_per_s": round(summary["actor_steps"] / in_run, 1), "in_run_seconds": round(in_run, 1),
            "process_wall": round(process_wall, 1), "startup_seconds": round(process_wall - in_run, 1),
            "best_eval": summary["best_eval_return"]}


def rllib_arm(python: str, script: str, seed: int) -> dict:
  start = time.monotonic()
  out = subprocess.run([python, script, "2", str(seed)], capture_output=True, text=True, timeout=900)
  process_wall = time.monotonic() - start
  lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
  if out.returncode != 0 or not lines:
    return {"arm": "rllib", "seed": seed, "error": out.stderr.strip().splitlines()[-1:]}
  peer = json.loads(lines[-1])
  return {"arm": "rllib", "seed": seed, "steps_to_threshold": peer["steps_to_threshold"],
          "seconds_to_threshold": peer["wall_to_threshold"], "env_steps_per_s": peer["env_steps_per_s"],
          "in_run_seconds": peer["wall_total"], "process_wall": round(process_wall, 1),
          "startup_seconds": round(process_wall - peer["wall_total"], 1), "best_eval": peer["best_eval"]}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seeds", default="0")
  parser.add_argument("--ray_python", default=os.path.join(ROOT, ".venv-core", "bin", "python"))
  parser.add_argument("--launchpad_python", default=os.path.join(ROOT, ".venv", "bin", "python"))
  parser.add_argument("--rllib_python", default="")
  parser.add_argument("--rllib_script", default=os.path.join(ROOT, "..", "shared", "peers", "rllib_time_to_solve.py"))
  parser.add_argument("--out", default="ray_vs_rllib.json")
  args = parser.parse_args()
  arms = [("jrl-ray", args.ray_python, lambda s: jrl_arm(args.ray_python, "ray", s)),
          ("jrl-launchpad", args.launchpad_python, lambda s: jrl_arm(args.launchpad_python, "launchpad", s)),
          ("rllib", args.rllib_python, lambda s: rllib_arm(args.rllib_python, args.rllib_script, s))]
  rows = []
  for seed in (int(s) for s in args.seeds.split(",")):
    for name, python, run in arms:
      if not python or not os.path.exists(python):
        print(f"{name}: skipped (no interpreter at '{python}')", flush=True)
        continue
      row = run(seed)
      rows.append(row)
      print(json.dumps(row), flush=True)
  by_arm = {}
  for row in rows:
    if row.get("seconds_to_threshold"):
      by_arm.setdefault(row["arm"], []).append(row)
  mean = lambda arm, key: sum(r[key] for r in by_arm[arm]) / len(by_arm[arm])  # noqa: E731
  if "rllib" in by_arm:
    for arm in by_arm:
      print(f"{arm}: time to threshold {mean(arm, 'seconds_to_threshold'):.1f} s "
            f"({mean(arm, 'seconds_to_threshold') / mean('rllib', 'seconds_to_threshold'):.2f} of RLlib's), process "
            f"wall {mean(arm, 'process_wall'):.1f} s ({mean(arm, 'process_wall') / mean('rllib', 'process_wall'):.2f}), "
            f"start-up {mean(arm, 'startup_seconds'):.1f} s, {mean(arm, 'env_steps_per_s'):.0f} env-steps/s")
  with open(args.out, "w") as f:
    json.dump(rows, f, indent=1)


if __name__ == "__main__":
  sys.exit(main())
