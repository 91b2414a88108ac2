"""Memory tasks: envs whose observations hide part of the state, so that a policy needs memory.

`jrl/MaskedCartPole-v1` is CartPole-v1 with the velocities removed: observations keep the
cart position and the pole angle only ([x, theta]), so velocities must be inferred from
consecutive observations. Same dynamics, time limit (500) and reward threshold (475).
"""

import gymnasium as gym
import numpy as np

MASKED_CARTPOLE = "jrl/MaskedCartPole-v1"
CARTPOLE_KEPT = (0, 2)  # cart position, pole angle; velocities (1, 3) are dropped


class MaskedVelocity(gym.ObservationWrapper):
  """Keeps the observation entries `keep` of a Box observation (e.g. drops velocities)."""

  def __init__(self, env: gym.Env, keep=CARTPOLE_KEPT):
    super().__init__(env)
    self._keep = np.asarray(keep)
    space = env.observation_space
    self.observation_space = gym.spaces.Box(space.low[self._keep], space.high[self._keep], dtype=space.dtype)

  def observation(self, observation):
    return observation[self._keep]


def make_masked_cartpole(**kwargs) -> gym.Env:
  return MaskedVelocity(gym.make("CartPole-v1", **kwargs).unwrapped)


def register() -> None:
  """Registers the memory tasks with gymnasium (idempotent)."""
  if MASKED_CARTPOLE not in gym.registry:
    gym.register(MASKED_CARTPOLE, entry_point=make_masked_cartpole, max_episode_steps=500, reward_threshold=475.0)
