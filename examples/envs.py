"""An env factory for `--env examples.envs:masked_cartpole`: any function returning a
gymnasium env (wrappers included) plugs in where a gymnasium id does.

    python -m launch.train --env examples.envs:masked_cartpole --steps 20000
    python -m examples.envs --steps 20000     # the same, through launch.train
"""

import sys
from typing import Optional, Sequence

import gymnasium as gym
import numpy as np

VISIBLE = (0, 2)  # CartPole's cart position and pole angle; velocities (1, 3) are dropped


class MaskVelocities(gym.ObservationWrapper):
  """Keeps the positions of CartPole's observation [4] -> [2]: the task becomes partially
  observable (a feed-forward agent sees no motion). A class, not a lambda, so that the envs
  pickle into checkpoints."""

  def __init__(self, env: gym.Env):
    super().__init__(env)
    low, high = env.observation_space.low[list(VISIBLE)], env.observation_space.high[list(VISIBLE)]
    self.observation_space = gym.spaces.Box(low, high, dtype=np.float32)

  def observation(self, observation: np.ndarray) -> np.ndarray:
    return np.asarray(observation, np.float32)[list(VISIBLE)]


def masked_cartpole(**kwargs) -> gym.Env:
  """CartPole-v1 with its velocities masked; keyword arguments (e.g. render_mode) go to gym.make.
  The spec (and its reward threshold, 475) is CartPole-v1's."""
  return MaskVelocities(gym.make("CartPole-v1", **kwargs))


def broken_factory() -> gym.Env:
  """For the command line's error path: a factory that raises."""
  raise RuntimeError("this factory always fails")


def not_an_env():
  """For the command line's error path: a factory that returns something else."""
  return "CartPole-v1"


def main(argv: Optional[Sequence[str]] = None) -> int:
  """DQN on the masked CartPole through the unchanged command line; any train flag may follow."""
  from launch.train import main as train
  argv = list(sys.argv[1:] if argv is None else argv)
  return train(["--env", "examples.envs:masked_cartpole", *argv])


if __name__ == "__main__":
  sys.exit(main())
