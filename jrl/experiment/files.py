"""Atomic file writes and the run directory's fixed layout.

A file is written to a temporary sibling, flushed to disk and renamed over its
destination, so a kill at any instant leaves the old or the new file, never a
torn one.
"""

import dataclasses
import json
import os
import re
import shutil
import tempfile
from typing import Any, Callable, Dict

from jrl.errors import ConfigError

CONFIG_FILE = "config.json"
SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.md"  # the run report (jrl.experiment.report), every kind of run
CHECKPOINTS_DIR = "checkpoints"
POLICIES_DIR = "policies"


def path_safe(name: str) -> str:
  """`name` with characters outside [A-Za-z0-9._-] replaced by '_': folder names made of agent
  and env references (`examples.envs:masked_cartpole`, `gymnax:CartPole-v1`) keep no ':' or '/'
  (TensorBoard reads `name:path` in --logdir_spec; PYTHONPATH splits on ':')."""
  return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def _json_default(value):
  if isinstance(value, tuple):
    return list(value)
  if hasattr(value, "item"):  # numpy scalars
    return value.item()
  raise TypeError(f"not JSON serialisable: {value!r}")


def fsync_dir(path: str) -> None:
  fd = os.open(path, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


def write_bytes_atomic(path: str, data: bytes) -> None:
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=directory)
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise
  fsync_dir(directory)


def write_json(path: str, payload: Dict) -> None:
  text = json.dumps(payload, indent=2, default=_json_default) + "\n"
  write_bytes_atomic(path, text.encode())


def read_json(path: str) -> Dict[str, Any]:
  with open(path) as f:
    return json.load(f)


def config_payload(exp, agent_cfg) -> Dict[str, Any]:
  return {"experiment": dataclasses.asdict(exp), "agent": dataclasses.asdict(agent_cfg)}


def resolve_paths(exp):
  """`exp` with its run directory and resume folder as absolute paths, resolved once against
  the working directory (the default `runs/...` folder included): what the run records in
  config.json, prints and hands to orbax, Reverb and child processes is then the same path
  wherever they resolve it."""
  run_dir = exp.resume or exp.run_dir or exp.default_run_dir()
  return dataclasses.replace(exp, run_dir=os.path.abspath(run_dir),
                             resume=os.path.abspath(exp.resume) if exp.resume else "")


def prepare_run_dir(exp, agent_cfg, before_writing: Callable[[], None] = lambda: None) -> str:
  """The run directory: a new run's created and given config.json (ConfigError if it cannot
  take a run); a resumed run's (`exp.resume`) as it is. `before_writing` runs after the folder
  is checked and before anything is written (further checks that must leave nothing behind).
  Returned as an absolute path."""
  if exp.resume:
    before_writing()
    return os.path.abspath(exp.resume)
  run_dir = os.path.abspath(exp.run_dir or exp.default_run_dir())
  start_over = check_run_dir_target(run_dir)
  before_writing()
  if start_over:
    print(f"[run] {run_dir} holds a run that stopped before its first checkpoint: starting it over", flush=True)
    shutil.rmtree(run_dir)
  os.makedirs(run_dir, exist_ok=True)
  write_json(os.path.join(run_dir, CONFIG_FILE), config_payload(exp, agent_cfg))
  return run_dir


def has_checkpoint(run_dir: str) -> bool:
  """Whether the run directory holds a committed checkpoint (`checkpoints/ckpt-*`)."""
  folder = os.path.join(run_dir, CHECKPOINTS_DIR)
  return os.path.isdir(folder) and any(name.startswith("ckpt-") for name in os.listdir(folder))


def check_run_dir_target(run_dir: str) -> bool:
  """A new run may go into a missing or empty folder, never over a file or another run. A run
  that left nothing to continue (no checkpoint, no summary: killed or failed to launch before
  its first checkpoint) is no obstacle: returns True, the folder is to be started over."""
  if os.path.exists(run_dir) and not os.path.isdir(run_dir):
    raise ConfigError("run_dir", f"'{run_dir}' is an existing file, not a folder")
  if not os.path.isfile(os.path.join(run_dir, CONFIG_FILE)):
    return False
  if not has_checkpoint(run_dir) and not os.path.isfile(os.path.join(run_dir, SUMMARY_FILE)):
    return True
  raise ConfigError("run_dir", f"'{run_dir}' already holds a run; continue it with --resume {run_dir} "
                               "or pick another folder")
