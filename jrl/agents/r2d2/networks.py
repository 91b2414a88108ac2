"""R2D2 networks: a torso (`cfg.torso`: an MLP for vectors, a CNN for frames; or any flax
module), an LSTM core and a Q head.

The core state travels flattened, `[B, 2 * lstm_size]` (the LSTM's cell and hidden
halves), so that it fits in a policy's extras and a replay item as one array.
"""

from typing import Callable, NamedTuple, Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from jrl.agents.r2d2.config import Config
from jrl.errors import ConfigError
from jrl.networks import MLP, example_observation, make_torso
from jrl.specs import EnvSpec
from jrl.types import Array, Params, PRNGKey


class RecurrentQNetwork(nn.Module):
  """obs [B, ...], core state [B, 2H] -> (q [B, A], next core state [B, 2H])."""
  num_actions: int
  lstm_size: int
  torso: nn.Module

  @nn.compact
  def __call__(self, obs: jnp.ndarray, state: jnp.ndarray) -> Tuple[jnp.ndarray, jnp.ndarray]:
    features = self.torso(obs)
    cell, hidden = jnp.split(state, 2, axis=-1)
    (cell, hidden), out = nn.OptimizedLSTMCell(self.lstm_size)((cell, hidden), features)
    return nn.Dense(self.num_actions)(out), jnp.concatenate([cell, hidden], axis=-1)


class Networks(NamedTuple):
  init: Callable[[PRNGKey], Params]
  apply: Callable[[Params, Array, Array], Tuple[Array, Array]]  # obs [B, ...], state [B, S] -> q [B, A], state
  initial_state: Callable[[int], Array]                         # batch size -> zeros [B, S]
  state_size: int                                               # S


def unroll(networks: Networks, params: Params, obs: Array, reset: Array, state: Array) -> Tuple[Array, Array]:
  """Runs the core over a sequence: obs [T, B, ...], reset [T, B] (zero the state before
  that step), state [B, S] -> (q [T, B, A], state after each step [T, B, S])."""
  zeros = networks.initial_state(state.shape[0])

  def step(carry, inputs):
    o, r = inputs
    carry = jnp.where(r[:, None], zeros, carry)
    q, carry = networks.apply(params, o, carry)
    return carry, (q, carry)

  _, (q, states) = jax.lax.scan(step, state, (obs, reset))
  return q, states


def make_networks(spec: EnvSpec, cfg: Config, module: Optional[nn.Module] = None) -> Networks:
  """`module`: the torso (obs [B, ...] -> features [B, F]); None: `cfg.torso` (an MLP of
  `cfg.hidden_sizes` for vectors, a CNN for frames)."""
  if not spec.discrete:
    raise ConfigError("agent", f"r2d2 needs a Discrete action space, the env has a continuous one "
                               f"(Box of shape {spec.action_shape})")
  torso = module if module is not None else (make_torso(cfg.torso, spec.observation_shape, cfg.hidden_sizes)
                                            or MLP(tuple(cfg.hidden_sizes)))
  net = RecurrentQNetwork(num_actions=spec.num_actions, lstm_size=cfg.lstm_size, torso=torso)
  size = 2 * cfg.lstm_size
  initial_state = lambda batch: jnp.zeros((batch, size), jnp.float32)
  dummy = example_observation(spec)
  return Networks(init=lambda key: net.init(key, dummy, initial_state(1)), apply=net.apply,
                  initial_state=initial_state, state_size=size)
