"""Presets: named hyperparameter sets per agent and env family, kept as data beside the agent.

An agent's presets live in one YAML file beside its module (`jrl/agents/dqn/presets.yaml`; an
agent module of your own, `pkg/my_agent.py` or the package `pkg/my_agent/`, may have
`pkg/my_agent.presets.yaml` or `pkg/my_agent/presets.yaml`), as rl-baselines3-zoo keeps one
hyperparameter file per algorithm:

    minatar:
      description: what it is for and where its values come from
      envs: [MinAtar/Breakout-v1, ...]     # the envs it was tuned on
      flags: {num_envs: 8, learning_rate: 3e-4, deterministic: true, ...}

`flags` names fields of the experiment config or of the agent's config, with values as a command
line types them. A command applies a preset before its own flags, so the user's flags win
(`preset_argv`); the run's config.json then holds every value, and `preset` names the set.
"""

import dataclasses
import os
from typing import Any, Dict, List, Optional, Tuple

from jrl.errors import ConfigError

PRESETS_FILE = "presets.yaml"
# What a preset may not set: which run it is (the command's own choice), not how it learns.
NOT_IN_PRESETS = ("agent", "env", "seed", "steps", "run_dir", "resume", "preset")


@dataclasses.dataclass(frozen=True)
class Preset:
  name: str
  agent: str
  description: str
  envs: Tuple[str, ...]       # the env ids it was tuned on
  flags: Dict[str, Any]       # field -> value, in the file's order

  def argv(self) -> List[str]:
    """The flags as a command line types them (`--deterministic` for a true switch)."""
    words: List[str] = []
    for field, value in self.flags.items():
      if value is True:
        words.append(f"--{field}")
      elif isinstance(value, (list, tuple)):
        words += [f"--{field}", ",".join(str(v) for v in value)]
      else:
        words += [f"--{field}", "false" if value is False else str(value)]
    return words


def presets_file(agent_module) -> str:
  """Where an agent module's presets are: `presets.yaml` in its package, or `<module>.presets.yaml`
  beside a single-file module."""
  path = agent_module.__file__
  if os.path.basename(path) == "__init__.py":
    return os.path.join(os.path.dirname(path), PRESETS_FILE)
  return os.path.splitext(path)[0] + "." + PRESETS_FILE


def load_presets(agent_name: str, agent_module, fields: Optional[Tuple[str, ...]] = None) -> Dict[str, Preset]:
  """The agent's presets by name ({} where it has none); ConfigError('preset') naming the file for
  a malformed one, or for a flag that is not one of `fields` (when given) or may not be preset."""
  path = presets_file(agent_module)
  if not os.path.isfile(path):
    return {}
  import yaml  # only where presets are read
  shown = os.path.relpath(path)
  try:
    with open(path) as f:
      data = yaml.safe_load(f) or {}
  except (OSError, yaml.YAMLError) as e:
    raise ConfigError("preset", f"cannot read {shown}: {type(e).__name__}: {e}".splitlines()[0]) from None
  if not isinstance(data, dict):
    raise ConfigError("preset", f"{shown} must map preset names to presets")
  presets = {}
  for name, body in data.items():
    if not isinstance(body, dict) or not isinstance(body.get("flags"), dict):
      raise ConfigError("preset", f"{shown}: preset '{name}' needs a mapping 'flags: {{field: value, ...}}'")
    flags = dict(body["flags"])
    for field in flags:
      if field in NOT_IN_PRESETS:
        raise ConfigError("preset", f"{shown}: preset '{name}' sets '{field}', which the command chooses")
      if fields is not None and field not in fields:
        raise ConfigError("preset", f"{shown}: preset '{name}' sets '{field}', not a field of the experiment "
                                    f"config or of the {agent_name} config")
    presets[str(name)] = Preset(str(name), agent_name, " ".join(str(body.get("description", "")).split()),
                                tuple(body.get("envs") or ()), flags)
  return presets


def find_preset(name: str, agent_name: str, agent_module, fields: Optional[Tuple[str, ...]] = None) -> Preset:
  """The agent's preset `name`; ConfigError('preset') in one line for a name it does not have
  (naming the agents that do, and the ones it has)."""
  presets = load_presets(agent_name, agent_module, fields)
  if name in presets:
    return presets[name]
  own = f"{agent_name}'s presets: {', '.join(sorted(presets))}" if presets else f"{agent_name} has no presets"
  others = [other for other in _registry_agents() if other != agent_name and name in _presets_of(other)]
  if others:
    raise ConfigError("preset", f"'{name}' is a preset of {', '.join(others)}, not of {agent_name} ({own})")
  raise ConfigError("preset", f"no preset '{name}' ({own})")


def describe(presets: Dict[str, Preset]) -> str:
  """The presets as `--list_presets` prints them: name, description, envs and flags."""
  if not presets:
    return "no presets"
  lines = []
  for preset in presets.values():
    lines += [f"{preset.name}: {preset.description}"]
    if preset.envs:
      lines += [f"  envs: {', '.join(preset.envs)}"]
    lines += [f"  flags: {' '.join(preset.argv())}", ""]
  return "\n".join(lines).rstrip() + "\n"


def _registry_agents() -> List[str]:
  from jrl.registry import AGENTS
  return sorted(AGENTS)


def _presets_of(agent_name: str) -> Dict[str, Preset]:
  from jrl.agents import get_agent
  try:
    return load_presets(agent_name, get_agent(agent_name))
  except ConfigError:
    return {}
