"""Device runs' final policies evaluated both ways, greedy (the mode) and sampling the policy, on the
episodes of each run's own final evaluation: what the choice of `greedy_eval` alone makes of a score.

  .venv/bin/python bench/eval_protocols.py RUN_DIR [RUN_DIR ...] [--out protocols.json]

A RUN_DIR may be a run or a folder of runs (a sweep's). The episodes are those the run's final
evaluation played (its evaluator seed and index, as `launch.evaluate` replays them), so the
figure of the protocol the run used equals its recorded one to the bit; the other is what the
same parameters score the other way. Training does not depend on the evaluation policy, so the
other figure is also what the same command with the other `greedy_eval` would have recorded.
Prints a line per run and a mean per env; writes --out.
"""

import argparse
import dataclasses
import json
import os
import sys
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)


def run_dirs(paths):
  for path in paths:
    if os.path.isfile(os.path.join(path, "config.json")):
      yield path
    else:
      yield from sorted(os.path.join(path, name) for name in os.listdir(path)
                        if os.path.isfile(os.path.join(path, name, "config.json")))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("run_dirs", nargs="+")
  parser.add_argument("--out", default=None)
  args = parser.parse_args()
  import rlax, distrax  # noqa: F401,E401  (TFP before anything that may import TensorFlow)
  import numpy as np
  from jrl.experiment.snapshots import load_snapshot
  from launch.evaluate import device_player, evaluation_seed

  plays, rows, by_env = {}, [], defaultdict(list)
  for run_dir in run_dirs(args.run_dirs):
    snap = load_snapshot(run_dir, "final")
    exp, parts = snap.experiment, snap.parts
    if exp.backend != "device":
      print(f"{run_dir}: not a device run, skipped")
      continue
    seed, index = evaluation_seed(exp, snap.info)
    episodes = int(snap.info.get("eval_episodes", exp.eval_episodes))
    row = {"run_dir": run_dir, "env": exp.env, "seed": exp.seed, "recorded": snap.info.get("eval_return"),
           "greedy_eval": snap.agent_config.greedy_eval}
    for greedy in (True, False):
      cfg = dataclasses.replace(snap.agent_config, greedy_eval=greedy)
      play_key = (exp.env, repr(cfg), episodes)  # a sweep's runs share it: one compilation for all its seeds
      if play_key not in plays:
        plays[play_key] = device_player(exp, parts.agent.make_policy(parts.networks, cfg, evaluation=True), episodes)
      row["greedy" if greedy else "sampled"] = float(plays[play_key](snap.params, seed, index).mean())
    rows.append(row)
    by_env[exp.env].append(row)
    print(f"{run_dir}: recorded {row['recorded']:.3f} | greedy {row['greedy']:.3f} | sampled {row['sampled']:.3f}",
          flush=True)
  for env, members in by_env.items():
    print(f"{env}: {len(members)} runs, mean greedy {np.mean([r['greedy'] for r in members]):.2f}, "
          f"mean sampled {np.mean([r['sampled'] for r in members]):.2f}")
  if args.out:
    with open(args.out, "w") as f:
      json.dump(rows, f, indent=1)


if __name__ == "__main__":
  main()
