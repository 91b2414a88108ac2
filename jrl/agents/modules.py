"""Plugging networks into agents: a flax module, or an (init, apply) pair."""

from typing import Any, Callable, Tuple

import flax.linen as nn

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
