"""Policy snapshots in a run directory: the parameters a policy needs, saved to reload.

`RUN_DIR/policies/<which>.msgpack` holds the params (flax msgpack) and
`<which>.json` what they are (env steps, learner steps, eval return, and for an
evaluated snapshot the evaluation's `eval_seed` and `eval_index`).
`which` is `best` (params at the best evaluation), `final` (at the end of the
run) or `latest` (at the newest checkpoint). Both files are written atomically.

Loading rebuilds the agent from the run's own `config.json`:

  policy = jrl.load_policy("runs/dqn-s0")   # greedy policy of the best snapshot
  actions = policy(observations)            # [B, *obs_shape] -> [B, *action_shape], numpy
"""

import json
import os
from typing import Any, Dict, List, NamedTuple, Tuple

import numpy as np
from flax import serialization

from jrl.errors import RunDirError
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


# Loading.

def load_config(run_dir: str) -> Tuple[Any, Any]:
  """(ExperimentConfig, the agent's Config) of a run, from its config.json.

  RunDirError when run_dir is missing, is not a run (no config.json) or the file is broken.
  """
  from jrl.experiment.resume import load_configs
  return load_configs(run_dir, field="run_dir")


def saved_snapshots(run_dir: str) -> List[str]:
  """The snapshots of a run that are complete (their .json is written after the .msgpack)."""
  return [which for which in SNAPSHOTS if all(os.path.isfile(p) for p in snapshot_paths(run_dir, which))]


class Snapshot(NamedTuple):
  experiment: Any          # ExperimentConfig of the run
  agent_config: Any        # the agent's Config
  parts: Any               # jrl.experiment.builder.AgentParts: agent module, env spec, networks
  params: Any              # the policy's parameters (pytree of numpy arrays)
  info: Dict[str, Any]     # <which>.json: actor_steps, learner_steps, eval_return, ...


def _restore_params(template: Any, path: str) -> Any:
  """Params shaped like `template` (a pytree of jax.ShapeDtypeStruct) from a flax msgpack file."""
  import jax
  with open(path, "rb") as f:
    data = f.read()
  try:
    params = serialization.from_state_dict(template, serialization.msgpack_restore(data))
  except Exception as e:  # msgpack and flax raise ValueError, TypeError, KeyError, ... on torn bytes
    raise RunDirError("snapshot", f"'{path}' is corrupt or truncated ({type(e).__name__}: {e})") from e
  leaves, treedef = jax.tree_util.tree_flatten(params)
  expected = jax.tree_util.tree_leaves(template)
  if treedef != jax.tree_util.tree_structure(template) or any(
      np.shape(x) != t.shape or np.asarray(x).dtype != t.dtype for x, t in zip(leaves, expected)):
    raise RunDirError("snapshot", f"'{path}' does not hold params of this run's networks (corrupt, or config.json "
                               "changed since it was saved)")
  return params


def load_snapshot(run_dir: str, which: str = "best") -> Snapshot:
  """A run's config, rebuilt agent parts and the params of snapshot `which`.

  RunDirError for a bad run_dir, a snapshot that was not saved (the message lists those that
  were) or a corrupt snapshot file (the message names it).
  """
  import jax
  from jrl.experiment.builder import build_agent_parts

  if which not in SNAPSHOTS:
    raise RunDirError("which", f"must be one of {', '.join(SNAPSHOTS)}, got '{which}'")
  exp, agent_cfg = load_config(run_dir)
  saved = saved_snapshots(run_dir)
  if which not in saved:
    found = ", ".join(saved) if saved else "none"
    raise RunDirError("which", f"no '{which}' policy snapshot in '{os.path.join(run_dir, POLICIES_DIR)}' "
                               f"(saved: {found})")
  params_path, info_path = snapshot_paths(run_dir, which)
  try:
    info = read_json(info_path)
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    raise RunDirError("snapshot", f"'{info_path}' is corrupt or truncated ({e})") from e
  parts = build_agent_parts(exp.agent, exp.env, agent_cfg)
  learner = parts.agent.make_learner(parts.networks, agent_cfg)
  template = jax.eval_shape(lambda key: learner.params(learner.init(key)), jax.random.PRNGKey(0))
  return Snapshot(exp, agent_cfg, parts, _restore_params(template, params_path), info)


def load_params(run_dir: str, which: str = "best") -> Any:
  """The params (pytree of numpy arrays, shaped as the agent's learner makes them) of a snapshot."""
  return load_snapshot(run_dir, which).params


class Policy:
  """A reloaded policy as a plain function of observations, numpy in and numpy out:
  `policy(obs [B, *obs_shape]) -> actions [B, *action_shape]`, or one observation
  `[*obs_shape]` to one action. Jitted; its state (random key, step count, a recurrent
  policy's core state per env) lives inside. Successive calls continue the same episodes;
  `is_first` ([B] bool) marks envs whose episode starts with this observation (default:
  all at the first call and whenever B changes, none otherwise).
  """

  def __init__(self, snapshot: Snapshot, evaluation: bool = True, seed: int = 0):
    import jax
    parts = snapshot.parts
    fns = parts.agent.make_policy(parts.networks, snapshot.agent_config, evaluation=evaluation)
    self.snapshot = snapshot
    self.observation_shape = tuple(parts.env_spec.observation_shape)
    self._obs_dtype = parts.env_spec.observation_dtype
    self._params = jax.device_put(snapshot.params)
    self._select_action = jax.jit(fns.select_action)
    self._init = fns.init
    self._key = jax.random.PRNGKey(seed)
    self._state, self._batch = None, -1

  @property
  def info(self) -> Dict[str, Any]:
    return self.snapshot.info

  def __call__(self, obs, is_first=None) -> np.ndarray:
    obs = np.asarray(obs, self._obs_dtype)
    single = obs.shape == self.observation_shape
    if not single and obs.shape[1:] != self.observation_shape:
      raise ValueError(f"observations must be shaped {self.observation_shape} or [B, *{self.observation_shape}], "
                       f"got {obs.shape}")
    obs = obs[None] if single else obs
    if len(obs) != self._batch:
      self._state, self._batch = self._init(self._key, len(obs)), len(obs)
      is_first = np.ones(len(obs), bool)
    is_first = np.zeros(len(obs), bool) if is_first is None else np.asarray(is_first, bool).reshape(len(obs))
    action, _, self._state = self._select_action(self._params, obs, is_first, self._state)
    action = np.asarray(action)
    return action[0] if single else action


def load_policy(run_dir: str, which: str = "best", evaluation: bool = True, seed: int = 0) -> Policy:
  """The policy of snapshot `which` (best, final, latest) of a run, rebuilt from the run's
  config: greedy when `evaluation` (as the run's evaluator acted), else the acting policy.
  `seed` seeds the policy's random key. RunDirError if the run or snapshot cannot be loaded."""
  return Policy(load_snapshot(run_dir, which), evaluation, seed)
