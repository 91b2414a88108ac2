"""The device backend: env steps, acting, adding and learning in one compiled loop.

One *iteration* of the loop is, for off-policy agents (DQN, SAC), one vector
step of `num_envs` gymnax envs, its n-step transitions into the on-device ring
buffer, and the learner calls that step makes due (R2D2: the overlapping sequences
that step completes, with their start core states, counted in sequences); for on-policy agents (PPO,
IMPALA), rollouts of `sequence_length` steps that fill whole batches of
trajectories, then one learner call per batch in FIFO order (each trajectory
used once, as the Reverb queue does). A *chunk* is a `lax.scan` of iterations,
compiled once (ahead of time) into one `jax.jit` program; the host runs chunks
and, between them, only writes metrics, evaluates, saves policies and prints.

Agents are used as they are: `make_policy(...).select_action` acts,
`make_learner(...).update` learns, on the same `Transition` / `LearnerBatch`
layouts the embedded runner feeds them.

Samples per insert. The embedded runner makes learner call k due once
`min_size + (k - 1) * U * B / samples_per_insert` transitions are written
(`jrl.replay.calls_due`); here the host computes the same count for every vector step of
a chunk, with the same formula and exact integers, and hands the per-step
numbers to the chunk (its `xs`), so step i runs exactly the calls that
became due at step i. Each call draws `U x B` transitions and runs U updates
(`make_multi_update`, as the learner shell).

Devices. The loop is data-parallel over the learner mesh (`--learner_devices`):
envs, replay rows and batches are split along their env / batch axis, params
and optimiser state are replicated, and XLA inserts the gradient all-reduce
(the same GSPMD sharding as `jrl.learners.learner.Learner`). The program is
written on global arrays and random numbers are partitionable, so its values
do not depend on the number of devices (up to float summation order).

Determinism. Everything is a pure function of the seed: the same seed on the
same device count gives the same bytes.
"""

import dataclasses
import math
import os
import time
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from jrl import jit_cache
from jrl.agents import get_agent
from jrl.device import replay as device_replay
from jrl.device.envs import GymnaxVecEnv, reward_threshold
from jrl.errors import ConfigError
from jrl.experiment import plots
from jrl.experiment.bookkeeping import EvalHistory
from jrl.experiment.checkpoint import Checkpointer, CheckpointSchedule, checkpoint_to_resume
from jrl.experiment.builder import AgentParts
from jrl.experiment.config import ExperimentConfig
from jrl.experiment.files import CONFIG_FILE, SUMMARY_FILE, check_run_dir_target, config_payload, write_json
from jrl.experiment.logging import MetricsLogger, Progress, TensorBoard
from jrl.learners import sharding
from jrl.learners.learner import make_multi_update, params_digest
from jrl.policies import save_policy
from jrl.replay.local import calls_due
from jrl.replay.sequence_adder import START_STATE_KEY, RecurrentSequence
from jrl.types import LearnerBatch, Trajectory

ROLES = ("actor", "learner", "evaluator")
COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  "/jax/core/compile/backend_compile_duration")


class CompileClock:
  """Wall seconds JAX spent tracing, lowering and compiling, from its monitoring events (the
  union of their intervals: nested jits report nested events); backend compiles counted."""

  def __init__(self):
    self._intervals: List[tuple] = []
    self.by_event: Dict[str, float] = {}  # summed per event (nested events overlap)
    self.backend_compiles = 0
    self.active = True
    jax.monitoring.register_event_duration_secs_listener(self._listen)

  def _listen(self, event: str, duration: float, **_) -> None:
    if self.active and event in COMPILE_EVENTS:
      end = time.monotonic()
      self._intervals.append((end - duration, end))
      self.by_event[event] = self.by_event.get(event, 0.0) + duration
      if event == COMPILE_EVENTS[-1]:
        self.backend_compiles += 1

  @property
  def seconds(self) -> float:
    return self.seconds_between(float("-inf"), float("inf"))

  def seconds_between(self, t0: float, t1: float) -> float:
    """Compile seconds inside [t0, t1] (time.monotonic() clock)."""
    total, reach = 0.0, t0
    for start, end in sorted(self._intervals):
      start, end = max(start, reach), min(end, t1)
      if end > start:
        total += end - start
        reach = end
    return total


class Carry(NamedTuple):
  """Everything the compiled loop carries from one iteration to the next."""
  env_state: Any              # gymnax states [N]
  obs: jax.Array              # [N, *obs]
  actor_state: Any            # the policy's state (key, env steps)
  learner_state: Any          # the learner's training state
  env_key: jax.Array          # env randomness
  replay_key: jax.Array       # replay sampling (folded with the call count)
  episode_return: jax.Array   # [N] running returns
  episode_length: jax.Array   # [N] int32 running lengths
  learner_calls: jax.Array    # [] int32
  window: Any                 # NStepWindow (off-policy) or None
  ring: Any                   # Ring (off-policy) or None


