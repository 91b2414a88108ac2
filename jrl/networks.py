"""Flax networks shared by agents."""

from typing import Sequence

import flax.linen as nn
import jax.numpy as jnp


class MLP(nn.Module):
  """A ReLU multi-layer perceptron torso; the input is flattened after the batch dim."""
  hidden_sizes: Sequence[int]
  activate_final: bool = True

  @nn.compact
  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    x = x.reshape(x.shape[0], -1).astype(jnp.float32)
    for i, size in enumerate(self.hidden_sizes):
      x = nn.Dense(size)(x)
      if self.activate_final or i + 1 < len(self.hidden_sizes):
        x = nn.relu(x)
    return x


class QNetwork(nn.Module):
  """MLP torso and a Q head; `dueling` splits it into value and advantage streams
  (Wang et al., 2016, "Dueling Network Architectures for Deep RL")."""
  num_actions: int
  hidden_sizes: Sequence[int]
  dueling: bool = False

  @nn.compact
  def __call__(self, obs: jnp.ndarray) -> jnp.ndarray:
    h = MLP(self.hidden_sizes)(obs)
    if not self.dueling:
      return nn.Dense(self.num_actions)(h)
    value = nn.Dense(1)(h)
    advantages = nn.Dense(self.num_actions)(h)
    return value + advantages - advantages.mean(axis=-1, keepdims=True)
