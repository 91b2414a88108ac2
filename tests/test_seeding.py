"""Every node of a program draws from its own streams; the learner starts from the same params everywhere."""

import jax
import numpy as np

from jrl import seeding
from jrl.experiment.config import ExperimentConfig


def test_every_node_of_a_12_actor_program_has_its_own_env_seeds_and_key():
  exp = ExperimentConfig(distributed=True, num_actors=12, inference="server", num_inference_servers=2)
  nodes = seeding.program_seeds(exp.seed, exp.num_actors, exp.num_inference_servers)
  assert len(nodes) == 1 + 1 + 12 + 2
  # A node's vector env seeds envs env_seed .. env_seed + num_envs - 1: no two nodes share one.
  env_seeds = [s.env_seed + i for s in nodes.values() for i in range(exp.num_envs)]
  assert len(set(env_seeds)) == len(env_seeds)
  keys = {name: tuple(np.asarray(jax.random.key_data(s.key)).tolist()) for name, s in nodes.items()}
  assert len(set(keys.values())) == len(keys)
  # The embedded runner's actor is actor `process_id`; its seeds match the program's actor 0.
  assert seeding.env_seed(exp.seed, "actor", 0) == nodes["actor/0"].env_seed
  # Another seed, other streams; a restart (incarnation) gets fresh env seeds too.
  other = seeding.program_seeds(exp.seed + 1, exp.num_actors, exp.num_inference_servers)
  assert not {s.env_seed for s in other.values()} & {s.env_seed for s in nodes.values()}
  assert seeding.env_seed(0, "actor", 3, incarnation=1) != seeding.env_seed(0, "actor", 3)