def build_device_parts(agent_name: str, env: GymnaxVecEnv, agent_cfg) -> AgentParts:
  agent = get_agent(agent_name)
  networks = agent.make_networks(env.spec, agent_cfg)
  return AgentParts(agent, env.spec, networks, agent.make_replay_spec(agent_cfg))


class Plan(NamedTuple):
  """The loop's shape: how many env steps an iteration and a chunk take."""
  on_policy: bool
  num_envs: int
  rollouts: int             # rollouts per iteration (on-policy)
  calls_per_iteration: int  # learner calls per iteration (on-policy)
  iteration_steps: int      # env steps per iteration
  chunk_iterations: int
  n_step: int               # off-policy: transitions are emitted n - 1 steps late
  sequence_length: int = 0  # replayed sequences (R2D2): steps per sequence, else 0
  sequence_period: int = 0  # and steps between the starts of consecutive sequences

  @property
  def replayed_sequences(self) -> bool:
    return self.sequence_length > 0

  @property
  def chunk_steps(self) -> int:
    return self.iteration_steps * self.chunk_iterations


def make_plan(exp: ExperimentConfig, parts: AgentParts, agent_cfg, num_devices: int,
              chunk_steps: Optional[int] = None) -> Plan:
  spec = parts.replay_spec
  n, b = exp.num_envs, agent_cfg.batch_size
  if n % num_devices:
    raise ConfigError("num_envs", f"must be divisible by the {num_devices} learner devices, got {n}")
  if spec.sequences:
    if n % b and b % n:
      raise ConfigError("num_envs", f"and batch_size must divide one another for on-policy agents on the device "
                                    f"backend (rollouts fill whole batches), got {n} and {b}")
    rollouts = max(1, b // n)
    calls = rollouts * n // b
    iteration = rollouts * n * spec.sequence_length
    n_step = 1
  else:
    device_replay.check_sizes(n, b, num_devices)
    rollouts, calls, iteration = 1, 0, n
    # R2D2's n-step targets are the learner's; its sequences leave the window when due.
    n_step = 1 if spec.replayed_sequences else getattr(agent_cfg, "n_step", 1)
  # Metric rows are cut inside a chunk; evaluations need the host. A run ends on a whole chunk.
  target = chunk_steps or min(exp.eval_every, exp.steps)
  return Plan(spec.sequences, n, rollouts, calls, iteration, max(1, target // iteration), n_step,
              spec.replay_sequence_length, spec.replay_sequence_period)


def _env_spec(tree, leading):
  return jax.tree_util.tree_map(lambda _: P(*leading), tree)


def carry_partition_specs(carry: Carry) -> Carry:
  """Env axis split over the mesh (axis 0 of env leaves, axis 1 of window and ring rows)."""
  env = lambda t: _env_spec(t, ("data",))
  rows = lambda t: _env_spec(t, (None, "data"))
  rep = lambda t: _env_spec(t, ())
  if isinstance(carry.window, device_replay.SequenceWindow):
    window = device_replay.SequenceWindow(rows(carry.window.steps), P())
  else:
    window = None if carry.window is None else carry.window._replace(
        **{f: rows(getattr(carry.window, f)) for f in carry.window._fields if f != "steps"}, steps=P())
  ring = None if carry.ring is None else device_replay.Ring(
      rows(carry.ring.data), P(), None if carry.ring.priority is None else P(None, "data"))
  return Carry(env(carry.env_state), env(carry.obs), rep(carry.actor_state), rep(carry.learner_state),
               P(), P(), env(carry.episode_return), env(carry.episode_length), P(), window, ring)


class DeviceLoop:
  """The compiled pieces of a device run: init, chunk and evaluation."""

  def __init__(self, exp: ExperimentConfig, agent_cfg, env: GymnaxVecEnv, parts: AgentParts,
               mesh: jax.sharding.Mesh, plan: Plan):
    self.exp, self.cfg, self.env, self.parts, self.mesh, self.plan = exp, agent_cfg, env, parts, mesh, plan
    agent = parts.agent
    self.learner = agent.make_learner(parts.networks, agent_cfg)
    self.policy = agent.make_policy(parts.networks, agent_cfg)
    self.eval_policy = agent.make_policy(parts.networks, agent_cfg, evaluation=True)
    self.spec = parts.replay_spec
    self.batch_size = agent_cfg.batch_size
    self.updates_per_call = 1 if plan.on_policy else exp.updates_per_call
    self.multi_update = make_multi_update(self.learner.update)
    self.gather = device_replay.make_gather(mesh, plan.num_envs)
    self.gamma = float(getattr(agent_cfg, "discount", 0.99))
    self.metric_keys = self._metric_keys()
    self.env_sharding = NamedSharding(mesh, P("data"))
    self.batch_sharding = NamedSharding(mesh, P(None, "data"))
    self.replicated = sharding.replicated(mesh)

  # Shapes and shardings.

  def _metric_keys(self) -> List[str]:
    state = jax.eval_shape(self.learner.init, jax.random.PRNGKey(0))
    example = self._example_batch()
    _, metrics = jax.eval_shape(self.learner.update, state, example)
    return sorted(k for k, v in metrics.items() if k != "priorities" and len(v.shape) == 0)

  def _policy_extras(self, num_envs: int) -> Dict[str, jax.ShapeDtypeStruct]:
    """Shapes of what the acting policy reports for `num_envs` envs (no compute)."""
    params = jax.eval_shape(lambda k: self.learner.params(self.learner.init(k)), jax.random.PRNGKey(0))
    obs = jax.ShapeDtypeStruct((num_envs,) + self.parts.env_spec.observation_shape, jnp.float32)
    is_first = jax.ShapeDtypeStruct((num_envs,), bool)
    state = jax.eval_shape(lambda k: self.policy.init(k, num_envs), jax.random.PRNGKey(0))
    return jax.eval_shape(self.policy.select_action, params, obs, is_first, state)[1]

  def _example_batch(self) -> LearnerBatch:
    spec = self.parts.env_spec
    obs = jnp.zeros((self.batch_size,) + spec.observation_shape, jnp.float32)
    act = jnp.zeros((self.batch_size,) + spec.action_shape, spec.action_dtype)
    scalar = jnp.zeros((self.batch_size,), jnp.float32)
    if not self.plan.on_policy and not self.plan.replayed_sequences:
      from jrl.types import Transition
      return LearnerBatch(Transition(obs, act, scalar, scalar, obs), scalar)
    extras = self._policy_extras(self.batch_size)
    t = self.plan.sequence_length or self.spec.sequence_length
    seq = lambda x: jnp.zeros((x.shape[0], t) + x.shape[1:], x.dtype)
    if self.plan.replayed_sequences:
      start = extras[START_STATE_KEY]
      return LearnerBatch(RecurrentSequence(seq(obs), seq(act), seq(scalar), seq(scalar), seq(scalar), seq(obs),
                                            jnp.zeros(start.shape, start.dtype)), scalar)
    traj = Trajectory(seq(obs), seq(act), seq(scalar), seq(scalar), seq(scalar), seq(obs),
                      {k: seq(v) for k, v in extras.items()})
    return LearnerBatch(traj, scalar)

  def carry_shardings(self, carry_shape: Carry) -> Carry:
    specs = carry_partition_specs(carry_shape)
    return jax.tree_util.tree_map(lambda s: NamedSharding(self.mesh, s), specs,
                                  is_leaf=lambda x: isinstance(x, P))

  # Init.

  def init(self, seed: int) -> Carry:
    learner_key, actor_key, rest = jax.random.split(jax.random.PRNGKey(seed), 3)
    reset_key, env_key, replay_key = jax.random.split(rest, 3)
    n = self.plan.num_envs
    obs, env_state = self.env.reset(reset_key, n)
    learner_state = self.learner.init(learner_key)
    window = ring = None
    if self.plan.replayed_sequences:
      action_example = jnp.zeros((n,) + self.parts.env_spec.action_shape, self.parts.env_spec.action_dtype)
      start = self._policy_extras(n)[START_STATE_KEY]
      start_example = jnp.zeros(start.shape, start.dtype)
      window = device_replay.sequence_window_init(self.plan.sequence_length, obs, action_example, start_example)
      _, row, _ = device_replay.sequence_window_add(window, obs, action_example, jnp.zeros(n), jnp.zeros(n, bool),
                                                    jnp.zeros(n, bool), obs, start_example, self.plan.sequence_period)
      ring = device_replay.ring_init(row, max(1, self.spec.max_size // n), self.spec.prioritized)
    elif not self.plan.on_policy:
      action_example = jnp.zeros((n,) + self.parts.env_spec.action_shape, self.parts.env_spec.action_dtype)
      window = device_replay.window_init(self.plan.n_step, obs, action_example)
      _, row, _ = device_replay.window_add(window, obs, action_example, jnp.zeros(n), jnp.zeros(n, bool),
                                           jnp.zeros(n, bool), obs, self.gamma)
      ring = device_replay.ring_init(row, max(1, self.spec.max_size // n), self.spec.prioritized)
    return Carry(env_state, obs, self.policy.init(actor_key, n), learner_state, env_key, replay_key,
                 jnp.zeros(n, jnp.float32), jnp.zeros(n, jnp.int32), jnp.zeros((), jnp.int32), window, ring)

  # One vector step of acting.

  def _act(self, carry: Carry):
    params = self.learner.params(carry.learner_state)
    is_first = carry.episode_length == 0  # a new episode starts with this observation
    action, extras, actor_state = self.policy.select_action(params, carry.obs, is_first, carry.actor_state)
    env_key, step_key = jax.random.split(carry.env_key)
    out = self.env.step(step_key, carry.env_state, action)
    done = jnp.logical_or(out.terminated, out.truncated)
    ep_return = carry.episode_return + out.reward
    ep_length = carry.episode_length + 1
    stats = {"return_sum": jnp.sum(jnp.where(done, ep_return, 0.0)),
             "episodes": jnp.sum(done.astype(jnp.int32)),
             "length_sum": jnp.sum(jnp.where(done, ep_length, 0))}
    carry = carry._replace(env_state=out.state, obs=jax.lax.with_sharding_constraint(out.observation,
                                                                                       self.env_sharding),
                           actor_state=actor_state, env_key=env_key,
                           episode_return=jnp.where(done, 0.0, ep_return),
                           episode_length=jnp.where(done, 0, ep_length))
    return carry, (action, extras, out), stats

  def _zero_metrics(self):
    return {k: jnp.zeros((), jnp.float32) for k in self.metric_keys}

  def _add_metrics(self, total, metrics):
    return {k: total[k] + jnp.mean(metrics[k]).astype(jnp.float32) for k in self.metric_keys}

  # Iterations.

  def _off_policy_iteration(self, carry: Carry, calls_due):
    obs = carry.obs
    carry, (action, extras, out), stats = self._act(carry)
    if self.plan.replayed_sequences:
      window, row, valid = device_replay.sequence_window_add(
          carry.window, obs, action, out.reward, out.terminated, out.truncated, out.final_observation,
          extras[START_STATE_KEY], self.plan.sequence_period)
    else:
      window, row, valid = device_replay.window_add(carry.window, obs, action, out.reward, out.terminated,
                                                    out.truncated, out.final_observation, self.gamma)
    ring = device_replay.ring_insert(carry.ring, row, valid)
    carry = carry._replace(window=window, ring=ring)
    lead = (self.updates_per_call, self.batch_size)

    def call(_, inner):
      learner_state, calls, totals, priority = inner
      key = jax.random.fold_in(carry.replay_key, calls)
      if priority is None:
        slot, env = device_replay.sample_indices(key, ring, lead, self.plan.num_envs)
        data, weights = self.gather(ring.data, slot, env), jnp.ones(lead, jnp.float32)
      else:
        slot, env, weights = device_replay.sample_prioritized(key, ring._replace(priority=priority), lead,
                                                              self.spec.priority_exponent,
                                                              self.spec.importance_exponent)
        data = jax.tree_util.tree_map(lambda x: x[slot, env], ring.data)  # across devices
        data = jax.lax.with_sharding_constraint(data, jax.tree_util.tree_map(lambda _: self.batch_sharding, data))
      learner_state, metrics = self.multi_update(learner_state, LearnerBatch(data, weights))
      if priority is not None:
        priority = device_replay.update_priorities(ring._replace(priority=priority), slot, env,
                                                   metrics["priorities"]).priority
      return learner_state, calls + 1, self._add_metrics(totals, metrics), priority

    learner_state, calls, totals, priority = jax.lax.fori_loop(
        0, calls_due, call, (carry.learner_state, carry.learner_calls, self._zero_metrics(), ring.priority))
    carry = carry._replace(learner_state=learner_state, learner_calls=calls, ring=ring._replace(priority=priority))
    return carry, {**stats, "calls": calls_due.astype(jnp.int32), **totals}

  def _on_policy_iteration(self, carry: Carry, _):
    def step(c, _):
      obs = c.obs
      c, (action, extras, out), stats = self._act(c)
      done = jnp.logical_or(out.terminated, out.truncated)
      traj = Trajectory(obs, action, out.reward, 1.0 - out.terminated.astype(jnp.float32),
                        done.astype(jnp.float32), out.final_observation, extras)
      return c, (traj, stats)

    def rollout(c, _):
      c, (traj, stats) = jax.lax.scan(step, c, None, length=self.spec.sequence_length)   # [T, N, ...]
      traj = jax.tree_util.tree_map(lambda x: jnp.swapaxes(x, 0, 1), traj)                 # [N, T, ...]
      return c, (traj, jax.tree_util.tree_map(jnp.sum, stats))

    carry, (traj, stats) = jax.lax.scan(rollout, carry, None, length=self.plan.rollouts)  # [R, N, T, ...]
    stats = jax.tree_util.tree_map(jnp.sum, stats)
    calls, b = self.plan.calls_per_iteration, self.batch_size
    batches = jax.tree_util.tree_map(lambda x: x.reshape((calls, b) + x.shape[2:]), traj)  # FIFO: rollout, env
    batches = jax.lax.with_sharding_constraint(batches, jax.tree_util.tree_map(lambda _: self.batch_sharding,
                                                                               batches))

    def call(c, batch):
      learner_state, totals = c
      learner_state, metrics = self.learner.update(learner_state, LearnerBatch(batch, jnp.ones((b,), jnp.float32)))
      return (learner_state, self._add_metrics(totals, metrics)), None

    (learner_state, totals), _ = jax.lax.scan(call, (carry.learner_state, self._zero_metrics()), batches)
    carry = carry._replace(learner_state=learner_state, learner_calls=carry.learner_calls + calls)
    return carry, {**stats, "calls": jnp.asarray(calls, jnp.int32), **totals}

  def chunk(self, carry: Carry, calls_due: jax.Array):
    """`chunk_iterations` iterations; `calls_due[i]`: learner calls due at iteration i (off-policy)."""
    iteration = self._on_policy_iteration if self.plan.on_policy else self._off_policy_iteration
    return jax.lax.scan(iteration, carry, calls_due)

  def evaluate(self, params, key):
    return evaluate_episodes(self.env, self.eval_policy, params, key, self.exp.eval_episodes)


def evaluation_key(evaluator_seed: int, index: int) -> jax.Array:
  """The key of evaluation `index` of a run whose evaluator is seeded `evaluator_seed`."""
  return jax.random.fold_in(jax.random.PRNGKey(evaluator_seed), index)


def evaluate_episodes(env: GymnaxVecEnv, policy, params, key: jax.Array, episodes: int) -> jax.Array:
  """Returns [episodes] of `policy` (a `PolicyFns`, greedy for evaluation) on device: the first
  episode of each of `episodes` envs reset with `key`. Jittable (`episodes` static)."""
  env_key, policy_key, step_key = jax.random.split(key, 3)
  obs, env_state = env.reset(env_key, episodes)
  limit = (env.max_episode_steps or 100_000) + 1

  def cond(c):
    return jnp.logical_and(c[4].any(), c[6] < limit)

  def body(c):
    obs, env_state, actor_state, returns, running, key, t = c
    is_first = jnp.full(obs.shape[:1], t == 0)  # envs that ended no longer count
    action, _, actor_state = policy.select_action(params, obs, is_first, actor_state)
    key, k = jax.random.split(key)
    out = env.step(k, env_state, action)
    returns = returns + out.reward * running
    running = jnp.logical_and(running, ~jnp.logical_or(out.terminated, out.truncated))
    return out.observation, out.state, actor_state, returns, running, key, t + 1

  init = (obs, env_state, policy.init(policy_key, episodes), jnp.zeros(episodes, jnp.float32),
          jnp.ones(episodes, bool), step_key, jnp.zeros((), jnp.int32))
  return jax.lax.while_loop(cond, body, init)[3]


def _prepare_run_dir(exp: ExperimentConfig, agent_cfg) -> str:
  """A new run's directory, with its config.json; a resumed run's as it is."""
  if exp.resume:
    return exp.resume
  run_dir = exp.run_dir or exp.default_run_dir()
  check_run_dir_target(run_dir)
  os.makedirs(run_dir, exist_ok=True)
  write_json(os.path.join(run_dir, CONFIG_FILE), config_payload(exp, agent_cfg))
  return run_dir


@dataclasses.dataclass
class HostState:
  """What the host keeps between chunks: counters, the metric sums of the row being cut, the
  evaluation history, and its clocks. Saved in every checkpoint beside the loop's carry."""
  history: EvalHistory
  next_log: int
  next_eval: int
  pending: Dict[str, float]
  env_steps: int = 0
  learner_steps: int = 0
  episodes_total: int = 0
  vector_steps: int = 0
  last_eval: Dict[str, Any] = dataclasses.field(default_factory=dict)
  last_eval_steps: int = -1
  loop_seconds: float = 0.0
  eval_seconds: float = 0.0
  wall_before: float = 0.0  # wall seconds of the sessions before this one
  sessions: int = 0         # times the run was resumed
  # Where the last metric row was cut: loop seconds (chunks only), env steps, learner steps.
  row_mark: Tuple[float, int, int] = (0.0, 0, 0)

  def state(self) -> Dict[str, Any]:
    return {**dataclasses.asdict(self), "history": self.history.state()}

  @classmethod
  def from_state(cls, state: Dict[str, Any]) -> "HostState":
    return cls(**{**state, "history": EvalHistory.from_state(state["history"])})


def carry_to_host(carry: Carry) -> List[np.ndarray]:
  """The carry's leaves as numpy arrays (whole arrays, gathered from every device)."""
  return [np.asarray(x) for x in jax.device_get(jax.tree_util.tree_leaves(carry))]


def carry_from_host(leaves: List[np.ndarray], carry_shape: Carry, shardings: Carry, source: str) -> Carry:
  """A saved carry placed as `shardings`; ConfigError('resume') if it does not fit this run's loop."""
  expected, treedef = jax.tree_util.tree_flatten(carry_shape)
  if len(leaves) != len(expected):
    raise ConfigError("resume", f"{source} holds {len(leaves)} loop arrays, this run's loop has {len(expected)}")
  for i, (leaf, want) in enumerate(zip(leaves, expected)):
    if leaf.shape != want.shape or leaf.dtype != want.dtype:
      raise ConfigError("resume", f"{source}: loop array {i} is {leaf.dtype}{list(leaf.shape)}, this run's loop "
                                  f"has {want.dtype}{list(want.shape)}")
  return jax.device_put(jax.tree_util.tree_unflatten(treedef, leaves), shardings)


def run_device(exp: ExperimentConfig, agent_cfg, chunk_steps: Optional[int] = None) -> Dict[str, Any]:
  """Trains `exp.agent` on the gymnax env `exp.env` ('gymnax:ENV_ID') in one compiled loop;
  returns the summary (also written to summary.json). `chunk_steps` overrides the env steps
  per compiled chunk (default: eval_every or steps if smaller, rounded down to whole
  iterations); the run ends with the first whole chunk that reaches `exp.steps`.

  Checkpoints (`jrl.experiment.checkpoint`) are taken between chunks, as `checkpoint_every_steps`
  and `checkpoint_every_seconds` ask, and at the end: the loop's whole carry (envs, replay ring,
  learner and policy state, keys) and the host's counters. `exp.resume` continues from the newest
  one; a resumed run ends with the same bytes as one never stopped."""
  start = time.monotonic()
  clock = CompileClock()
  cache_dir = jit_cache.enable_compilation_cache()
  if exp.num_processes > 1:
    raise ConfigError("backend", "'device' runs in one process; it cannot span --num_processes")
  env = GymnaxVecEnv(exp.env)  # ConfigError for a gymnasium or unknown id
  parts = build_device_parts(exp.agent, env, agent_cfg)
  mesh = sharding.make_mesh(exp.learner_devices)
  sharding.check_batch_size(agent_cfg.batch_size, mesh)
  plan = make_plan(exp, parts, agent_cfg, int(mesh.devices.size), chunk_steps)
  threshold = exp.reward_threshold if exp.reward_threshold is not None else reward_threshold(exp.env)
  resume_info = checkpoint_to_resume(exp.resume, exp.steps) if exp.resume else None
  saved = Checkpointer.read_run_state(resume_info) if resume_info else None
  run_dir = _prepare_run_dir(exp, agent_cfg)
  checkpointer = Checkpointer(run_dir, exp.keep_checkpoints)
  checkpointer.clean_partial()

  loop = DeviceLoop(exp, agent_cfg, env, parts, mesh, plan)
  carry_shape = jax.eval_shape(loop.init, exp.seed)
  shardings = loop.carry_shardings(carry_shape)
  if saved is None:
    carry = jax.jit(loop.init, static_argnums=0, out_shardings=shardings)(exp.seed)
  else:
    carry = carry_from_host(saved["carry"], carry_shape, shardings, os.path.relpath(resume_info.path))
  xs_sharding = loop.replicated
  compile_start = time.monotonic()
  chunk_fn = jax.jit(loop.chunk, in_shardings=(shardings, xs_sharding), out_shardings=(shardings, loop.replicated),
                     donate_argnums=0)
  calls_example = jax.ShapeDtypeStruct((plan.chunk_iterations,), jnp.int32)
  compiled_chunk = chunk_fn.lower(carry_shape, calls_example).compile()
  params_shape = jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=loop.replicated),
      jax.eval_shape(lambda c: loop.learner.params(c.learner_state), carry_shape))
  key_shape = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=loop.replicated)
  compiled_eval = jax.jit(loop.evaluate).lower(params_shape, key_shape).compile()
  compile_seconds = time.monotonic() - compile_start
  get_params = jax.jit(lambda c: loop.learner.params(c.learner_state), out_shardings=loop.replicated)

  if saved is None:
    host = HostState(EvalHistory(threshold), exp.log_every, exp.eval_every,
                     {"return_sum": 0.0, "episodes": 0, "length_sum": 0, "calls": 0,
                      **{k: 0.0 for k in loop.metric_keys}})
    positions: Dict[str, Any] = {}
  else:
    host = HostState.from_state(saved["host"])
    host.sessions += 1
    positions = saved["positions"]
  # A resumed run drops what was logged after its checkpoint.
  tb = TensorBoard(run_dir, resume_from=positions.get("tensorboard", {}) if exp.resume else None)
  loggers = {role: MetricsLogger(run_dir, role, tb, resume_from=positions.get(role)) for role in ROLES}
  progress = Progress(f"{exp.agent} {exp.env} s{exp.seed}", exp.progress_seconds)
  schedule = CheckpointSchedule(exp.checkpoint_every_steps, exp.checkpoint_every_seconds, host.env_steps)
  evaluator_seed = exp.seed + 10_000
  samples_per_call = loop.updates_per_call * loop.batch_size
  get_params(carry)  # compiled now: the loop itself compiles nothing
  jax.device_put(evaluation_key(evaluator_seed, 0), loop.replicated)
  compiles_before_loop = clock.backend_compiles
  elapsed = lambda: host.wall_before + time.monotonic() - start
  setup_seconds = time.monotonic() - start  # metrics' wall_seconds count from the run's start, as summary.wall_seconds

  def snapshot_info(**extra) -> Dict[str, Any]:
    return {"actor_steps": host.env_steps, "learner_steps": host.learner_steps, **extra}

  def evaluate():
    t0 = time.monotonic()
    host.last_eval_steps = host.env_steps
    eval_index = host.history.count
    params = get_params(carry)
    key = jax.device_put(evaluation_key(evaluator_seed, eval_index), loop.replicated)
    returns = np.asarray(compiled_eval(params, key))
    row = host.history.record(host.env_steps, returns)
    loggers["evaluator"].write({"actor_steps": host.env_steps, "learner_steps": host.learner_steps,
                                **{k: v for k, v in row.items() if k != "is_best"}, "wall_seconds": elapsed()})
    host.last_eval = {"eval_return": row["eval_return"], "eval_index": eval_index, "eval_seed": evaluator_seed,
                      "eval_episodes": exp.eval_episodes}
    if row["is_best"]:
      save_policy(run_dir, "best", params, snapshot_info(**host.last_eval))
    host.eval_seconds += time.monotonic() - t0

  def save_checkpoint():
    state = host.state()
    state["wall_before"] = elapsed()
    run_state = {"carry": carry_to_host(carry), "host": state,
                 "positions": {"tensorboard": tb.position(), **{role: log.position() for role, log in loggers.items()}}}
    counters = {"actor_steps": host.env_steps, "learner_steps": host.learner_steps,
                "episodes": host.episodes_total, "evaluations": host.history.count}
    checkpointer.save(None, run_state, counters)
    save_policy(run_dir, "latest", jax.device_get(get_params(carry)), snapshot_info())
    schedule.done(host.env_steps)

  def chunk_schedule() -> np.ndarray:
    """Learner calls due at each iteration of the next chunk (off-policy; exact integers)."""
    if plan.on_policy:
      return np.zeros(plan.chunk_iterations, np.int32)
    lag = plan.n_step - 1
    written = lambda steps: max(0, steps - lag) * plan.num_envs
    if plan.replayed_sequences:  # counted in sequences, as the host counts R2D2's items
      written = lambda steps: device_replay.sequences_written(steps, plan.num_envs, plan.sequence_length,
                                                              plan.sequence_period)
    owed = [calls_due(written(host.vector_steps + i), loop.spec, samples_per_call)
            for i in range(plan.chunk_iterations + 1)]
    return np.diff(owed).astype(np.int32)

  try:
    while host.env_steps < exp.steps:
      chunk_start = time.monotonic()
      due = jax.device_put(chunk_schedule(), xs_sharding)
      carry, ys = compiled_chunk(carry, due)
      ys = jax.device_get(ys)
      chunk_wall = time.monotonic() - chunk_start
      host.loop_seconds += chunk_wall
      chunk_began = elapsed() - chunk_wall
      loop_began = host.loop_seconds - chunk_wall
      host.vector_steps += plan.chunk_iterations if not plan.on_policy else 0
      for i in range(plan.chunk_iterations):
        host.env_steps += plan.iteration_steps
        for key in host.pending:
          host.pending[key] += ys[key][i].item()
        host.learner_steps += int(ys["calls"][i]) * loop.updates_per_call
        host.episodes_total += int(ys["episodes"][i])
        if host.env_steps >= host.next_log:
          host.next_log += exp.log_every * max(1, math.ceil((host.env_steps - host.next_log + 1) / exp.log_every))
          share = (i + 1) / plan.chunk_iterations  # iterations take equal shares of their chunk's time
          log_rows(exp, loop, host, loggers, progress, loop_began + chunk_wall * share, chunk_began + chunk_wall * share)
      if host.env_steps >= host.next_eval:
        host.next_eval += exp.eval_every * max(1, math.ceil((host.env_steps - host.next_eval + 1) / exp.eval_every))
        evaluate()
        if exp.stop_at_threshold and host.history.reached:
          break
      if schedule.due(host.env_steps) and host.env_steps < exp.steps:  # the last one follows the loop
        save_checkpoint()
    if host.last_eval_steps != host.env_steps:
      evaluate()
    save_checkpoint()
    final_params = jax.device_get(get_params(carry))
    save_policy(run_dir, "final", final_params, snapshot_info(**host.last_eval))
  finally:
    for logger in loggers.values():
      logger.close()
    tb.close()

  wall = elapsed()
  clock.active = False
  summary = {
      "agent": exp.agent, "env": exp.env, "seed": exp.seed, "replay": "device",
      "actor_steps": host.env_steps, "learner_steps": host.learner_steps, "episodes": host.episodes_total,
      "wall_seconds": round(wall, 3), **host.history.summary(),
      "learner_devices": int(mesh.devices.size), "learner_processes": 1, "resumed": saved is not None,
      "checkpoints": [os.path.basename(p) for p in checkpointer.all()],
      "backend": "device", "num_envs": plan.num_envs, "chunk_steps": plan.chunk_steps,
      "compile_seconds": round(compile_seconds, 3), "jax_compile_seconds": round(clock.seconds, 3),
      "setup_seconds": round(setup_seconds, 3),
      "loop_seconds": round(host.loop_seconds, 3), "eval_seconds": round(host.eval_seconds, 3),
      "env_steps_per_second": round(host.env_steps / max(host.loop_seconds, 1e-9), 1),
      "loop_compiles": clock.backend_compiles - compiles_before_loop,
      "compilation_cache": cache_dir,
      "params_digest": params_digest(final_params),
  }
  write_json(os.path.join(run_dir, SUMMARY_FILE), summary)
  plots.plot_learning_curve(run_dir, f"{exp.agent} on {exp.env}, seed {exp.seed} (device)", threshold)
  progress.maybe_print(f"done: {host.env_steps} steps in {wall:.1f}s (compile {compile_seconds:.1f}s, "
                       f"{summary['env_steps_per_second']:.0f} env-steps/s) | eval {summary['eval_return']:.1f} "
                       f"(best {summary['best_eval_return']:.1f}) | steps to threshold "
                       f"{summary['steps_to_threshold']} | {run_dir}", force=True)
  summary["run_dir"] = run_dir
  return summary


def log_rows(exp: ExperimentConfig, loop: DeviceLoop, host: HostState, loggers, progress, loop_seconds: float,
             wall: float) -> None:
  """Writes the actor and learner rows summed in `host.pending` since the last row, prints
  progress, and starts the next row. Rates are the row's own: its steps and updates over the
  loop's seconds since the last row (evaluations and checkpoints between chunks left out)."""
  pending = host.pending
  mark_seconds, mark_steps, mark_updates = host.row_mark
  seconds = max(loop_seconds - mark_seconds, 1e-9)
  sps = (host.env_steps - mark_steps) / seconds
  ups = (host.learner_steps - mark_updates) / seconds
  host.row_mark = (loop_seconds, host.env_steps, host.learner_steps)
  count = pending["episodes"]
  ep_return = pending["return_sum"] / count if count else float("nan")
  ep_length = pending["length_sum"] / count if count else float("nan")
  loggers["actor"].write({"actor_steps": host.env_steps, "episodes": host.episodes_total, "episode_return": ep_return,
                          "episode_length": ep_length, "steps_per_second": sps, "wall_seconds": wall})
  if pending["calls"]:
    loggers["learner"].write({"actor_steps": host.env_steps, "learner_steps": host.learner_steps,
                              **{k: pending[k] / pending["calls"] for k in loop.metric_keys},
                              "updates_per_second": ups, "wall_seconds": wall})
  history = host.history
  history_text = f"{history.returns[-1]:.1f} (best {max(history.returns):.1f})" if history.returns else "-"
  progress.maybe_print(f"steps {host.env_steps}/{exp.steps} | {sps:.0f} env-steps/s | updates {host.learner_steps} "
                       f"({ups:.0f}/s) | episode return {'-' if not count else f'{ep_return:.1f}'} | "
                       f"eval {history_text}")
  host.pending = {k: 0 * v for k, v in pending.items()}
