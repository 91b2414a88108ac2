"""The device backend's compiled loop: env steps, acting, adding and learning as pure functions.

The agent's item kind (`jrl.replay.kinds`) decides what an *iteration* is, and brings its
window and ring. For replayed kinds (`Transitions`: DQN, SAC; `ReplayedSequences`: R2D2) it
is one vector step of `num_envs` gymnax envs, the rows that step completes (n-step
transitions; R2D2's overlapping sequences with their start core states, counted in
sequences) into the on-device ring buffer, and the learner calls that step makes due
(`replay_iteration`); for a `TrajectoryQueue` (PPO, IMPALA), rollouts of `sequence_length`
steps that fill whole batches of trajectories, then one learner call per batch in FIFO order
(each trajectory used once, as the Reverb queue does: `rollout_iteration`). Rewards are
clipped as the kind's `reward_clip` says, where the host's adder clips them; the episode
returns reported stay the env's own. A *chunk* is a loop of iterations with the run's
evaluations among them (greedy episodes on device, at the points the host schedules), compiled
once (ahead of time) into one `jax.jit` program whose trip count is an input. It returns its
metric rows summed on device and the evaluations' returns: the host writes rows, records
evaluations, saves policies, checkpoints and prints between chunks, a few array transfers each,
about every `CHUNK_SECONDS`.

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

import functools
from typing import Any, Dict, List, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from jrl.agents import get_agent
from jrl.errors import ConfigError
from jrl.experiment.builder import AgentParts
from jrl.experiment.config import ExperimentConfig
from jrl.gymnax_envs import GymnaxVecEnv
from jrl.learners import sharding
from jrl.learners.learner import make_multi_update
from jrl.replay import on_device as device_replay
from jrl.types import LearnerBatch, Transition


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
  window: Any                 # the item kind's window (NStepWindow, SequenceWindow), or None (a queue)
  ring: Any                   # Ring of its rows, or None (a queue)


def build_device_parts(agent_name: str, env: GymnaxVecEnv, agent_cfg) -> AgentParts:
  agent = get_agent(agent_name)
  networks = agent.make_networks(env.spec, agent_cfg)
  return AgentParts(agent, env.spec, networks, agent.make_replay_spec(agent_cfg))


# A chunk is compiled for at most MAX_CHUNK_STEPS env steps (a power of two iterations, so runs of
# nearby budgets share one program and load it from the cache); how many it runs is an input. The
# host sizes each chunk to about CHUNK_SECONDS of wall from the rate of the ones before (the first
# ones to FIRST_CHUNK_SHARE of the run at most): long enough that a run spends little of its wall
# on the host (a few array transfers and its rows a chunk), short enough for progress lines,
# wall-time checkpoints and Ctrl-C within seconds on the slowest device we run on (one CPU core).
MAX_CHUNK_STEPS = 131_072
CHUNK_SECONDS = 1.0
FIRST_CHUNK_SHARE = 1 / 64


class Plan(NamedTuple):
  """The loop's shape: how many env steps an iteration and a chunk take (the item kind's
  `device_layout`), and the static sizes of a chunk's outputs."""
  kind: Any                 # the agent's item kind (`jrl.replay.kinds`): its window, ring and iteration
  num_envs: int
  rollouts: int             # rollouts per iteration (a queue's)
  rollout_length: int       # vector steps per rollout
  calls_per_iteration: int  # learner calls each iteration makes itself (a queue's)
  iteration_steps: int      # env steps per iteration
  chunk_iterations: int     # iterations a chunk runs at most
  eval_slots: int = 1       # evaluations a chunk can make (every eval_every steps, and the run's last)
  row_slots: int = 1        # metric rows a chunk can complete (every log_every steps)
  fixed: bool = False       # every chunk runs chunk_iterations (`chunk_steps` given): no sizing by wall time

  @property
  def chunk_steps(self) -> int:
    return self.iteration_steps * self.chunk_iterations

  @property
  def vector_steps_per_iteration(self) -> int:
    return self.iteration_steps // self.num_envs


