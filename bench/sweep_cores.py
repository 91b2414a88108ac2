"""How a sweep's seeds share a CPU machine: the same seeds one at a time, K at a time sharing every
core, and K at a time pinned to a core each (`launch.sweep --one_core_each`), in one run.

  .venv/bin/python bench/sweep_cores.py [--seeds 0-1] [--steps 25000] [--env MinAtar/SpaceInvaders-v1]
  .venv/bin/python bench/sweep_cores.py --update_ms    # why: one update's time under XLA's CPU settings

Each mode is one `launch.sweep` of DQN with the reference table's MinAtar settings (bench/reference.py:
the seeded replay, `--deterministic`) into a fresh folder, and a last mode runs the pinned runs with
Reverb instead; it prints each mode's wall time (start to exit, compilation included), the runs'
env steps per second and learner updates, and each mode's wall as a ratio of one at a time.
`--update_ms`: milliseconds per DQN update (8 per jitted call, the learner shell fed one placed
batch) on MinAtar's CNN (batch 32, 10x10x6) and CartPole's MLP (batch 128), under XLA's defaults,
one thread, the whole-program runtime, and both (each in a process of its own).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.reference import SETTINGS  # noqa: E402 (the reference table's DQN settings)
from launch.sweep import usable_cores  # noqa: E402

# The reference settings run the seeded replay (--deterministic); the last mode is the same runs
# with Reverb (a server and a sampler thread in each run's process, on its one core).
REVERB = "Reverb replay"
MODES = {"one at a time": ["--parallel", "1"], "K at a time, sharing the cores": ["--parallel", "{k}"],
         "K at a time, a core each": ["--parallel", "{k}", "--one_core_each"],
         f"K at a time, a core each, {REVERB}": ["--parallel", "{k}", "--one_core_each"]}


def run_mode(name, flags, args, folder):
  settings = [f for f in SETTINGS["dqn"]["flags"] if not (REVERB in name and f == "--deterministic")]
  command = [sys.executable, "-m", "launch.sweep", "--agent", "dqn", "--env", args.env, "--seeds", args.seeds,
             "--run_dir", folder, *[f.format(k=args.k) for f in flags], "--steps", str(args.steps),
             "--eval_every", str(args.steps), "--eval_episodes", "2", "--progress_seconds", "0",
             "--checkpoint_every_seconds", "0", *settings]
  start = time.monotonic()
  done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
  wall = time.monotonic() - start
  if done.returncode != 0:
    raise SystemExit(f"sweep_cores: mode '{name}' failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
  runs = []
  for entry in sorted(os.listdir(folder)):
    path = os.path.join(folder, entry, "summary.json")
    if os.path.exists(path):
      with open(path) as f:
        runs.append(json.load(f))
  return {"mode": name, "wall_seconds": round(wall, 1),
          "env_steps_per_s": [round(r["actor_steps"] / r["wall_seconds"]) for r in runs],
          "learner_steps": [r["learner_steps"] for r in runs]}


XLA_SETTINGS = {"defaults": "", "one thread": "--xla_cpu_multi_thread_eigen=false",
                "whole-program runtime": "--xla_cpu_use_thunk_runtime=false",
                "both (--one_core_each)": None}  # None: launch.sweep's ONE_CORE_XLA_FLAGS


def update_ms(network: str, seconds: float = 6.0) -> float:
  """In this process: ms per DQN update on `network` ("cnn": MinAtar, "mlp": CartPole)."""
  import itertools
  import distrax  # noqa: F401 (before anything imports TensorFlow)
  import jax
  import numpy as np
  from jrl.agents import dqn
  from jrl.learners import sharding
  from jrl.learners.learner import Learner
  from jrl.replay.batches import PreparedBatch
  from jrl.specs import EnvSpec
  from jrl.types import LearnerBatch, Transition
  obs, actions, cfg = (((10, 10, 6), 6, dqn.Config(batch_size=32, learning_rate=3e-4)) if network == "cnn"
                       else ((4,), 2, dqn.Config()))
  spec = EnvSpec(obs, np.dtype(np.float32), (), np.dtype(np.int32), num_actions=actions)
  mesh, rng = sharding.make_mesh(1), np.random.default_rng(0)
  lead = (8, cfg.batch_size)
  planes = lambda: (rng.random(lead + obs) < 0.1).astype(np.float32)  # noqa: E731
  host = LearnerBatch(Transition(planes(), rng.integers(0, actions, lead).astype(np.int32),
                                 rng.normal(size=lead).astype(np.float32), np.full(lead, 0.97, np.float32), planes()),
                      np.ones(lead, np.float32))
  placed = PreparedBatch(sharding.put_batch(host, mesh), np.zeros(1, np.uint64), np.zeros(lead, np.int64))
  learner = Learner(dqn.make_learner(dqn.make_networks(spec, cfg), cfg), jax.random.PRNGKey(0),
                    itertools.repeat(placed), mesh=mesh)
  learner.step()  # compile
  calls, start = 0, time.perf_counter()
  while time.perf_counter() - start < seconds:
    learner.step()
    calls += 1
  jax.effects_barrier()
  return (time.perf_counter() - start) / (calls * lead[0]) * 1e3


def compare_update_ms() -> None:
  from launch.sweep import ONE_CORE_XLA_FLAGS
  for network in ("cnn", "mlp"):
    for name, flags in XLA_SETTINGS.items():
      env = dict(os.environ, XLA_FLAGS=ONE_CORE_XLA_FLAGS if flags is None else flags)
      out = subprocess.run([sys.executable, __file__, "--child_update_ms", network], cwd=ROOT, env=env,
                           capture_output=True, text=True)
      if out.returncode != 0:
        raise SystemExit(f"sweep_cores: {network} under {name} failed:\n{out.stderr[-2000:]}")
      print(f"  {network}  {name:24s} {float(out.stdout.strip().splitlines()[-1]):.2f} ms per update", flush=True)


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--seeds", default="0-1")
  parser.add_argument("--k", type=int, default=len(usable_cores()), help="runs at once (default: the cores)")
  parser.add_argument("--steps", type=int, default=25_000)
  parser.add_argument("--env", default="MinAtar/SpaceInvaders-v1")
  parser.add_argument("--update_ms", action="store_true", help="only ms per update under XLA's CPU settings")
  parser.add_argument("--child_update_ms", choices=["cnn", "mlp"], help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child_update_ms:
    print(update_ms(args.child_update_ms))
    return
  if args.update_ms:
    compare_update_ms()
    return
  rows = []
  with tempfile.TemporaryDirectory(prefix="sweep-cores-") as scratch:
    for i, (name, flags) in enumerate(MODES.items()):
      row = run_mode(name, flags, args, os.path.join(scratch, str(i)))
      rows.append(row)
      print(json.dumps(row), flush=True)
  base = rows[0]["wall_seconds"]
  print(f"\n{args.env}, seeds {args.seeds}, {args.steps} env steps each, K={args.k}")
  for row in rows:
    print(f"  {row['mode']:46s} {row['wall_seconds']:7.1f} s  wall / one at a time {row['wall_seconds'] / base:.2f}  "
          f"env-steps/s per run {row['env_steps_per_s']}")


if __name__ == "__main__":
  main()
