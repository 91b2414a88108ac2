"""Runs the learner shell over a mesh on a fixed global batch; used by test_sharding.py.

Forced CPU devices must be set before JAX starts, hence a separate process:
  XLA_FLAGS=--xla_force_host_platform_device_count=N python tests/sharding_worker.py OUT [--devices N]
  python tests/sharding_worker.py OUT --coordinator HOST:PORT --num_processes 2 --process_id I
Writes OUT (npz): the final parameters and the state's dtypes/structure facts.
"""

import argparse
import json

import numpy as np

CALLS, UPDATES, BATCH = 3, 2, 8


def global_batches():
  rng = np.random.default_rng(0)
  for _ in range(CALLS):
    shape = (UPDATES, BATCH)
    yield dict(observation=rng.normal(size=shape + (4,)).astype(np.float32),
               action=rng.integers(0, 3, size=shape).astype(np.int32),
               reward=rng.normal(size=shape).astype(np.float32),
               discount=np.where(rng.random(shape) < 0.2, 0.0, 0.97).astype(np.float32),
               next_observation=rng.normal(size=shape + (4,)).astype(np.float32),
               weights=rng.uniform(0.5, 1.0, size=shape).astype(np.float32))


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("out")
  parser.add_argument("--devices", type=int, default=1)
  parser.add_argument("--coordinator", default="")
  parser.add_argument("--num_processes", type=int, default=1)
  parser.add_argument("--process_id", type=int, default=0)
  args = parser.parse_args()

  import distrax  # noqa: F401
  from jrl.learners import distributed
  distributed.initialize(args.coordinator, args.num_processes, args.process_id)

  import jax
  from jrl.agents import dqn
  from jrl.learners import sharding
  from jrl.learners.learner import Learner
  from jrl.replay.batches import PreparedBatch
  from jrl.specs import EnvSpec
  from jrl.types import LearnerBatch, Transition

  spec = EnvSpec((4,), np.dtype(np.float32), (), np.dtype(np.int32), num_actions=3)
  cfg = dqn.Config(hidden_sizes=(16, 16), target_update_period=2, batch_size=BATCH)
  fns = dqn.make_learner(dqn.make_networks(spec, cfg), cfg)
  mesh = sharding.make_mesh(0 if args.num_processes > 1 else args.devices)
  per_process = BATCH // jax.process_count()
  rows = slice(jax.process_index() * per_process, (jax.process_index() + 1) * per_process)

  def local_batches():
    for b in global_batches():
      local = {k: v[:, rows] for k, v in b.items()}
      weights = local.pop("weights")
      yield PreparedBatch(LearnerBatch(Transition(**local), weights), np.zeros(1, np.uint64),
                          np.zeros((UPDATES, per_process), np.int64))

  learner = Learner(fns, jax.random.PRNGKey(0), local_batches(), mesh=mesh)
  structure0 = str(jax.tree_util.tree_structure(learner.state))
  dtypes0 = [str(x.dtype) for x in jax.tree_util.tree_leaves(learner.state)]
  for _ in range(CALLS):
    learner.step()
  params, version = learner.get_variables()
  facts = dict(devices=int(mesh.devices.size), processes=jax.process_count(), version=version,
               cache_size=learner._update_many._cache_size(),
               same_structure=str(jax.tree_util.tree_structure(learner.state)) == structure0,
               same_dtypes=[str(x.dtype) for x in jax.tree_util.tree_leaves(learner.state)] == dtypes0,
               # list(): PartitionSpec prints as P() from jax 0.7
               param_spec=list(jax.tree_util.tree_leaves(learner.state.params)[0].sharding.spec))
  leaves = {f"leaf{i}": np.asarray(x) for i, x in enumerate(jax.tree_util.tree_leaves(params))}
  if jax.process_index() == 0:
    np.savez(args.out, facts=json.dumps(facts), **leaves)


if __name__ == "__main__":
  main()
