"""Actor shell: steps a vector env with a batched policy and feeds an adder.

Where the policy runs is the caller's choice: `LocalPolicy` runs the pure
jitted `select_action` in this process (IMPALA-style); a remote policy such as
`jrl.actors.inference.InferenceClient` asks a central batched server (SEED-style).
"""

import pickle
from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple

import gymnasium as gym
import jax
import numpy as np

from jrl import accelerators
from jrl.actors.variables import VariableClient
from jrl.cpu_jit import jit_per_step, program_flops
from jrl.errors import ConfigError
from jrl.envs import EpisodeStats, EpisodeTracker, final_observations
from jrl.timing import ENV, INSERT, NULL_TIMER, PARAM_FETCH, POLICY
from jrl.specs import env_action, observation_dtype
from jrl.types import PolicyFns, PRNGKey, Transition, rebuild


class BatchedPolicy(Protocol):
  version: int  # parameter version that chose the last actions
  extras: Dict[str, np.ndarray]  # what the policy reported with the last actions ([E, ...] each)

  def __call__(self, obs: np.ndarray, is_first: np.ndarray) -> np.ndarray:
    """Actions [E, ...] for observations [E, ...]; `is_first` [E] bool marks episode starts.
    The actions may be a JAX array still being computed (`np.asarray` waits for it)."""


def latest_params(variables: VariableClient, timer) -> Tuple[Any, int]:
  """The variable client's parameters and their version, refreshed when due; the fetch is
  timed as its own phase."""
  timer.enter(PARAM_FETCH)
  variables.maybe_update()
  timer.exit()
  return variables.params, variables.version


def policy_device(setting: str, policy: PolicyFns, params: Any, observation_shape: Sequence[int], observation_dtype,
                  batch: int, key: PRNGKey) -> jax.Device:
  """The device an in-process policy acts on, for calls on `batch` observations: this process's CPU or
  its first device of JAX's default backend (where the learner's mesh starts), by --actor_device
  `setting` and, for 'auto' on an accelerator host, the policy's FLOPs per call
  (`jrl.accelerators.actor_device`). ConfigError naming actor_device for a device JAX does not have."""
  backend = jax.default_backend()
  flops = None
  if setting == "auto" and backend != "cpu":
    obs = jax.ShapeDtypeStruct((batch, *observation_shape), observation_dtype)
    is_first = jax.ShapeDtypeStruct((batch,), np.bool_)
    state = jax.eval_shape(lambda k: policy.init(k, batch), key)
    flops = program_flops(policy.select_action, params, obs, is_first, state)
  if accelerators.actor_device(setting, backend, flops) == "accelerator":
    return jax.local_devices()[0]
  try:
    return jax.local_devices(backend="cpu")[0]
  except RuntimeError as e:  # JAX_PLATFORMS without cpu: JAX made no CPU backend
    if setting == "cpu":
      raise ConfigError("actor_device", f"asks for the CPU, but JAX has no CPU backend in this process ({e})") from e
    return jax.local_devices()[0]


class LocalPolicy:
  """The pure policy jitted in this process, parameters from a variable client.

  `timer` (a `jrl.timing.PhaseTimer`) gets the parameter fetch as its own phase. `device`: where the
  policy acts (`policy_device`); its state is kept there and the variable client is told to keep the
  parameters there, so that the jitted call runs there. None: where the variable client's parameters are.
  """

  def __init__(self, policy: PolicyFns, variables: VariableClient, key: PRNGKey, timer=None,
               num_envs: Optional[int] = None, device: Optional[jax.Device] = None):
    self._select_action = jit_per_step(policy.select_action)
    self._init = policy.init
    self._key = key
    if device is not None:
      variables.place_on(device)
    self._device = device
    # Made now for `num_envs` envs, else at the first call for that many.
    self._state = self._placed(policy.init(key, num_envs)) if num_envs is not None else None
    self._variables = variables
    self.version = variables.version
    self.extras: Dict[str, np.ndarray] = {}
    self.timer = timer if timer is not None else NULL_TIMER

  def _placed(self, state: Any) -> Any:
    return state if self._device is None else jax.device_put(state, self._device)

  def __call__(self, obs: np.ndarray, is_first: np.ndarray) -> np.ndarray:
    if self._state is None:
      self._state = self._placed(self._init(self._key, len(obs)))
    params, self.version = latest_params(self._variables, self.timer)
    action, extras, self._state = self._select_action(params, obs, is_first, self._state)
    self.extras = extras
    return action  # dispatched asynchronously: the caller may work while it is computed

  def state(self) -> Any:
    return jax.device_get(self._state)

  def restore(self, state: Any) -> None:
    """Continues from `state()`, or from it as a checkpoint keeps it (`jrl.types.rebuild`)."""
    template = self._state if self._state is not None else jax.eval_shape(lambda k: self._init(k, 1), self._key)
    self._state = jax.device_put(rebuild(template, state), self._device)


