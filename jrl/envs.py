"""Gymnasium environment factory: vector envs, seeding, episode statistics."""

from typing import List, NamedTuple, Optional

import gymnasium as gym
import numpy as np

from jrl.errors import ConfigError
from jrl.specs import EnvSpec, make_env_spec


def check_env_id(env_id: str) -> None:
  if env_id.startswith("gymnax:"):
    raise ConfigError("env", f"'{env_id}' is a JAX-native (gymnax) env: run it with --backend device")
  if env_id not in gym.registry:
    close = [k for k in gym.registry if k.lower().startswith(env_id.split("-")[0].lower())]
    hint = f" (did you mean {', '.join(sorted(close)[:3])}?)" if close else ""
    raise ConfigError("env", f"unknown gymnasium id '{env_id}'{hint}")


def reward_threshold(env_id: str) -> Optional[float]:
  check_env_id(env_id)
  return gym.spec(env_id).reward_threshold


def make_vector_env(env_id: str, num_envs: int, seed: int, **make_kwargs) -> gym.vector.VectorEnv:
  """A synchronous vector env that autoresets in the SAME step.

  gymnasium 1.x defaults to NEXT_STEP autoreset, where the step after an episode
  end returns the reset observation and ignores the action; an adder unaware of
  it writes a bogus transition across every boundary. With SAME_STEP the step
  that ends an episode returns the reset observation and puts the true final
  observation in `info["final_obs"]`, which `final_observations` recovers.
  The env is reset with `seed` (env i gets seed + i). `make_kwargs` go to `gym.make_vec`
  (e.g. `render_mode="rgb_array"`, `wrappers=[...]` applied to each env).
  """
  check_env_id(env_id)
  env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync",
                     vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}, **make_kwargs)
  env.reset(seed=seed)
  env.action_space.seed(seed)
  return env


def env_spec(env: gym.vector.VectorEnv) -> EnvSpec:
  return make_env_spec(env.single_observation_space, env.single_action_space)


def final_observations(next_obs: np.ndarray, done: np.ndarray, info: dict) -> np.ndarray:
  """The observations to bootstrap from: the true final one where an episode ended."""
  if not done.any():
    return next_obs
  out = np.array(next_obs, copy=True)
  for i in np.flatnonzero(done):
    out[i] = info["final_obs"][i]
  return out


class EpisodeStats(NamedTuple):
  returns: List[float]
  lengths: List[int]


class EpisodeTracker:
  """Accumulates per-env returns and lengths; reports the episodes that ended."""

  def __init__(self, num_envs: int):
    self._returns = np.zeros(num_envs, np.float64)
    self._lengths = np.zeros(num_envs, np.int64)

  def update(self, reward: np.ndarray, done: np.ndarray) -> EpisodeStats:
    self._returns += reward
    self._lengths += 1
    ended = np.flatnonzero(done)
    stats = EpisodeStats([float(x) for x in self._returns[ended]],
                         [int(x) for x in self._lengths[ended]])
    self._returns[ended] = 0.0
    self._lengths[ended] = 0
    return stats

  def state(self):
    return self._returns.copy(), self._lengths.copy()

  def restore(self, state) -> None:
    self._returns, self._lengths = (np.array(x) for x in state)
