"""Learner updates/s and samples/s by device count and by updates per call, in one run.

Each device count runs in its own process (forced CPU devices must be set
before JAX starts); the learner shell is fed pre-placed batches so the figures
isolate the sharded update. Ratios are against 1 device, 1 update per call.

  .venv/bin/python bench/learner_sharding.py [--devices 1,2,4] [--updates_per_call 1,4,16]
      [--hidden_sizes 64,64] [--batch_size 256] [--seconds 3]
On an accelerator, `--devices 0` uses the real devices instead of forced CPU ones.
"""

import argparse
import itertools
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child(args):
  import distrax  # noqa: F401
  import jax
  import numpy as np

  from jrl.agents import dqn
  from jrl.learners import sharding
  from jrl.learners.learner import Learner
  from jrl.replay.batches import PreparedBatch
  from jrl.specs import EnvSpec
  from jrl.types import LearnerBatch, Transition

  spec = EnvSpec((args.obs_dim,), np.dtype(np.float32), (), np.dtype(np.int32), num_actions=4)
  cfg = dqn.Config(hidden_sizes=tuple(int(h) for h in args.hidden_sizes.split(",")), batch_size=args.batch_size)
  fns = dqn.make_learner(dqn.make_networks(spec, cfg), cfg)
  mesh = sharding.make_mesh(args.child_devices)
  rng = np.random.default_rng(0)
  for u in (int(x) for x in args.updates_per_call.split(",")):
    lead = (u, args.batch_size)
    host = LearnerBatch(Transition(rng.normal(size=lead + (args.obs_dim,)).astype(np.float32),
                                   rng.integers(0, 4, lead).astype(np.int32), rng.normal(size=lead).astype(np.float32),
                                   np.full(lead, 0.97, np.float32), rng.normal(size=lead + (args.obs_dim,)).astype(np.float32)),
                        np.ones(lead, np.float32))
    placed = PreparedBatch(sharding.put_batch(host, mesh), np.zeros(1, np.uint64), np.zeros(lead, np.int64))
    learner = Learner(fns, jax.random.PRNGKey(0), itertools.repeat(placed), mesh=mesh)
    learner.step()  # compile
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < args.seconds:
      learner.step()
      calls += 1
    rate = calls * u / (time.perf_counter() - start)
    print(json.dumps(dict(devices=int(mesh.devices.size), platform=jax.devices()[0].platform, updates_per_call=u,
                          updates_per_s=rate, samples_per_s=rate * args.batch_size)), flush=True)


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--devices", default="1,2,4")
  parser.add_argument("--updates_per_call", default="1,4,16")
  parser.add_argument("--hidden_sizes", default="64,64")
  parser.add_argument("--batch_size", type=int, default=256)
  parser.add_argument("--obs_dim", type=int, default=4)
  parser.add_argument("--seconds", type=float, default=3.0)
  parser.add_argument("--child_devices", type=int, default=None, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child_devices is not None:
    return child(args)

  rows = []
  for devices in (int(d) for d in args.devices.split(",")):
    env = dict(os.environ, PYTHONPATH=ROOT)
    if devices > 0:
      env.update(XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu")
    cmd = [sys.executable, __file__, "--child_devices", str(devices), *sys.argv[1:]]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode:
      sys.exit(f"child for {devices} devices failed:\n{out.stderr[-3000:]}")
    rows += [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
  base = rows[0]["updates_per_s"]
  print(f"MLP {args.hidden_sizes}, global batch {args.batch_size}, {os.cpu_count()} CPU cores")
  print(f"{'platform':>8} {'devices':>7} {'upd/call':>8} {'updates/s':>10} {'samples/s':>11} {'vs first':>8}")
  for r in rows:
    print(f"{r['platform']:>8} {r['devices']:>7} {r['updates_per_call']:>8} {r['updates_per_s']:>10,.0f} "
          f"{r['samples_per_s']:>11,.0f} {r['updates_per_s'] / base:>8.2f}")


if __name__ == "__main__":
  main()
