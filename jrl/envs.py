"""Gymnasium environment factory: vector envs, seeding, episode statistics.

An env is named by a gymnasium id (`CartPole-v1`), or by a factory reference
`pkg.module:function` (a function returning a `gymnasium.Env`, wrappers
included; the module must be importable, e.g. from the repo root), or given
as that function itself.
"""

import importlib
from typing import Any, Callable, List, NamedTuple, Optional, Tuple, Union

import gymnasium as gym
import numpy as np

from jrl import memory_envs, pixel_envs
from jrl.errors import ConfigError
from jrl.specs import EnvSpec, make_env_spec

memory_envs.register()  # jrl/MaskedCartPole-v1, usable wherever a gymnasium id is


EnvFactory = Callable[..., gym.Env]
EnvLike = Union[str, EnvFactory]  # a gymnasium id, "pkg.module:function", or the function


def is_factory_ref(env: str) -> bool:
  """`pkg.module:function` (not gymnasium's own `module:EnvId`, nor `gymnax:...`)."""
  module, sep, attr = env.partition(":")
  return bool(sep) and module != "gymnax" and attr.isidentifier() and all(p.isidentifier() for p in module.split("."))


def load_env_factory(ref: str) -> EnvFactory:
  """The function `pkg.module:function` names; ConfigError("env") if it cannot be loaded."""
  module_name, _, attr = ref.partition(":")
  try:
    module = importlib.import_module(module_name)
  except Exception as e:  # noqa: BLE001 - any import failure is the user's env reference
    raise ConfigError("env", f"cannot import '{module_name}' for the env factory '{ref}': "
                             f"{type(e).__name__}: {e}") from e
  factory = getattr(module, attr, None)
  if not callable(factory):
    raise ConfigError("env", f"'{ref}': module '{module_name}' has no function '{attr}'")
  return factory


def _factory(env: EnvLike) -> Tuple[EnvFactory, str]:
  if callable(env):
    return env, f"{getattr(env, '__module__', '?')}:{getattr(env, '__qualname__', repr(env))}"
  return load_env_factory(env), env


def call_factory(env: EnvLike, **kwargs) -> Tuple[Any, str]:
  """What a factory (or a factory reference) returns, and the factory's name; ConfigError("env")
  naming it when it cannot be loaded or raises."""
  factory, name = _factory(env)
  try:
    return factory(**kwargs), name
  except Exception as e:  # noqa: BLE001 - the factory is user code: name it, in one line
    raise ConfigError("env", f"the env factory '{name}' raised {type(e).__name__}: {e}") from e


def call_env_factory(env: EnvLike, **kwargs) -> gym.Env:
  """One env from a factory (or a factory reference); ConfigError("env") naming the factory
  when it raises or returns something that is not a `gymnasium.Env`."""
  made, name = call_factory(env, **kwargs)
  if not isinstance(made, gym.Env):
    raise ConfigError("env", f"the env factory '{name}' returned {type(made).__name__}, not a gymnasium.Env")
  return made


def check_env_id(env_id: EnvLike) -> None:
  """ConfigError("env") for an unknown gymnasium id, or a factory that cannot make an env."""
  if callable(env_id) or is_factory_ref(env_id):
    call_env_factory(env_id).close()
    return
  if env_id.startswith("gymnax:"):
    raise ConfigError("env", f"'{env_id}' is a JAX-native (gymnax) env: run it with --backend device")
  env_id, _ = pixel_envs.split_preset(env_id)  # ALE/..., MinAtar/..., ID@preset (jrl/pixel_envs.py)
  pixel_envs.register(env_id)
  if env_id not in gym.registry:
    close = [k for k in gym.registry if k.lower().startswith(env_id.split("-")[0].lower())]
    hint = f" (did you mean {', '.join(sorted(close)[:3])}?)" if close else ""
    raise ConfigError("env", f"unknown gymnasium id '{env_id}'{hint}")


def reward_threshold(env_id: EnvLike) -> Optional[float]:
  """The env's gymnasium reward threshold (a factory's env: from its spec, if it has one)."""
  if callable(env_id) or is_factory_ref(env_id):
    env = call_env_factory(env_id)
    threshold = env.spec.reward_threshold if env.spec is not None else None
    env.close()
    return threshold
  check_env_id(env_id)
  return gym.spec(pixel_envs.split_preset(env_id)[0]).reward_threshold


def make_vector_env(env_id: EnvLike, num_envs: int, seed: int, evaluation: bool = False,
                    **make_kwargs: Any) -> gym.vector.VectorEnv:
  """A synchronous vector env that autoresets in the SAME step.

  gymnasium 1.x defaults to NEXT_STEP autoreset, where the step after an episode
  end returns the reset observation and ignores the action; an adder unaware of
  it writes a bogus transition across every boundary. With SAME_STEP the step
  that ends an episode returns the reset observation and puts the true final
  observation in `info["final_obs"]`, which `final_observations` recovers.
  The env is reset with `seed` (env i gets seed + i). `make_kwargs` go to `gym.make_vec`
  (e.g. `render_mode="rgb_array"`, `wrappers=[...]` applied to each env). A factory (or
  `pkg.module:function`) makes each env: `make_kwargs` other than `wrappers` go to it.
  Pixel ids (`ALE/...`, `MinAtar/...`, `ID@preset`) get their preset's preprocessing
  (`jrl.pixel_envs`); `evaluation` makes them play whole games (no end at a lost life).
  """
  if callable(env_id) or is_factory_ref(env_id):
    return _factory_vector_env(env_id, num_envs, seed, **make_kwargs)
  check_env_id(env_id)
  pixel = pixel_envs.factory(env_id, evaluation)
  if pixel is not None:
    return _factory_vector_env(pixel, num_envs, seed, **make_kwargs)
  env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync",
                     vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}, **make_kwargs)
  env.reset(seed=seed)
  env.action_space.seed(seed)
  return env


def _factory_vector_env(factory: EnvLike, num_envs: int, seed: int, wrappers=(), **kwargs) -> gym.vector.VectorEnv:
  factory, name = _factory(factory)
  call_env_factory(factory, **kwargs).close()  # a bad factory is one line here, not a vector env's traceback

  def make_one() -> gym.Env:
    env = call_env_factory(factory, **kwargs)
    for wrapper in wrappers or ():
      env = wrapper(env)
    return env

  env = gym.vector.SyncVectorEnv([make_one] * num_envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
  env.reset(seed=seed)
  env.action_space.seed(seed)
  return env


def check_same_step_autoreset(env: gym.vector.VectorEnv) -> None:
  """ConfigError("env") unless the vector env autoresets in the SAME step (see `make_vector_env`):
  under NEXT_STEP the step after an episode end would be written as a transition across it."""
  mode = env.metadata.get("autoreset_mode")
  if mode != gym.vector.AutoresetMode.SAME_STEP:
    raise ConfigError("env", f"the vector env autoresets with {mode}; jrl needs AutoresetMode.SAME_STEP "
                             f"(make it with jrl.envs.make_vector_env, or pass "
                             f"vector_kwargs={{'autoreset_mode': gym.vector.AutoresetMode.SAME_STEP}})")


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
    if not done.any():  # most steps (the actor's hot path)
      return EpisodeStats([], [])
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
