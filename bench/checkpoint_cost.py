"""What checkpoints cost: size and write time with a full replay, and the slowdown of a run.

  python bench/checkpoint_cost.py [--replay_size 100000] [--steps 60000] [--every_seconds 30]

1. DQN CartPole state with a replay holding `replay_size` transitions, for the
   seeded buffer and for Reverb (its own checkpoint through the client):
   bytes on disk and seconds per checkpoint (median of 3 writes after a warm-up).
2. The same embedded DQN run (seed 0, Reverb) with a checkpoint every
   `every_seconds` against periodic checkpoints off (both write the final one):
   wall time and the ratio.
"""

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jrl import compat  # noqa: E402

compat.import_jax_probability()

import jax  # noqa: E402
import numpy as np  # noqa: E402

from jrl.agents import dqn  # noqa: E402
from jrl.experiment.builder import build_agent_parts, example_transition  # noqa: E402
from jrl.experiment.checkpoint import Checkpointer  # noqa: E402
from jrl.replay.adders import make_block_writer  # noqa: E402
from jrl.experiment.config import ExperimentConfig  # noqa: E402
from jrl.run.embedded import make_replay, run  # noqa: E402
from jrl.learners import sharding  # noqa: E402
from jrl.types import Transition  # noqa: E402


def folder_bytes(path: str) -> int:
  return sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(path) for n in names)


def checkpoint_size_and_time(replay_size: int, deterministic: bool):
  # A rate limiter that never holds inserts: the bench fills replay without a learner sampling it.
  cfg = dqn.Config(max_replay_size=replay_size, samples_per_insert=1e-6)
  parts = build_agent_parts("dqn", "CartPole-v1", cfg)
  exp = ExperimentConfig(deterministic=deterministic)
  run_dir = tempfile.mkdtemp(prefix="jrl-ckpt-bench-")
  replay = make_replay(parts, cfg, exp, cfg.batch_size, sharding.make_mesh(1), run_dir)
  writer = make_block_writer(parts.replay_spec, replay.writer)
  rng = np.random.default_rng(0)
  step = example_transition(parts.env_spec)
  chunk = 1_000
  for _ in range(replay_size // chunk):
    writer.add(Transition(rng.normal(size=(chunk,) + step.observation.shape).astype(np.float32),
                          rng.integers(0, 2, chunk).astype(np.int32), np.ones(chunk, np.float32),
                          np.full(chunk, 0.97, np.float32),
                          rng.normal(size=(chunk,) + step.observation.shape).astype(np.float32)))
  state = dqn.make_learner(parts.networks, cfg).init(jax.random.PRNGKey(0))
  checkpointer = Checkpointer(run_dir, keep=1)
  times = []
  for _ in range(4):
    start = time.perf_counter()
    path = checkpointer.save(state, {"bench": True}, {"actor_steps": replay_size}, write_replay=replay.save)
    times.append(time.perf_counter() - start)
  size = folder_bytes(path)
  replay.close()
  shutil.rmtree(run_dir)
  return size, float(np.median(times[1:])), times[0]


def timed_run(steps: int, every_seconds: float) -> float:
  run_dir = tempfile.mkdtemp(prefix="jrl-ckpt-run-")
  shutil.rmtree(run_dir)
  start = time.perf_counter()
  summary = run(ExperimentConfig(seed=0, steps=steps, checkpoint_every_seconds=every_seconds, progress_seconds=0,
                                 run_dir=run_dir), dqn.Config())
  wall = time.perf_counter() - start
  print(f"  checkpoint_every_seconds={every_seconds:g}: {wall:.1f} s, checkpoints written "
        f"{summary['checkpoints'][-1] if summary['checkpoints'] else '-'}", flush=True)
  shutil.rmtree(run_dir)
  return wall


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--replay_size", type=int, default=100_000)
  parser.add_argument("--steps", type=int, default=60_000)
  parser.add_argument("--every_seconds", type=float, default=30.0)
  args = parser.parse_args()

  print(f"1. DQN CartPole checkpoint with a full {args.replay_size}-transition replay")
  for deterministic in (True, False):
    size, seconds, first = checkpoint_size_and_time(args.replay_size, deterministic)
    kind = "seeded buffer" if deterministic else "reverb"
    print(f"  {kind:13s}: {size / 1e6:.2f} MB, {seconds * 1000:.0f} ms per checkpoint "
          f"(first {first:.2f} s, includes importing orbax)", flush=True)

  print(f"2. embedded DQN run, {args.steps} env steps, seed 0, Reverb")
  with_checkpoints = timed_run(args.steps, args.every_seconds)
  without = timed_run(args.steps, 0.0)
  print(f"  slowdown with a checkpoint every {args.every_seconds:g} s: {with_checkpoints / without:.3f}x")


if __name__ == "__main__":
  main()
