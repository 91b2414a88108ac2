"""Plugging pieces into agents: a flax module or an (init, apply) pair as a network, and the
default optimiser most agents share."""

from typing import Any, Callable, Tuple

import flax.linen as nn
import optax

from jrl.types import Params, PRNGKey

InitApply = Tuple[Callable[[PRNGKey], Params], Callable[..., Any]]


def init_apply(module: Any, *example_inputs: Any) -> InitApply:
  """`(init(key) -> params, apply(params, *inputs))` of a flax module, initialised on
  `example_inputs` (batch of one); an (init, apply) pair (e.g. an agent's `Networks`) is
  returned as it is."""
  if isinstance(module, nn.Module):
    return (lambda key: module.init(key, *example_inputs)), module.apply
  if isinstance(module, tuple) and len(module) == 2 and all(callable(f) for f in module):
    return module[0], module[1]
  raise TypeError(f"expected a flax.linen.Module or an (init, apply) pair, got {type(module).__name__}")


def clipped_adam(cfg: Any) -> optax.GradientTransformation:
  """Global-norm clipping to cfg.max_grad_norm, then Adam (cfg.learning_rate, eps cfg.adam_eps): the
  default optimiser of DQN, R2D2, PPO and PQN."""
  return optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), optax.adam(cfg.learning_rate, eps=cfg.adam_eps))