class Actor:
  """Owns the env, the policy and the adder.

  `sink` receives the transitions each step completes (an adder chain into
  replay); None for actors that only collect episode statistics. `timer` (a
  `jrl.timing.PhaseTimer`) splits each step into policy, env and insert time.

  `dispatch_ahead`: once the env has stepped, ask the policy for the next actions before
  the adder and the replay insert run, so that a policy computing asynchronously (JAX
  dispatch on an accelerator, a remote server) overlaps them. The actions are then chosen
  with the parameters of that moment, one learner call older in the embedded loop; off
  for `--deterministic` runs, and where CPU programs run synchronously (`jrl.cpu_jit`), which
  leaves nothing to overlap.
  """

  def __init__(self, env: gym.vector.VectorEnv, policy: BatchedPolicy, adder=None,
               sink: Optional[Callable[[Transition], None]] = None, timer=None, dispatch_ahead: bool = False):
    self.timer = timer if timer is not None else NULL_TIMER
    self._env = env
    self.policy = policy
    self._adder = adder
    self._sink = sink
    # uint8 frames and bool grids stay so (the network converts them); others become float32.
    self._obs_dtype = observation_dtype(env.single_observation_space)
    obs, _ = env.reset()  # the env was seeded when it was made
    self._obs = np.asarray(obs, self._obs_dtype)
    self._is_first = np.ones(env.num_envs, bool)  # episode starts: recurrent policies reset there
    self._tracker = EpisodeTracker(env.num_envs)
    self._env_action_space = env.single_action_space
    self.num_envs = env.num_envs
    self.env_steps = 0
    self.dispatch_ahead = dispatch_ahead
    self._ahead: Optional[Tuple[Any, Dict[str, Any]]] = None  # (actions, extras) already asked for self._obs

  def _act(self) -> Tuple[Any, Dict[str, Any]]:
    action = self.policy(self._obs, self._is_first)
    return action, self.policy.extras

  def step(self) -> EpisodeStats:
    """One vector step: num_envs env steps."""
    timer = self.timer
    timer.enter(POLICY)
    try:
      ahead, self._ahead = self._ahead, None
      action, extras = ahead if ahead is not None else self._act()
      action = np.asarray(action)  # waits for a policy still computing
      timer.switch(ENV)
      # The env's dtype (its space checks are faster on it) and bounds; replay keeps the policy's action.
      next_obs, reward, terminated, truncated, info = self._env.step(env_action(action, self._env_action_space))
      next_obs = np.asarray(next_obs, self._obs_dtype)
      done = np.logical_or(terminated, truncated)
      obs, self._obs = self._obs, next_obs
      self._is_first = done  # autoreset: next_obs starts a new episode where one ended
      if self.dispatch_ahead:
        timer.switch(POLICY)
        self._ahead = self._act()
      if self._adder is not None:
        timer.switch(INSERT)
        bootstrap_obs = final_observations(next_obs, done, info)
        transitions = self._adder.add(obs, action, np.asarray(reward, np.float32), terminated, truncated,
                                      bootstrap_obs, extras)
        if self._sink is not None:
          self._sink(transitions)
    finally:
      timer.exit()
    self.env_steps += self.num_envs
    return self._tracker.update(reward, done)

  def close(self) -> None:
    self._env.close()

  def replace_adder(self, adder) -> None:
    """Continues with `adder` (fresh windows) in place of the current one."""
    self._adder = adder

  def state(self) -> Dict[str, Any]:
    """Everything needed to continue exactly from here, as data: observations, episode
    statistics, the adder's partial windows (its `state()`), the policy state and, where the
    envs can be pickled, the envs themselves as the bytes of their pickle (classic control can;
    envs holding simulators or windows may not, and gymnasium has no state-as-data API)."""
    try:
      env_bytes = pickle.dumps(self._env.envs, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - any env that refuses pickling is restarted instead
      env_bytes = None
    policy_state = self.policy.state() if hasattr(self.policy, "state") else None
    return {"obs": self._obs, "is_first": self._is_first, "env_steps": self.env_steps,
            "tracker": self._tracker.state(),
            "adder": self._adder.state() if self._adder is not None else None, "envs": env_bytes,
            "policy": policy_state,
            "ahead": jax.device_get(self._ahead)}  # actions asked for ahead: the policy state is past them

  def restore(self, state: Dict[str, Any], reset_seed: int) -> bool:
    """Continues from `state()` (or from it as a checkpoint keeps it: tuples as lists); returns
    False when the envs could not be restored and were reset with `reset_seed` instead (episodes
    in progress are dropped)."""
    self.env_steps = state["env_steps"]
    if state["policy"] is not None and hasattr(self.policy, "restore"):
      self.policy.restore(state["policy"])
    if state["envs"] is not None:
      self._env.envs = pickle.loads(state["envs"])
      self._obs = state["obs"]
      self._is_first = state["is_first"]
      self._tracker.restore(state["tracker"])
      if self._adder is not None:
        self._adder.restore(state["adder"])
      self._ahead = state["ahead"]
      return True
    obs, _ = self._env.reset(seed=reset_seed)
    self._obs = np.asarray(obs, self._obs_dtype)
    self._is_first = np.ones(self.num_envs, bool)
    self._ahead = None
    return False


def per_env_leaves(init: Callable[[PRNGKey, int], Any], key: PRNGKey, num_envs: int) -> Any:
  """The policy state's tree with True for leaves that hold one row per env (a recurrent
  core) and False for shared ones (the key, the env-step count): the leaves whose shape
  follows `num_envs` when the state is made abstractly for one env more."""
  made = jax.eval_shape(lambda k: init(k, num_envs), key)
  one_more = jax.eval_shape(lambda k: init(k, num_envs + 1), key)
  return jax.tree_util.tree_map(lambda a, b: a.shape != b.shape, made, one_more)


class GroupedPolicy:
  """`LocalPolicy` for envs stepped in `groups` groups of equal size (`GroupedActor`).

  One policy state serves every env: a call for group g acts on g's observations with g's
  rows of the per-env leaves and the shared leaves as they are, then writes both back. The
  key is split once per call and the env-step count (exploration schedules) grows by the
  group's envs, so the schedule follows the actor's env steps as with one group. Actions
  differ from one policy call over all envs (other random draws), not in distribution.
  """

  def __init__(self, policy: PolicyFns, variables: VariableClient, key: PRNGKey, num_envs: int, groups: int,
               timer=None, device: Optional[jax.Device] = None):
    if groups < 1 or num_envs % groups:
      raise ValueError(f"{num_envs} envs do not split into {groups} equal groups")
    size = self.group_size = num_envs // groups
    per_env = per_env_leaves(policy.init, key, num_envs)

    def select_for_group(params, obs, is_first, state, first_env):
      rows = jax.tree_util.tree_map(
          lambda leaf, mine: jax.lax.dynamic_slice_in_dim(leaf, first_env, size) if mine else leaf, state, per_env)
      action, extras, new_rows = policy.select_action(params, obs, is_first, rows)
      state = jax.tree_util.tree_map(
          lambda leaf, new, mine: jax.lax.dynamic_update_slice_in_dim(leaf, new, first_env, 0) if mine else new,
          state, new_rows, per_env)
      return action, extras, state

    self._select = jit_per_step(select_for_group)
    if device is not None:  # where the groups act, as LocalPolicy's `device`
      variables.place_on(device)
    self._device = device
    state = policy.init(key, num_envs)
    self._state = state if device is None else jax.device_put(state, device)
    self._variables = variables
    self.version = variables.version
    self.groups = [_PolicyGroup(self, np.int32(g * size)) for g in range(groups)]
    self.timer = timer if timer is not None else NULL_TIMER

  def act(self, first_env: np.int32, obs: np.ndarray, is_first: np.ndarray) -> Tuple[Any, Dict[str, Any]]:
    params, self.version = latest_params(self._variables, self.timer)
    action, extras, self._state = self._select(params, obs, is_first, self._state, first_env)
    return action, extras

  def state(self) -> Any:
    return jax.device_get(self._state)

  def restore(self, state: Any) -> None:
    """Continues from `state()`, or from it as a checkpoint keeps it (`jrl.types.rebuild`)."""
    self._state = jax.device_put(rebuild(self._state, state), self._device)


class _PolicyGroup:
  """One group's `BatchedPolicy` view of a `GroupedPolicy` (the state is the grouped policy's)."""

  def __init__(self, policy: GroupedPolicy, first_env: np.int32):
    self._policy, self._first_env = policy, first_env
    self.version = policy.version
    self.extras: Dict[str, Any] = {}

  def __call__(self, obs: np.ndarray, is_first: np.ndarray) -> Any:
    action, self.extras = self._policy.act(self._first_env, obs, is_first)
    self.version = self._policy.version
    return action


class GroupedActor:
  """The envs stepped in groups that take turns, each with its own vector env, adder and
  episode tracker (one `Actor` per group), sharing one `GroupedPolicy` and the sink.

  With `dispatch_ahead` and a policy that computes asynchronously, a group asks for its next
  actions right after its env step, and XLA computes them while the other groups step: with
  two groups, half of the envs are always in flight (`--env_groups 2`). It pays where the
  policy is costly (a CNN on frames) and costs a second policy call per vector step where it
  is not. Same interface as `Actor` for the runner and the actor nodes.
  """

  def __init__(self, envs: Sequence[gym.vector.VectorEnv], policy: GroupedPolicy, adders: Sequence[Any],
               sink: Optional[Callable[[Transition], None]] = None, timer=None, dispatch_ahead: bool = False):
    if len(envs) != len(policy.groups) or len(adders) != len(envs):
      raise ValueError(f"{len(envs)} env groups, {len(policy.groups)} policy groups, {len(adders)} adders")
    self.policy = policy
    self.timer = timer if timer is not None else NULL_TIMER
    self.groups: List[Actor] = [Actor(env, group, adder=adder, sink=sink, timer=self.timer, dispatch_ahead=dispatch_ahead)
                                for env, group, adder in zip(envs, policy.groups, adders)]
    self.num_envs = sum(actor.num_envs for actor in self.groups)

  @property
  def env_steps(self) -> int:
    return sum(actor.env_steps for actor in self.groups)

  def step(self) -> EpisodeStats:
    """One vector step of every group, in turn: num_envs env steps."""
    returns: List[float] = []
    lengths: List[int] = []
    for actor in self.groups:
      stats = actor.step()
      returns += stats.returns
      lengths += stats.lengths
    return EpisodeStats(returns, lengths)

  def close(self) -> None:
    for actor in self.groups:
      actor.close()

  def state(self) -> Dict[str, Any]:
    return {"groups": [actor.state() for actor in self.groups], "policy": self.policy.state()}

  def restore(self, state: Dict[str, Any], reset_seed: int) -> bool:
    """As `Actor.restore`; group g's envs reset with `reset_seed + g * group size` (env i with reset_seed + i)."""
    if len(state.get("groups", ())) != len(self.groups):
      raise ValueError(f"the saved actor has {len(state.get('groups', ()))} env groups, this one {len(self.groups)}")
    self.policy.restore(state["policy"])
    size = self.policy.group_size
    restored = [actor.restore(saved, reset_seed + g * size) for g, (actor, saved) in enumerate(zip(self.groups, state["groups"]))]
    return all(restored)
