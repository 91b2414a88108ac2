"""Agent registry: a name (or a module path) -> module providing the five pure pieces."""

import importlib
from types import ModuleType

from jrl import compat
from jrl.registry import AGENTS
from jrl.errors import ConfigError

compat.import_jax_probability()  # rlax and distrax without TensorFlow (see jrl/compat.py)

# What the shells (embedded runner, distributed nodes, command line) need of an agent module.
PIECES = ("Config", "make_networks", "make_learner", "make_policy", "make_replay_spec")


def get_agent(name: str) -> ModuleType:
  """A built-in agent by name, or any importable module `pkg.module` that provides `PIECES`."""
  if name in AGENTS:
    return importlib.import_module(AGENTS[name])
  if "." not in name:
    raise ConfigError("agent", f"unknown agent '{name}' (known: {', '.join(sorted(AGENTS))}; "
                               f"or a module path pkg.module providing {', '.join(PIECES)})")
  try:
    module = importlib.import_module(name)
  except Exception as e:  # noqa: BLE001 - any import failure is the user's module: name it
    raise ConfigError("agent", f"cannot import agent module '{name}': {type(e).__name__}: {e}") from e
  missing = [piece for piece in PIECES if not hasattr(module, piece)]
  if missing:
    raise ConfigError("agent", f"module '{name}' lacks {', '.join(missing)} "
                               f"(an agent module provides {', '.join(PIECES)})")
  return module
