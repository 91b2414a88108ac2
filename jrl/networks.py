"""Flax networks shared by agents: the MLP and the image torsos (Nature-DQN CNN, IMPALA ResNet,
MinAtar's small CNN), and `make_torso`, which picks one from the observation's shape.

Image torsos take frames [B, H, W, C] (channels last: stacked frames or MinAtar's object
planes) of any dtype: uint8 is scaled to [0, 1] here, inside the jitted network, so frames
travel and sit in replay as uint8.
"""

from typing import Optional, Sequence

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from jrl.errors import ConfigError


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


def to_float(x: jnp.ndarray) -> jnp.ndarray:
  """float32 input: uint8 frames scaled to [0, 1], bool planes to {0, 1}, floats as they are."""
  if x.dtype == jnp.uint8:
    return x.astype(jnp.float32) / 255.0
  return x.astype(jnp.float32)


class NatureCNN(nn.Module):
  """The Nature-DQN torso (Mnih et al., 2015): conv 32x8x8/4, 64x4x4/2, 64x3x3/1 (VALID), then
  a 512-unit ReLU layer. Frames [B, H, W, C] (84x84x4 for Atari) -> [B, 512]."""
  hidden_size: int = 512

  @nn.compact
  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    x = to_float(x)
    for features, kernel, stride in ((32, 8, 4), (64, 4, 2), (64, 3, 1)):
      x = nn.relu(nn.Conv(features, (kernel, kernel), (stride, stride), padding="VALID")(x))
    return nn.relu(nn.Dense(self.hidden_size)(x.reshape(x.shape[0], -1)))


class ResidualBlock(nn.Module):
  @nn.compact
  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    channels = x.shape[-1]
    h = nn.Conv(channels, (3, 3))(nn.relu(x))
    h = nn.Conv(channels, (3, 3))(nn.relu(h))
    return x + h


class ImpalaResNet(nn.Module):
  """The IMPALA "deep" torso (Espeholt et al., 2018): per stack a 3x3 conv, 3x3 max-pool with
  stride 2 and two residual blocks (16, 32, 32 channels), then ReLU and a 256-unit layer.
  Frames [B, H, W, C] -> [B, 256]."""
  channels: Sequence[int] = (16, 32, 32)
  hidden_size: int = 256

  @nn.compact
  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    x = to_float(x)
    for channels in self.channels:
      x = nn.Conv(channels, (3, 3))(x)
      x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
      x = ResidualBlock()(x)
      x = ResidualBlock()(x)
    x = nn.relu(x).reshape(x.shape[0], -1)
    return nn.relu(nn.Dense(self.hidden_size)(x))


class SmallCNN(nn.Module):
  """MinAtar's torso (Young & Tian, 2019): one 16x3x3 conv (stride 1, VALID), then a 128-unit
  layer. Small frames [B, H, W, C] (10x10xC) -> [B, 128]."""
  features: int = 16
  hidden_size: int = 128

  @nn.compact
  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    x = nn.relu(nn.Conv(self.features, (3, 3), padding="VALID")(to_float(x)))
    return nn.relu(nn.Dense(self.hidden_size)(x.reshape(x.shape[0], -1)))


TORSOS = ("auto", "mlp", "nature_cnn", "impala_resnet", "small_cnn")


def check_network_fields(hidden_sizes: Sequence[int], torso: Optional[str] = None) -> None:
  """ConfigError for an agent config's network fields: `hidden_sizes`, and `torso` where the
  config has one."""
  if not hidden_sizes or any(h <= 0 for h in hidden_sizes):
    raise ConfigError("hidden_sizes", f"must be non-empty positive sizes, got {hidden_sizes}")
  if torso is not None and torso not in TORSOS:
    raise ConfigError("torso", f"unknown torso '{torso}' (one of {', '.join(TORSOS)})")


# Smallest frame side each image torso takes (its convolutions must leave at least 1x1).
MIN_FRAME_SIDE = {"nature_cnn": 36, "impala_resnet": 1, "small_cnn": 3}


def resolve_torso(name: str, observation_shape: Sequence[int]) -> str:
  """The torso `name` names for observations of this shape ("auto": rank 3 [H, W, C] frames get
  `nature_cnn` from 36x36 up, `small_cnn` below (MinAtar); anything else `mlp`). ConfigError
  ("torso") for a name not in TORSOS or a torso that cannot take the observations."""
  if name not in TORSOS:
    raise ConfigError("torso", f"unknown torso '{name}' (one of {', '.join(TORSOS)})")
  shape = tuple(observation_shape)
  if name == "auto":
    if len(shape) != 3:
      return "mlp"
    return "nature_cnn" if min(shape[:2]) >= MIN_FRAME_SIDE["nature_cnn"] else "small_cnn"
  if name in MIN_FRAME_SIDE:
    if len(shape) != 3:
      raise ConfigError("torso", f"{name} takes image observations [H, W, C]; the env's are shaped {shape}")
    if min(shape[:2]) < MIN_FRAME_SIDE[name]:
      raise ConfigError("torso", f"{name} needs frames of at least {MIN_FRAME_SIDE[name]}x{MIN_FRAME_SIDE[name]}; "
                                 f"the env's are {shape[0]}x{shape[1]} (try --torso small_cnn or impala_resnet)")
  return name


def make_torso(name: str, observation_shape: Sequence[int], hidden_sizes: Sequence[int]) -> Optional[nn.Module]:
  """The image torso `name` resolves to (see `resolve_torso`), or None for `mlp` (agents then
  build their own MLPs of `hidden_sizes`, as they always have)."""
  name = resolve_torso(name, observation_shape)
  if name == "mlp":
    return None
  return {"nature_cnn": NatureCNN, "impala_resnet": ImpalaResNet, "small_cnn": SmallCNN}[name]()


def example_observation(spec) -> np.ndarray:
  """Zeros [1, *obs_shape] in the spec's observation dtype, to initialise networks. A numpy array,
  not a JAX one: building an agent's networks then starts no JAX backend, so a launcher that builds
  them to check its config forks its node processes without JAX's threads (and its os.fork() warning)."""
  return np.zeros((1,) + tuple(spec.observation_shape), np.dtype(spec.observation_dtype))


class QNetwork(nn.Module):
  """A torso (MLP of `hidden_sizes` unless `torso` is given) and a Q head; `dueling` splits it
  into value and advantage streams (Wang et al., 2016, "Dueling Network Architectures for Deep RL")."""
  num_actions: int
  hidden_sizes: Sequence[int]
  dueling: bool = False
  torso: Optional[nn.Module] = None

  @nn.compact
  def __call__(self, obs: jnp.ndarray) -> jnp.ndarray:
    h = MLP(self.hidden_sizes)(obs) if self.torso is None else self.torso(obs)
    if not self.dueling:
      return nn.Dense(self.num_actions)(h)
    value = nn.Dense(1)(h)
    advantages = nn.Dense(self.num_actions)(h)
    return value + advantages - advantages.mean(axis=-1, keepdims=True)
