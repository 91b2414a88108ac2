"""Evaluator: mean return of a policy over a fixed number of whole episodes."""

from typing import List

import jax
import numpy as np

from jrl.envs import make_vector_env
from jrl.types import Params, PolicyFns


class Evaluator:
  """Runs `num_episodes` episodes in parallel (one per env, the first episode of each).

  Evaluation k resets the envs with seed `seed + 1000 * k`, so runs repeat exactly.
  """

  def __init__(self, env_id: str, policy: PolicyFns, num_episodes: int, seed: int):
    self._env = make_vector_env(env_id, num_episodes, seed)
    self._select_action = jax.jit(policy.select_action)
    self._policy = policy
    self._seed = seed
    self._key = jax.random.PRNGKey(seed)
    self._count = 0

  def run(self, params: Params) -> List[float]:
    obs, _ = self._env.reset(seed=self._seed + 1000 * self._count)
    self._key, key = jax.random.split(self._key)
    state = self._policy.init(key)
    self._count += 1
    n = self._env.num_envs
    returns = np.zeros(n)
    running = np.ones(n, bool)
    while running.any():
      action, _, state = self._select_action(params, obs.astype(np.float32), state)
      obs, reward, terminated, truncated, _ = self._env.step(np.asarray(action))
      returns += reward * running
      running &= ~np.logical_or(terminated, truncated)
    return [float(r) for r in returns]

  def close(self):
    self._env.close()
