"""Seeds and PRNG keys of every node of a run, derived from (seed, role, index).

No two nodes share a stream: env seeds come from `np.random.SeedSequence` of
(seed, role, index, incarnation) and keys from `jax.random.fold_in` of role and
index, so actor 9 never replays the evaluator's episodes and a restarted node
gets fresh ones. The learner's key depends on the seed alone, so its initial
parameters are the same embedded, distributed and on every learner process.
"""

from typing import Dict, NamedTuple

import jax
import numpy as np

ROLES = ("learner", "actor", "evaluator", "inference", "replay")


def _role_id(role: str) -> int:
  if role not in ROLES:
    raise ValueError(f"role must be one of {ROLES}, got '{role}'")
  return ROLES.index(role)


def env_seed(seed: int, role: str, index: int = 0, incarnation: int = 0) -> int:
  """A 31-bit seed for the envs (env i of a vector env gets env_seed + i) or RNG of one node."""
  state = np.random.SeedSequence([seed, _role_id(role), index, incarnation]).generate_state(1)[0]
  return int(state >> 1)


def node_key(seed: int, role: str, index: int = 0) -> jax.Array:
  """The PRNG key of one node; the learner's is the same for every index."""
  key = jax.random.fold_in(jax.random.PRNGKey(seed), _role_id(role))
  return key if role == "learner" else jax.random.fold_in(key, index)


class NodeSeeds(NamedTuple):
  env_seed: int
  key: jax.Array


def program_seeds(seed: int, num_actors: int, num_inference_servers: int = 0) -> Dict[str, NodeSeeds]:
  """Env seed and key of every node of a distributed program, by node name (`actor/3`)."""
  names = [("learner", 0), ("evaluator", 0)] + [("actor", i) for i in range(num_actors)] + [
      ("inference", j) for j in range(num_inference_servers)]
  return {f"{role}/{i}": NodeSeeds(env_seed(seed, role, i), node_key(seed, role, i)) for role, i in names}
