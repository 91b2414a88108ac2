"""TD3 and PQN beside the agents they are measured against, same budget and seed, in one run.

  .venv/bin/python bench/new_agents.py [--only halfcheetah,breakout] [--seed 0] [--out new_agents.json]
                                      [--steps PAIR=N ...]   (e.g. --steps halfcheetah=100000)

  halfcheetah: TD3 and SAC on HalfCheetah-v5 (MuJoCo), 300k env steps each, embedded with
               --deterministic replay, their defaults (8 envs, one update per env step).
  breakout:    PQN and PPO on gymnax:Breakout-MinAtar with --backend device, 2M env steps each,
               128 envs; PQN with purejaxql's MinAtar settings, PPO with the settings of its
               MinAtar row in docs/agents/ppo.md (both listed in PAIRS below).

Each run is `python -m launch.train` in its own process and folder, one after another (run it
on a quiet machine: the wall times are compared). With --side_by_side the two runs of a pair
go at once, each pinned to a core of its own with XLA on one thread, so that both see the same
machine for the whole run. Prints one line per run and the
ratios of each pair (new / reference), and writes them as JSON.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HALFCHEETAH = ["--env", "HalfCheetah-v5", "--deterministic", "--steps", "300000", "--eval_every", "50000",
               "--eval_episodes", "5"]
BREAKOUT = ["--env", "gymnax:Breakout-MinAtar", "--backend", "device", "--steps", "2000000", "--num_envs", "128",
            "--eval_every", "200000", "--eval_episodes", "32"]
# pair -> (new agent's run, reference agent's run): name, flags.
PAIRS = {
    "halfcheetah": (("td3", ["--agent", "td3", *HALFCHEETAH]), ("sac", ["--agent", "sac", *HALFCHEETAH])),
    "breakout": (
        ("pqn", ["--agent", "pqn", *BREAKOUT, "--batch_size", "128", "--sequence_length", "32", "--num_minibatches",
                 "32", "--num_epochs", "2", "--learning_rate", "5e-4", "--q_lambda", "0.65",
                 "--epsilon_decay_steps", "200000"]),
        ("ppo", ["--agent", "ppo", *BREAKOUT, "--batch_size", "128", "--sequence_length", "32", "--num_minibatches",
                 "8", "--num_epochs", "4", "--learning_rate", "5e-4"])),
}


def start(name: str, flags, folder: str, seed: int, steps=None, core=None):
  """Starts one run; on `core` (an int) it is pinned there with XLA on one thread."""
  run_dir = os.path.join(folder, name)
  budget = ["--steps", str(steps)] if steps else []  # after the pair's own --steps: the last one counts
  command = [sys.executable, "-m", "launch.train", *flags, *budget, "--seed", str(seed), "--run_dir", run_dir,
             "--progress_seconds", "60", "--checkpoint_every_seconds", "0"]
  print("$", " ".join(command[1:]), flush=True)
  env, pin = dict(os.environ), None
  if core is not None:
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                        " --xla_cpu_multi_thread_eigen=false").strip()
    pin = lambda: os.sched_setaffinity(0, {core})  # noqa: E731 (runs in the child before exec)
  return name, run_dir, time.monotonic(), subprocess.Popen(command, cwd=ROOT, env=env, preexec_fn=pin)


def finish(started) -> dict:
  name, run_dir, start_time, process = started
  if process.wait() != 0:
    raise SystemExit(f"new_agents: run {name} failed with exit code {process.returncode}")
  wall = time.monotonic() - start_time
  summary = json.load(open(os.path.join(run_dir, "summary.json")))
  row = {"run": name, "eval_return": summary["eval_return"], "best_eval_return": summary["best_eval_return"],
         "env_steps": summary["actor_steps"], "learner_steps": summary["learner_steps"],
         "wall_seconds": round(wall, 1), "run_wall_seconds": summary["wall_seconds"]}
  print(f"  {name}: final eval {row['eval_return']:.1f}, best {row['best_eval_return']:.1f}, "
        f"{row['env_steps']} env steps, {row['wall_seconds']:.0f} s", flush=True)
  return row


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--only", default="", help="comma-separated pairs (default: all): " + ", ".join(PAIRS))
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--out", default="new_agents.json")
  parser.add_argument("--side_by_side", action="store_true",
                      help="run each pair's two runs at once, one per core (needs 2 cores)")
  parser.add_argument("--steps", nargs="*", default=[], metavar="PAIR=N",
                      help="a smaller (or larger) env-step budget for a pair, e.g. halfcheetah=100000")
  args = parser.parse_args()
  try:
    budgets = {pair: int(n) for pair, n in (item.split("=") for item in args.steps)}
  except ValueError:
    parser.error(f"steps: expected PAIR=N items, got {' '.join(args.steps)}")
  names = args.only.split(",") if args.only else list(PAIRS)
  unknown = [n for n in names + list(budgets) if n not in PAIRS]
  if unknown:
    parser.error(f"only: unknown pair(s) {', '.join(unknown)} (known: {', '.join(PAIRS)})")
  folder = tempfile.mkdtemp(prefix="bench-new-agents-")
  results = {}
  for pair in names:
    (new, new_flags), (ref, ref_flags) = PAIRS[pair]
    steps = budgets.get(pair)
    if args.side_by_side:
      started = [start(new, new_flags, folder, args.seed, steps, core=0),
                 start(ref, ref_flags, folder, args.seed, steps, core=1)]
      rows = [finish(s) for s in started]
    else:
      rows = [finish(start(new, new_flags, folder, args.seed, steps)),
              finish(start(ref, ref_flags, folder, args.seed, steps))]
    ratio = {"wall": rows[0]["wall_seconds"] / rows[1]["wall_seconds"],
             "best_eval_minus_reference": rows[0]["best_eval_return"] - rows[1]["best_eval_return"]}
    results[pair] = {"runs": rows, "ratio": ratio}
    print(f"{pair}: {new}/{ref} wall {ratio['wall']:.2f}x; best eval {rows[0]['best_eval_return']:.1f} vs "
          f"{rows[1]['best_eval_return']:.1f}", flush=True)
  with open(args.out, "w") as f:
    json.dump(results, f, indent=2)
  print(f"new_agents: {args.out} (runs in {folder})")


if __name__ == "__main__":
  main()
