"""Actor shell: steps a vector env with a batched policy and feeds an adder.

Where the policy runs is the caller's choice: `LocalPolicy` runs the pure
jitted `select_action` in this process (IMPALA-style); a remote policy such as
`jrl.actors.inference.InferenceClient` asks a central batched server (SEED-style).
"""

from typing import Callable, Dict, Optional, Protocol

import gymnasium as gym
import jax
import numpy as np

from jrl.actors.variables import VariableClient
from jrl.envs import EpisodeStats, EpisodeTracker, final_observations
from jrl.types import PolicyFns, PRNGKey, Transition


class BatchedPolicy(Protocol):
  version: int  # parameter version that chose the last actions
  extras: Dict[str, np.ndarray]  # what the policy reported with the last actions ([E, ...] each)

  def __call__(self, obs: np.ndarray) -> np.ndarray:
    """Actions [E, ...] for observations [E, ...]."""


class LocalPolicy:
  """The pure policy jitted in this process, parameters from a variable client."""

  def __init__(self, policy: PolicyFns, variables: VariableClient, key: PRNGKey):
    self._select_action = jax.jit(policy.select_action)
    self._state = policy.init(key)
    self._variables = variables
    self.version = variables.version
    self.extras: Dict[str, np.ndarray] = {}

  def __call__(self, obs: np.ndarray) -> np.ndarray:
    self._variables.maybe_update()
    self.version = self._variables.version
    action, extras, self._state = self._select_action(self._variables.params, obs, self._state)
    self.extras = extras
    return np.asarray(action)


class Actor:
  """Owns the env, the policy and the adder.

  `sink` receives the transitions each step completes (an adder chain into
  replay); None for actors that only collect episode statistics.
  """

  def __init__(self, env: gym.vector.VectorEnv, policy: BatchedPolicy, adder=None,
               sink: Optional[Callable[[Transition], None]] = None):
    self._env = env
    self.policy = policy
    self._adder = adder
    self._sink = sink
    obs, _ = env.reset()  # the env was seeded when it was made
    self._obs = np.asarray(obs, np.float32)
    self._tracker = EpisodeTracker(env.num_envs)
    self._env_action_dtype = env.single_action_space.dtype
    self.num_envs = env.num_envs
    self.env_steps = 0

  def step(self) -> EpisodeStats:
    """One vector step: num_envs env steps."""
    action = self.policy(self._obs)
    # gymnasium's space checks are faster on its own dtype; replay keeps the policy's.
    next_obs, reward, terminated, truncated, info = self._env.step(action.astype(self._env_action_dtype, copy=False))
    next_obs = np.asarray(next_obs, np.float32)
    done = np.logical_or(terminated, truncated)
    if self._adder is not None:
      bootstrap_obs = final_observations(next_obs, done, info)
      transitions = self._adder.add(self._obs, action, np.asarray(reward, np.float32), terminated, truncated,
                                    bootstrap_obs, self.policy.extras)
      if self._sink is not None:
        self._sink(transitions)
    self._obs = next_obs
    self.env_steps += self.num_envs
    return self._tracker.update(reward, done)
