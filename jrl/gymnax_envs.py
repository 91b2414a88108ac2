"""gymnax environments for the device backend: ids `gymnax:ENV_ID`, specs and batched steps.

`gymnax:pkg.module:function` names a factory of your own JAX-native env instead: a function
returning a gymnax `Environment` (its `default_params` are used) or a pair `(env, env_params)`;
an optional `reward_threshold` attribute of the env is the run's success threshold.

gymnax 1.0.1 steps one env as a pure function and resets a finished env inside
the same step (SAME_STEP autoreset): `step` returns the reset observation and
puts the true final observation in `info["final_observation"]`, which is what
transitions bootstrap from. `GymnaxVecEnv` vmaps reset/step over a batch of envs.
gymnax is imported lazily: it loads seaborn and matplotlib at import.
"""

from typing import Any, NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from jrl.envs import call_factory, is_factory_ref
from jrl.errors import ConfigError
from jrl.specs import EnvSpec

PREFIX = "gymnax:"


def is_gymnax_id(env_id: str) -> bool:
  return env_id.startswith(PREFIX)


def _gymnax():
  import gymnax  # noqa: WPS433 - slow import (seaborn, matplotlib), only for device runs
  return gymnax


def load_gymnax() -> None:
  """Imports gymnax now (a slow import: it brings seaborn and matplotlib, and starts JAX's backend):
  a device run does before its clock starts, so that the clock starts with its work."""
  _gymnax()


def gymnax_name(env_id: str) -> str:
  """What follows `gymnax:` (a gymnax id or a factory reference); ConfigError('env', ...) for an id
  without the prefix, or a gymnax id gymnax does not know."""
  if not is_gymnax_id(env_id):
    raise ConfigError("env", f"--backend device needs a JAX-native env given as '{PREFIX}ENV_ID' "
                             f"(e.g. {PREFIX}CartPole-v1) or '{PREFIX}pkg.module:function', got the gymnasium "
                             f"id '{env_id}'")
  name = env_id[len(PREFIX):]
  if is_factory_ref(name):
    return name
  known = list(_gymnax().registered_envs)
  if name not in known:
    close = [k for k in known if k.lower().startswith(name.split("-")[0].lower())] if name else []
    hint = f" (did you mean {', '.join(PREFIX + k for k in sorted(close)[:3])}?)" if close else ""
    raise ConfigError("env", f"unknown gymnax id '{name}'{hint}; known: {', '.join(sorted(known))} "
                             f"(or {PREFIX}pkg.module:function for an env of your own)")
  return name


def make_gymnax_env(env_id: str) -> Tuple[Any, Any]:
  """The gymnax env and its params for `gymnax:ENV_ID` or `gymnax:pkg.module:function`;
  ConfigError('env', ...) naming a factory that fails or returns something else."""
  name = gymnax_name(env_id)
  if not is_factory_ref(name):
    return _gymnax().make(name)
  made, _ = call_factory(name)
  env, params = made if isinstance(made, tuple) and len(made) == 2 else (made, getattr(made, "default_params", None))
  base = _gymnax().environments.environment.Environment
  if not isinstance(env, base) or params is None:
    raise ConfigError("env", f"the env factory '{name}' returned {type(made).__name__}, not a gymnax Environment "
                             "(or a pair (env, env_params))")
  return env, params


def reward_threshold(env_id: str) -> Optional[float]:
  """gymnasium's threshold for the same id where gymnasium has the env (CartPole-v1: 475); a
  factory's env: its `reward_threshold` attribute, if it has one."""
  import gymnasium as gym
  name = gymnax_name(env_id)
  if is_factory_ref(name):
    threshold = getattr(make_gymnax_env(env_id)[0], "reward_threshold", None)
    return None if threshold is None else float(threshold)
  return gym.spec(name).reward_threshold if name in gym.registry else None


def _space_spec(observation_space, action_space) -> EnvSpec:
  spaces = _gymnax().environments.spaces
  if not isinstance(observation_space, spaces.Box):
    raise ConfigError("env", f"observation space {observation_space} is not a Box")
  obs_shape = tuple(int(d) for d in observation_space.shape)
  if isinstance(action_space, spaces.Discrete):
    return EnvSpec(obs_shape, np.dtype(np.float32), (), np.dtype(np.int32), num_actions=int(action_space.n))
  if isinstance(action_space, spaces.Box):
    shape = tuple(int(d) for d in action_space.shape)
    low = np.broadcast_to(np.asarray(action_space.low, np.float32), shape).copy()
    high = np.broadcast_to(np.asarray(action_space.high, np.float32), shape).copy()
    return EnvSpec(obs_shape, np.dtype(np.float32), shape, np.dtype(np.float32), action_low=low, action_high=high)
  raise ConfigError("env", f"action space {action_space} is neither Discrete nor Box")


class StepResult(NamedTuple):
  observation: jax.Array        # [N, *obs] next observation (the reset one where an episode ended)
  state: Any                    # env states [N]
  reward: jax.Array             # [N] float32
  terminated: jax.Array         # [N] bool
  truncated: jax.Array          # [N] bool
  final_observation: jax.Array  # [N, *obs] observation to bootstrap from (true final one at an end)


class GymnaxVecEnv:
  """A batch of one gymnax env, reset and stepped as pure, jittable functions."""

  def __init__(self, env_id: str):
    self.env_id = env_id
    self.name = gymnax_name(env_id)
    self.env, self.params = make_gymnax_env(env_id)
    self.spec = _space_spec(self.env.observation_space(self.params), self.env.action_space(self.params))
    self.max_episode_steps = int(getattr(self.params, "max_steps_in_episode", 0)) or None

  def reset(self, key: jax.Array, num_envs: int) -> Tuple[jax.Array, Any]:
    obs, state = jax.vmap(self.env.reset, in_axes=(0, None))(jax.random.split(key, num_envs), self.params)
    return obs.astype(jnp.float32), state

  def step(self, key: jax.Array, state: Any, action: jax.Array) -> StepResult:
    num_envs = action.shape[0]
    obs, state, reward, terminated, truncated, info = jax.vmap(self.env.step, in_axes=(0, 0, 0, None))(
        jax.random.split(key, num_envs), state, action, self.params)
    terminated = jnp.asarray(terminated, bool)
    truncated = jnp.logical_and(jnp.asarray(truncated, bool), ~terminated)
    return StepResult(obs.astype(jnp.float32), state, jnp.asarray(reward, jnp.float32), terminated, truncated,
                      info["final_observation"].astype(jnp.float32))


def env_spec(env_id: str) -> EnvSpec:
  env = GymnaxVecEnv(env_id)
  return env.spec
