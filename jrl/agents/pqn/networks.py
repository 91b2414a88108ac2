"""PQN networks: a Q-network whose hidden layers are Dense -> LayerNorm -> ReLU."""

from typing import Any, Callable, NamedTuple, Optional, Sequence

import flax.linen as nn
import jax.numpy as jnp

from jrl.agents.modules import init_apply
from jrl.agents.pqn.config import Config
from jrl.errors import ConfigError
from jrl.networks import example_observation, make_torso
from jrl.specs import EnvSpec
from jrl.types import Array, Params, PRNGKey


class LayerNormMLP(nn.Module):
  """Hidden layers Dense -> LayerNorm (when `layer_norm`) -> ReLU; the input is flattened
  after the batch dim."""
  hidden_sizes: Sequence[int]
  layer_norm: bool = True

  @nn.compact
  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    x = x.reshape(x.shape[0], -1).astype(jnp.float32)
    for size in self.hidden_sizes:
      x = nn.Dense(size)(x)
      if self.layer_norm:
        x = nn.LayerNorm()(x)
      x = nn.relu(x)
    return x


class QNetwork(nn.Module):
  """An optional image `torso` (a CNN for frames), then the LayerNorm'd MLP of `hidden_sizes`
  and a linear Q head: obs [B, *obs_shape] -> q [B, num_actions]."""
  num_actions: int
  hidden_sizes: Sequence[int]
  layer_norm: bool = True
  torso: Optional[nn.Module] = None

  @nn.compact
  def __call__(self, obs: jnp.ndarray) -> jnp.ndarray:
    h = obs if self.torso is None else self.torso(obs)
    h = LayerNormMLP(self.hidden_sizes, self.layer_norm)(h)
    return nn.Dense(self.num_actions)(h)


class Networks(NamedTuple):
  init: Callable[[PRNGKey], Params]
  apply: Callable[[Params, Array], Array]  # obs [B, *obs_shape] -> q [B, num_actions]


def make_networks(spec: EnvSpec, cfg: Config, module: Optional[Any] = None) -> Networks:
  """The Q-network: `module` is any flax module mapping obs [B, *obs_shape] to q
  [B, num_actions], or an (init, apply) pair; None: a `QNetwork` on `cfg.torso` (for frames a
  CNN, then the LayerNorm'd MLP of `cfg.hidden_sizes`; for vectors that MLP alone)."""
  if not spec.discrete:
    raise ConfigError("agent", f"pqn needs a Discrete action space, the env has a continuous one "
                               f"(Box of shape {spec.action_shape})")
  if module is None:
    torso = make_torso(cfg.torso, spec.observation_shape, cfg.hidden_sizes)
    module = QNetwork(num_actions=spec.num_actions, hidden_sizes=tuple(cfg.hidden_sizes),
                      layer_norm=cfg.layer_norm, torso=torso)
  return Networks(*init_apply(module, example_observation(spec)))
