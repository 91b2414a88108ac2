"""Pieces shared by the agents for bounded Box actions (SAC, TD3): the twin critic, the check of
the action space, the map between the normalised box [-1, 1]^A, where their policies act, and
the env's bounds, and their `Networks` (a policy and a twin critic) with its builder."""

from typing import Any, Callable, NamedTuple, Optional, Sequence

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from jrl.agents.modules import init_apply
from jrl.errors import ConfigError
from jrl.networks import MLP
from jrl.specs import EnvSpec
from jrl.types import Array, Params, PRNGKey


class TwinQ(nn.Module):
  """Two independent Q MLPs on (obs, action): (obs [B, ...], action [B, A] in [-1, 1]) -> q [2, B]."""
  hidden_sizes: Sequence[int]

  @nn.compact
  def __call__(self, obs, action):
    x = jnp.concatenate([obs.reshape(obs.shape[0], -1), action], axis=-1)
    return jnp.stack([nn.Dense(1)(MLP(self.hidden_sizes)(x))[..., 0] for _ in range(2)])  # [2, B]


def check_bounded_box(agent: str, spec: EnvSpec) -> int:
  """The action dimension A of a bounded 1-D Box; ConfigError('agent', ...) for anything else."""
  if spec.discrete:
    raise ConfigError("agent", f"{agent} needs a Box action space, the env has a Discrete one "
                               f"({spec.num_actions} actions)")
  if len(spec.action_shape) != 1 or not np.all(np.isfinite(spec.action_low)) or not np.all(np.isfinite(spec.action_high)):
    raise ConfigError("agent", f"{agent} needs a bounded 1-D Box action space, got shape {spec.action_shape} "
                               f"with bounds [{spec.action_low}, {spec.action_high}]")
  return spec.action_shape[0]


def to_env(action: Array, low: np.ndarray, high: np.ndarray) -> Array:
  """[-1, 1] -> the env's action bounds [low, high]."""
  return low + (action + 1.0) * 0.5 * (high - low)


def from_env(action: Array, low: np.ndarray, high: np.ndarray) -> Array:
  """The env's bounds [low, high] -> [-1, 1]."""
  return 2.0 * (action - low) / (high - low) - 1.0


class Networks(NamedTuple):
  """A policy and a twin critic in the normalised action box [-1, 1]^A, and the env's bounds.

  What `policy_apply` returns is the agent's: SAC's (mean [B, A], log_std [B, A]) of a Gaussian
  before tanh, TD3's action [B, A] in [-1, 1].
  """
  policy_init: Callable[[PRNGKey], Params]
  policy_apply: Callable[[Params, Array], Any]      # obs [B, *obs_shape] -> the agent's policy output
  q_init: Callable[[PRNGKey], Params]
  q_apply: Callable[[Params, Array, Array], Array]  # obs [B, *obs_shape], action [B, A] in [-1, 1] -> q [2, B]
  action_low: np.ndarray
  action_high: np.ndarray

  def to_env(self, action: Array) -> Array:
    """[-1, 1] -> the env's action bounds."""
    return to_env(action, self.action_low, self.action_high)

  def from_env(self, action: Array) -> Array:
    return from_env(action, self.action_low, self.action_high)


def make_networks(agent: str, spec: EnvSpec, hidden_sizes: Sequence[int], default_policy: Callable[[int], Any],
                  module: Optional[Any] = None, critic: Optional[Any] = None) -> Networks:
  """`Networks` of the policy `module` and the twin `critic` ((obs [B, ...], action [B, A] in
  [-1, 1]) -> q [2, B]), each a flax module or an (init, apply) pair, initialised on a batch of
  one. None: `default_policy(A)` and a `TwinQ` of `hidden_sizes`. ConfigError('agent', ...) naming
  `agent` unless the env's actions are a bounded 1-D Box."""
  action_dim = check_bounded_box(agent, spec)
  policy = module if module is not None else default_policy(action_dim)
  critic = critic if critic is not None else TwinQ(tuple(hidden_sizes))
  # numpy, not JAX, examples: building the networks starts no JAX backend (see jrl.networks.example_observation).
  obs = np.zeros((1,) + spec.observation_shape, np.float32)
  act = np.zeros((1, action_dim), np.float32)
  policy_init, policy_apply = init_apply(policy, obs)
  q_init, q_apply = init_apply(critic, obs, act)
  return Networks(policy_init=policy_init, policy_apply=policy_apply, q_init=q_init, q_apply=q_apply,
                  action_low=np.asarray(spec.action_low, np.float32), action_high=np.asarray(spec.action_high, np.float32))