def chunk_iterations_for(steps: int, iteration_steps: int, chunk_steps: Optional[int] = None) -> int:
  """The most iterations a chunk runs: `chunk_steps` when given, else MAX_CHUNK_STEPS or the run if
  shorter, as a power of two of whole iterations, at least one."""
  if chunk_steps:
    return max(1, chunk_steps // iteration_steps)
  most = max(min(steps, MAX_CHUNK_STEPS) // iteration_steps, 1)
  return 1 << most.bit_length() - 1


def marks_within(span_steps: int, every: int) -> int:
  """The most multiples of `every` that `span_steps` consecutive env steps can pass."""
  return span_steps // every + 1


def make_plan(exp: ExperimentConfig, parts: AgentParts, agent_cfg, num_devices: int,
              chunk_steps: Optional[int] = None) -> Plan:
  kind = parts.replay_spec.kind
  n, b = exp.num_envs, agent_cfg.batch_size
  if n % num_devices:
    raise ConfigError("num_envs", f"must be divisible by the {num_devices} learner devices, got {n}")
  layout = kind.device_layout(n, b, num_devices)
  iterations = chunk_iterations_for(exp.steps, layout.iteration_steps, chunk_steps)
  span = iterations * layout.iteration_steps
  # An iteration evaluates or cuts a row at most once, however many marks it passes.
  evals = min(iterations, marks_within(span, exp.eval_every) + 1)  # + the run's last
  rows = min(iterations, marks_within(span, exp.log_every))
  return Plan(kind, n, layout.rollouts, layout.rollout_length, layout.calls_per_iteration, layout.iteration_steps,
              iterations, evals, rows, bool(chunk_steps))


class ChunkInputs(NamedTuple):
  """The host's schedule of one chunk (the same for every run of a vmapped sweep); arrays of
  [chunk_iterations]. Iterations from `iterations` on do not run: a chunk is sized by wall time
  and ends early at the run's budget or at a checkpoint due by env steps."""
  iterations: Any           # int32 []: iterations to run
  calls_due: Any            # int32: learner calls due at iteration i (replayed kinds)
  row: Any                  # int32: the metric row iteration i adds to (rows completed before it; the last: open)
  eval_slot: Any            # int32: the evaluation made after iteration i (-1: none)


class EvalBooks(NamedTuple):
  """One run's evaluation books, as its chunk needs them."""
  key: Any                  # PRNGKey(evaluator seed): evaluation k plays the episodes of fold_in(key, k)
  first_index: Any          # int32 []: the index of the chunk's first evaluation (evaluations so far)
  best: Any                 # float32 []: the best mean return so far (any value when there is none)
  stop_at: Any              # float32 []: a mean return at or above it ends the run (with may_stop)


class ChunkOutputs(NamedTuple):
  """What a chunk returns to the host: reduced on device, a few arrays whatever its length."""
  rows: Dict[str, Any]      # [row_slots + 1] each row's sums (the first continues the open row it was given;
                            # the one after the last completed row is the new open row)
  eval_returns: Any         # [eval_slots, eval_episodes] float32
  eval_means: Any           # [eval_slots] float32: the means the host records (its best and threshold rules)
  eval_counts: Dict[str, Any]  # [eval_slots] learner calls and episodes since the chunk began, at each evaluation
  best_slot: Any            # int32 []: the chunk's last new best evaluation (-1: none)
  best_params: Any          # the parameters that scored it
  iterations: Any           # int32 []: iterations run (fewer than asked when the run reached its threshold)


def _env_spec(tree, leading):
  return jax.tree_util.tree_map(lambda _: P(*leading), tree)


def carry_partition_specs(carry: Carry) -> Carry:
  """Env axis split over the mesh (axis 0 of env leaves, axis 1 of window and ring rows)."""
  env = lambda t: _env_spec(t, ("data",))
  rep = lambda t: _env_spec(t, ())
  # Window and ring: rows [n or S, N, ...] split on the env axis, their counters replicated.
  rows = lambda t: jax.tree_util.tree_map(lambda x: P(None, "data") if len(x.shape) else P(), t)
  return Carry(env(carry.env_state), env(carry.obs), rep(carry.actor_state), rep(carry.learner_state),
               P(), P(), env(carry.episode_return), env(carry.episode_length), P(), rows(carry.window),
               rows(carry.ring))


class DeviceLoop:
  """The compiled pieces of a device run: init, chunk and evaluation."""

  def __init__(self, exp: ExperimentConfig, agent_cfg, env: GymnaxVecEnv, parts: AgentParts,
               mesh: jax.sharding.Mesh, plan: Plan, metric_keys: Optional[Sequence[str]] = None):
    """`metric_keys`: the learner's scalar metrics, where a loop of the same agent has them (a
    sweep's loops at its grid points): working them out traces the learner's update."""
    self.exp, self.cfg, self.env, self.parts, self.mesh, self.plan = exp, agent_cfg, env, parts, mesh, plan
    agent = parts.agent
    self.learner = agent.make_learner(parts.networks, agent_cfg)
    self.policy = agent.make_policy(parts.networks, agent_cfg)
    self.eval_policy = agent.make_policy(parts.networks, agent_cfg, evaluation=True)
    self.spec, self.kind = parts.replay_spec, plan.kind
    self.batch_size = agent_cfg.batch_size
    self.updates_per_call = plan.kind.updates_per_call(exp.updates_per_call)
    self.multi_update = make_multi_update(self.learner.update)
    self.gather = device_replay.make_gather(mesh, plan.num_envs)
    if metric_keys is not None:
      self.metric_keys = list(metric_keys)
    self.env_sharding = NamedSharding(mesh, P("data"))
    self.batch_sharding = NamedSharding(mesh, P(None, "data"))
    self.replicated = sharding.replicated(mesh)

  # Shapes and shardings.

  @functools.cached_property
  def metric_keys(self) -> List[str]:
    """The learner's scalar metrics a row averages (worked out on first use: a trace of its update)."""
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
    """B rows of the item kind (zeros), as the learner is fed them."""
    spec = self.parts.env_spec
    obs = np.zeros(spec.observation_shape, np.float32)
    step = Transition(obs, np.zeros(spec.action_shape, spec.action_dtype), np.float32(0), np.float32(0), obs)
    extras = lambda: {k: np.zeros(v.shape[1:], v.dtype) for k, v in self._policy_extras(self.batch_size).items()}
    row = self.kind.example_row(step, extras)
    rows = jax.tree_util.tree_map(lambda x: jnp.zeros((self.batch_size,) + np.shape(x), np.asarray(x).dtype), row)
    return LearnerBatch(rows, jnp.zeros((self.batch_size,), jnp.float32))

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
    action_example = jnp.zeros((n,) + self.parts.env_spec.action_shape, self.parts.env_spec.action_dtype)
    window, ring = self.kind.device_init(self.spec, obs, action_example, lambda: self._policy_extras(n))
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

  def stat_dtypes(self) -> Dict[str, Any]:
    """What an iteration reports (`_act`'s episode stats, its learner calls, its learner metrics
    summed over calls), and their types."""
    counts = {"episodes": jnp.int32, "length_sum": jnp.int32, "calls": jnp.int32}
    return {"return_sum": jnp.float32, **counts, **{k: jnp.float32 for k in self.metric_keys}}

  def _zero_metrics(self):
    return {k: jnp.zeros((), jnp.float32) for k in self.metric_keys}

  def _add_metrics(self, total, metrics):
    return {k: total[k] + jnp.mean(metrics[k]).astype(jnp.float32) for k in self.metric_keys}

  # Iterations.

  def replay_iteration(self, carry: Carry, calls_due):
    """One vector step: its rows into the ring (the item kind's window emits them), then the
    `calls_due` learner calls, each on U x B rows sampled from the ring."""
    obs = carry.obs
    carry, (action, extras, out), stats = self._act(carry)
    window, row, valid = self.kind.device_add(carry.window, obs, action, out, extras)
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

  def rollout_iteration(self, carry: Carry, _):
    """Rollouts of T steps that fill whole batches of trajectories (the item kind's rows), then
    one learner call per batch in FIFO order (each trajectory used once)."""
    def step(c, _):
      obs = c.obs
      c, (action, extras, out), stats = self._act(c)
      _, traj, _ = self.kind.device_add(None, obs, action, out, extras)
      return c, (traj, stats)

    def rollout(c, _):
      c, (traj, stats) = jax.lax.scan(step, c, None, length=self.plan.rollout_length)     # [T, N, ...]
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

  def chunk(self, carry: Carry, inputs: ChunkInputs, books: EvalBooks, open_row: Dict[str, Any],
            may_stop: bool = False):
    """Up to `chunk_iterations` iterations (the item kind's `device_iteration`), as `inputs`
    schedules them, with the evaluations due among them; -> (carry, ChunkOutputs).

    Every iteration adds its stats to its metric row's sums, in iteration order from the row's
    first iteration: the open row's sums so far (`open_row`, from the chunk before) continue, so a
    row's values do not depend on where chunks begin and end. An evaluation after iteration i plays
    the greedy policy's episodes with the parameters of that moment (evaluation k of the run:
    `evaluation_key(seed, k)`'s episodes), keeps the parameters when their mean return is a new
    best and, with `may_stop` (static), ends the chunk when it reaches `books.stop_at`. The loop's
    trip count is an input, so one compiled chunk serves every chunk of a run, its last too."""
    iterate = self.kind.device_iteration(self)
    plan = self.plan
    params = self.learner.params(carry.learner_state)
    rows = {k: jnp.zeros((plan.row_slots + 1,), dtype).at[0].set(open_row[k])
            for k, dtype in self.stat_dtypes().items()}
    counted = {"calls": jnp.int32(0), "episodes": jnp.int32(0)}
    evals = EvalRecord(jnp.zeros((plan.eval_slots, self.exp.eval_episodes), jnp.float32),
                       jnp.zeros((plan.eval_slots,), jnp.float32),
                       {k: jnp.zeros((plan.eval_slots,), jnp.int32) for k in counted},
                       books.best, jnp.int32(-1), params)

    def evaluate(state):
      carry, evals, slot, counted = state
      params = self.learner.params(carry.learner_state)
      index = books.first_index + slot
      returns = self.evaluate(params, jax.random.fold_in(books.key, index))
      mean = jnp.mean(returns)
      best = jnp.logical_or(index == 0, mean > evals.best)  # EvalHistory.record's rule, on the same mean
      pick = lambda new, old: jnp.where(best, new, old)
      evals = EvalRecord(evals.returns.at[slot].set(returns), evals.means.at[slot].set(mean),
                         {k: evals.counts[k].at[slot].set(counted[k]) for k in counted}, pick(mean, evals.best),
                         pick(slot, evals.best_slot), jax.tree_util.tree_map(pick, params, evals.best_params))
      return evals, jnp.logical_and(may_stop, mean >= books.stop_at)

    def body(state):
      i, carry, rows, counted, evals, _ = state
      carry, stats = iterate(carry, inputs.calls_due[i])
      row = inputs.row[i]
      rows = {k: rows[k].at[row].add(stats[k]) for k in rows}
      counted = {k: counted[k] + stats[k] for k in counted}
      slot = inputs.eval_slot[i]
      evals, stop = jax.lax.cond(slot >= 0, evaluate, lambda state: (state[1], jnp.bool_(False)),
                                 (carry, evals, slot, counted))
      return i + 1, carry, rows, counted, evals, stop

    def cond(state):
      return jnp.logical_and(state[0] < inputs.iterations, jnp.logical_not(state[-1]))

    i, carry, rows, _, evals, _ = jax.lax.while_loop(
        cond, body, (jnp.int32(0), carry, rows, counted, evals, jnp.bool_(False)))
    return carry, ChunkOutputs(rows, evals.returns, evals.means, evals.counts, evals.best_slot, evals.best_params, i)

  def evaluate(self, params, key):
    return evaluate_episodes(self.env, self.eval_policy, params, key, self.exp.eval_episodes)


class EvalRecord(NamedTuple):
  """A chunk's evaluations so far (inside `DeviceLoop.chunk`)."""
  returns: Any       # [eval_slots, episodes]
  means: Any         # [eval_slots]
  counts: Any        # {calls, episodes}: [eval_slots] since the chunk began
  best: Any          # the best mean so far
  best_slot: Any     # the slot that scored it in this chunk (-1: an earlier chunk's)
  best_params: Any


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
