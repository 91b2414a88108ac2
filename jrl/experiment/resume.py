"""Reading a run directory's saved config, and what a resumed run may change."""

import dataclasses
import json
import os
import typing
from typing import Any, Dict, Tuple, Type

from jrl.errors import ConfigError, RunDirError
from jrl.experiment.files import CONFIG_FILE, read_json

# Experiment fields a resumed run may set anew; every other field, and every agent
# field, must equal the saved value (it would change the run's meaning mid-way).
CHANGEABLE_ON_RESUME = frozenset({
    "steps", "resume", "resume_strict", "run_dir", "progress_seconds", "stop_at_threshold",
    "checkpoint_every_seconds", "checkpoint_every_steps", "keep_checkpoints",
    "max_restarts", "restart_backoff_seconds", "service_deadline_seconds", "lp_launch_type",
    # Where a distributed run's nodes run: a run resumed after losing a host is placed on the others.
    "hosts", "placement", "host_command", "host_deadline_seconds",
    # Which process of a device run over hosts this is, and where they meet (launch.device_hosts).
    "process_id", "coordinator_address",
})
# Fields that config.json files of older versions hold and this version has dropped: read and ignored
# (the test-only fault injection moved to jrl/run/distributed/faults.py's environment variable).
RETIRED_FIELDS = frozenset({"crash_learner_after", "crash_actor_after"})


def _is_tuple_hint(hint) -> bool:
  if typing.get_origin(hint) is typing.Union:  # Optional[Tuple[...]]
    return any(_is_tuple_hint(arg) for arg in typing.get_args(hint))
  return hint is tuple or typing.get_origin(hint) is tuple


def config_from_dict(cls: Type, values: Any, source: str, field: str = "run_dir") -> Any:
  """The dataclass `cls` from its `dataclasses.asdict` JSON form (lists back to tuples);
  RunDirError naming `field` and `source` for unknown fields or invalid values."""
  if not isinstance(values, dict):
    raise RunDirError(field, f"{source} is not a JSON object")
  hints = typing.get_type_hints(cls)
  unknown = sorted(set(values) - set(hints))
  if unknown:
    raise RunDirError(field, f"{source} has unknown fields {', '.join(unknown)} (written by another jrl version?)")
  kwargs = {k: tuple(v) if isinstance(v, list) and _is_tuple_hint(hints[k]) else v for k, v in values.items()}
  try:
    return cls(**kwargs)
  except (ConfigError, TypeError, ValueError) as e:
    raise RunDirError(field, f"{source} is invalid: {e}") from e


def saved_config(run_dir: str, field: str = "run_dir") -> Dict[str, Dict[str, Any]]:
  """`config.json` of a run directory as {"experiment": {...}, "agent": {...}}; RunDirError
  naming `field` when the folder is missing, is not a run or the file is broken."""
  if not os.path.exists(run_dir):
    raise RunDirError(field, f"'{run_dir}' does not exist")
  if not os.path.isdir(run_dir):
    raise RunDirError(field, f"'{run_dir}' is a file, not a run directory")
  path = os.path.join(run_dir, CONFIG_FILE)
  if not os.path.isfile(path):
    raise RunDirError(field, f"'{run_dir}' is not a run directory (no {CONFIG_FILE})")
  try:
    payload = read_json(path)
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    raise RunDirError(field, f"'{path}' is not readable JSON ({e})") from e
  if not isinstance(payload, dict) or not {"experiment", "agent"} <= set(payload):
    raise RunDirError(field, f"'{path}' lacks the 'experiment' and 'agent' sections")
  return payload


def load_configs(run_dir: str, field: str = "run_dir") -> Tuple[Any, Any]:
  """(ExperimentConfig, the agent's Config) of a run, from its config.json."""
  from jrl.agents import get_agent
  from jrl.experiment.config import ExperimentConfig

  payload = saved_config(run_dir, field)
  path = os.path.join(run_dir, CONFIG_FILE)
  current = {k: v for k, v in payload["experiment"].items() if k not in RETIRED_FIELDS}
  exp = config_from_dict(ExperimentConfig, current, f"'{path}' (experiment)", field)
  try:
    agent = get_agent(exp.agent)
  except ConfigError as e:
    raise RunDirError(field, f"'{path}': {e}") from e
  return exp, config_from_dict(agent.Config, payload["agent"], f"'{path}' (agent '{exp.agent}')", field)


def resumed_configs(run_dir: str, exp_overrides: Dict[str, Any], agent_overrides: Dict[str, Any]) -> Tuple[Any, Any]:
  """The saved configs with the given overrides; a ConfigError names any override
  of a field that cannot change mid-run."""
  exp, agent_cfg = load_configs(run_dir, field="resume")
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
