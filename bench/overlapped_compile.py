"""A device run's set-up with the chunk compiled while the init compiles and runs, against the
same set-up compiled one program after the other, side by side in one run.

  .venv/bin/python bench/overlapped_compile.py [--repeats 3] [--seeds 16] [--agent ppo]
                                               [--env gymnax:CartPole-v1] [--out overlapped_compile.json]

A device run compiles two large programs before its first chunk: the loop's init (envs reset,
networks and optimiser initialised, replay ring allocated) and the chunk. XLA compiles without
holding the GIL, so the run lowers the chunk, hands its compile to a thread
(`jrl.run.device.runner.CompiledMeanwhile`) and compiles and runs the init meanwhile. The
`one after the other` arms replace that class with one that compiles on the host thread before
going on: the set-up as it was. Arms, each in its own process with an empty compilation cache,
alternated `--repeats` times:

  single run   `run_device` (`launch.train --backend device`): one run's DeviceDriver
  sweep        `run_device_sweep` of `--seeds` seeds (`launch.sweep --backend device`)

For each: the set-up seconds (details.setup_seconds: start to the first chunk, run directory
included), the report's compile seconds and the process's wall, as medians over the repeats.
The gain is bounded by the init's compile and by the cores to spare: on a two-core CPU box both
compiles share two cores; on an accelerator host the XLA compiles have many.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

STEPS = 8192  # two chunks: the set-up is what is measured


class CompiledNow:
  """`CompiledMeanwhile`'s interface, compiling on the calling thread before it returns."""

  def __init__(self, compile_program):
    self._program = compile_program()

  def result(self):
    return self._program

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    return None


def child(spec: dict) -> None:
  """One arm in this process: writes its figures to spec["out"]."""
  import dataclasses
  from jrl.agents import get_agent
  from jrl.experiment.config import ExperimentConfig
  from jrl.run.device import runner, sweep
  if spec["serial"]:
    runner.CompiledMeanwhile = sweep.CompiledMeanwhile = CompiledNow
  exp = ExperimentConfig(agent=spec["agent"], env=spec["env"], backend="device", steps=STEPS, progress_seconds=30)
  cfg = get_agent(spec["agent"]).Config()
  if spec["seeds"] == 0:
    summary = runner.run_device(dataclasses.replace(exp, run_dir=os.path.join(spec["folder"], "run")), cfg,
                                chunk_steps=STEPS // 2)
  else:
    seeds = list(range(spec["seeds"]))
    summary = sweep.run_device_sweep(exp, cfg, seeds, [os.path.join(spec["folder"], f"s{s}") for s in seeds],
                                     chunk_steps=STEPS // 2)[0]
  with open(spec["out"], "w") as f:
    json.dump({"setup_seconds": summary["details"]["setup_seconds"],
               "compile_seconds": summary["phase_seconds"]["main"]["compile"]}, f)


def arm(args, seeds: int, serial: bool, folder: str) -> dict:
  run_folder = tempfile.mkdtemp(dir=folder)
  spec = {"agent": args.agent, "env": args.env, "seeds": seeds, "serial": serial, "folder": run_folder,
          "out": os.path.join(run_folder, "figures.json")}
  start = time.monotonic()
  done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)], cwd=ROOT,
                        capture_output=True, text=True,
                        env=dict(os.environ, JRL_JAX_CACHE=os.path.join(run_folder, "jax-cache")))
  if done.returncode != 0:
    raise SystemExit(f"arm failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
  with open(spec["out"]) as f:
    figures = json.load(f)
  return {**figures, "wall_seconds": time.monotonic() - start}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--seeds", type=int, default=16)
  parser.add_argument("--agent", default="ppo")
  parser.add_argument("--env", default="gymnax:CartPole-v1")
  parser.add_argument("--out", default="overlapped_compile.json")
  parser.add_argument("--child", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child:
    child(json.loads(args.child))
    return 0
  folder = tempfile.mkdtemp(prefix="overlapped-compile-")
  kinds = {"single run": 0, f"sweep of {args.seeds}": args.seeds}
  samples = {(kind, serial): [] for kind in kinds for serial in (True, False)}
  for repeat in range(args.repeats):
    for kind, seeds in kinds.items():
      for serial in (True, False):
        samples[(kind, serial)].append(arm(args, seeds, serial, folder))
        print(f"repeat {repeat + 1}/{args.repeats}, {kind}, {'one after the other' if serial else 'overlapped'}: "
              f"{samples[(kind, serial)][-1]}", flush=True)
  median = lambda runs, key: round(statistics.median(r[key] for r in runs), 2)
  record = {"date": time.strftime("%Y-%m-%d"), "agent": args.agent, "env": args.env, "repeats": args.repeats,
            "steps": STEPS, "arms": {}}
  print("\n| arm | set-up s, one after the other | set-up s, overlapped | ratio | compile s (before, after) | "
        "process wall s (before, after) |")
  print("|---|---:|---:|---:|---:|---:|")
  for kind in kinds:
    before, after = samples[(kind, True)], samples[(kind, False)]
    row = {f"{key}_{name}": median(runs, key) for key in ("setup_seconds", "compile_seconds", "wall_seconds")
           for name, runs in (("serial", before), ("overlapped", after))}
    row["setup_ratio"] = round(row["setup_seconds_overlapped"] / row["setup_seconds_serial"], 2)
    record["arms"][kind] = row
    print(f"| {kind} | {row['setup_seconds_serial']} | {row['setup_seconds_overlapped']} | {row['setup_ratio']} | "
          f"{row['compile_seconds_serial']}, {row['compile_seconds_overlapped']} | "
          f"{row['wall_seconds_serial']}, {row['wall_seconds_overlapped']} |")
  with open(args.out, "w") as f:
    json.dump(record, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
