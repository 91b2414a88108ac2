"""Environment specs derived from gymnasium spaces."""

import dataclasses
from typing import Optional, Tuple

import gymnasium as gym
import numpy as np

from jrl.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class EnvSpec:
  """What an agent needs to know about one (unbatched) environment."""
  observation_shape: Tuple[int, ...]
  observation_dtype: np.dtype
  action_shape: Tuple[int, ...]
  action_dtype: np.dtype
  num_actions: Optional[int] = None       # Discrete action spaces only
  action_low: Optional[np.ndarray] = None  # Box action spaces only
  action_high: Optional[np.ndarray] = None

  @property
  def discrete(self) -> bool:
    return self.num_actions is not None


# Observation dtypes kept as they are from env to network (frames, boolean grids); any other
# is stored and sent as float32. Networks convert to float inside the jitted call.
KEPT_OBSERVATION_DTYPES = (np.dtype(np.uint8), np.dtype(np.bool_))


def observation_dtype(space: gym.Space) -> np.dtype:
  """uint8 and bool observations stay so; everything else becomes float32."""
  dtype = np.dtype(space.dtype)
  return dtype if dtype in KEPT_OBSERVATION_DTYPES else np.dtype(np.float32)


def env_action(action: np.ndarray, space: gym.Space) -> np.ndarray:
  """The actions as the env takes them: its dtype, and within its bounds for a Box (a Gaussian
  policy samples beyond them; replay keeps the sampled action). A no-op for actions inside."""
  action = np.asarray(action).astype(space.dtype, copy=False)
  if isinstance(space, gym.spaces.Box):
    action = np.clip(action, space.low, space.high)
  return action


def make_env_spec(observation_space: gym.Space, action_space: gym.Space) -> EnvSpec:
  """Builds an EnvSpec from single-env spaces; only Box observations and
  Discrete or Box actions are supported."""
  if not isinstance(observation_space, gym.spaces.Box):
    raise ConfigError("env", f"observation space {observation_space} is not a Box")
  obs_dtype = observation_dtype(observation_space)
  if isinstance(action_space, gym.spaces.Discrete):
    if int(action_space.start) != 0:
      raise ConfigError("env", f"Discrete action space must start at 0, got {action_space}")
    return EnvSpec(tuple(observation_space.shape), obs_dtype, (), np.dtype(np.int32),
                   num_actions=int(action_space.n))
  if isinstance(action_space, gym.spaces.Box):
    return EnvSpec(tuple(observation_space.shape), obs_dtype,
                   tuple(action_space.shape), np.dtype(np.float32),
                   action_low=np.asarray(action_space.low, np.float32),
                   action_high=np.asarray(action_space.high, np.float32))
  raise ConfigError("env", f"action space {action_space} is neither Discrete nor Box")
