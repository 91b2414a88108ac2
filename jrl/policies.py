"""Policy snapshots in a run directory: the parameters a policy needs, saved to reload.

`RUN_DIR/policies/<which>.msgpack` holds the params (flax msgpack) and
`<which>.json` what they are (env steps, learner steps, eval return).
`which` is `best` (params at the best evaluation), `final` (at the end of the
run) or `latest` (at the newest checkpoint). Both files are written atomically.
"""

import os
from typing import Any, Dict, Tuple

from flax import serialization

from jrl.experiment.files import POLICIES_DIR, read_json, write_bytes_atomic, write_json

SNAPSHOTS = ("best", "final", "latest")


def snapshot_paths(run_dir: str, which: str) -> Tuple[str, str]:
  base = os.path.join(run_dir, POLICIES_DIR, which)
  return base + ".msgpack", base + ".json"


def save_policy(run_dir: str, which: str, params: Any, info: Dict[str, Any]) -> None:
  """Writes params (any pytree of arrays) and their description; the .json last, so a
  .json always describes a complete .msgpack."""
  if which not in SNAPSHOTS:
    raise ValueError(f"which must be one of {SNAPSHOTS}, got '{which}'")
  import jax
  params_path, info_path = snapshot_paths(run_dir, which)
  write_bytes_atomic(params_path, serialization.to_bytes(jax.device_get(params)))
  write_json(info_path, dict(info))


def read_policy_info(run_dir: str, which: str) -> Dict[str, Any]:
  return read_json(snapshot_paths(run_dir, which)[1])
