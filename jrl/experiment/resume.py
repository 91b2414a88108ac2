"""Reading a run directory's saved config, and what a resumed run may change."""

import dataclasses
import json
import os
import typing
from typing import Any, Dict, Tuple, Type

from jrl.errors import ConfigError
from jrl.experiment.files import CONFIG_FILE

# Experiment fields a resumed run may set anew; every other field, and every agent
# field, must equal the saved value (it would change the run's meaning mid-way).
CHANGEABLE_ON_RESUME = frozenset({
    "steps", "resume", "run_dir", "progress_seconds", "stop_at_threshold",
    "checkpoint_every_seconds", "checkpoint_every_steps", "keep_checkpoints",
    "max_restarts", "restart_backoff_seconds", "service_deadline_seconds", "lp_launch_type",
    "crash_learner_after", "crash_actor_after",
})


def saved_config(run_dir: str, field: str = "resume") -> Dict[str, Dict[str, Any]]:
  """`config.json` of a run directory as {"experiment": {...}, "agent": {...}}; a
  ConfigError naming `field` if the folder is missing or holds no run."""
  if not os.path.isdir(run_dir):
    raise ConfigError(field, f"'{run_dir}' is not a folder")
  path = os.path.join(run_dir, CONFIG_FILE)
  if not os.path.isfile(path):
    raise ConfigError(field, f"'{run_dir}' is not a run directory (no {CONFIG_FILE})")
  try:
    with open(path) as f:
      payload = json.load(f)
    return {"experiment": dict(payload["experiment"]), "agent": dict(payload["agent"])}
  except (ValueError, KeyError, TypeError) as e:
    raise ConfigError(field, f"'{path}' is not a readable run config ({e.__class__.__name__}: {e})")


def from_saved(cls: Type, saved: Dict[str, Any]) -> Any:
  """The dataclass from its JSON form (lists back to tuples)."""
  hints = typing.get_type_hints(cls)
  values = {}
  for field in dataclasses.fields(cls):
    if field.name in saved:
      value = saved[field.name]
      if typing.get_origin(hints[field.name]) is tuple and isinstance(value, list):
        value = tuple(value)
      values[field.name] = value
  return cls(**values)


def resumed_configs(run_dir: str, exp_cls: Type, agent_cls: Type, exp_overrides: Dict[str, Any],
                    agent_overrides: Dict[str, Any]) -> Tuple[Any, Any]:
  """The saved configs with the given overrides; a ConfigError names any override
  of a field that cannot change mid-run."""
  saved = saved_config(run_dir)
  exp = from_saved(exp_cls, saved["experiment"])
  agent_cfg = from_saved(agent_cls, saved["agent"])
  for name, value in exp_overrides.items():
    if name not in CHANGEABLE_ON_RESUME and getattr(exp, name) != value:
      raise ConfigError(name, f"cannot change when resuming: the run has {getattr(exp, name)!r}, got {value!r}")
  for name, value in agent_overrides.items():
    if getattr(agent_cfg, name) != value:
      raise ConfigError(name, f"cannot change when resuming: the run has {getattr(agent_cfg, name)!r}, "
                              f"got {value!r}")
  changes = {k: v for k, v in exp_overrides.items() if k in CHANGEABLE_ON_RESUME}
  exp = dataclasses.replace(exp, **{**changes, "resume": run_dir, "run_dir": run_dir})
  return exp, agent_cfg
