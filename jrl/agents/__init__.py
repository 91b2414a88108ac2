"""Agent registry: name -> module providing the five pure pieces."""

import importlib
from types import ModuleType

from jrl import compat
from jrl.errors import ConfigError

compat.import_jax_probability()  # rlax and distrax without TensorFlow (see jrl/compat.py)

AGENTS = {"dqn": "jrl.agents.dqn", "impala": "jrl.agents.impala", "ppo": "jrl.agents.ppo", "sac": "jrl.agents.sac"}


def get_agent(name: str) -> ModuleType:
  if name not in AGENTS:
    raise ConfigError("agent", f"unknown agent '{name}' (known: {', '.join(sorted(AGENTS))})")
  return importlib.import_module(AGENTS[name])
