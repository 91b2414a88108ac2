"""Evaluator: mean return of a policy over a fixed number of whole episodes."""

from typing import Any, Dict, List, Optional

import jax
import numpy as np

from jrl.cpu_jit import jit_per_step
from jrl.envs import EnvLike, make_vector_env
from jrl.specs import env_action, observation_dtype
from jrl.types import Params, PolicyFns


class Evaluator:
  """Runs `num_episodes` episodes in parallel (one per env, the first episode of each).

  Evaluation k resets the envs with seed `seed + 1000 * k`, so runs repeat exactly.
  """

  def __init__(self, env: EnvLike, policy: PolicyFns, num_episodes: int, seed: int, first_index: int = 0,
               env_kwargs: Optional[Dict[str, Any]] = None):
    """`env`: a gymnasium id, a factory returning a `gymnasium.Env` (or `"pkg.module:function"`).
    `first_index` k: the first `run` is evaluation k (its env seeds and policy key), as if k
    evaluations had run. `env_kwargs` go to `make_vector_env` (e.g. render_mode, wrappers)."""
    self._env = make_vector_env(env, num_episodes, seed, evaluation=True, **(env_kwargs or {}))
    self._obs_dtype = observation_dtype(self._env.single_observation_space)
    self._select_action = jit_per_step(policy.select_action)
    self._policy = policy
    self._seed = seed
    self._key = jax.random.PRNGKey(seed)
    for _ in range(first_index):  # the keys of evaluations 0 .. k-1
      self._key, _ = jax.random.split(self._key)
    self._count = first_index

  @property
  def next_index(self) -> int:
    """The index k of the next evaluation (its envs reset with seed + 1000 * k)."""
    return self._count

  def run(self, params: Params) -> List[float]:
    obs, _ = self._env.reset(seed=self._seed + 1000 * self._count)
    self._key, key = jax.random.split(self._key)
    n = self._env.num_envs
    state = self._policy.init(key, n)
    self._count += 1
    returns = np.zeros(n)
    running = np.ones(n, bool)
    is_first = np.ones(n, bool)
    while running.any():
      action, _, state = self._select_action(params, np.asarray(obs, self._obs_dtype), is_first, state)
      obs, reward, terminated, truncated, _ = self._env.step(env_action(action, self._env.single_action_space))
      is_first = np.logical_or(terminated, truncated)  # ended envs restart (their returns no longer count)
      returns += reward * running
      running &= ~np.logical_or(terminated, truncated)
    return [float(r) for r in returns]

  def state(self):
    return {"count": self._count, "key": np.asarray(jax.device_get(self._key))}

  def restore(self, state) -> None:
    self._count, self._key = state["count"], jax.device_put(state["key"])

  def close(self):
    self._env.close()
