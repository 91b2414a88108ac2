"""The device backend's runs: `run_device` compiles the loop (`jrl.device.loop`) and, between
its chunks, writes metrics, evaluates, saves policies and checkpoints, and prints progress.

The run itself (evaluations, metric files, checkpoints, summary) is the run core's
(`jrl.experiment.run_core`); `DeviceDriver` is what differs: acting and learning happen on device.
Checkpoints hold the loop's whole carry and the host's counters, so that a resumed run ends
with the same bytes as one never stopped.
"""

import os
import time
from typing import Any, Dict, List, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from jrl import jit_cache
from jrl.device.loop import Carry, DeviceLoop, Plan, build_device_parts, evaluation_key, make_plan
from jrl.errors import ConfigError
from jrl.experiment import report
from jrl.experiment.config import ExperimentConfig
from jrl.experiment.files import REPORT_FILE
from jrl.experiment.run_core import RunCore
from jrl.gymnax_envs import GymnaxVecEnv, reward_threshold
from jrl.learners import distributed, sharding
from jrl.timing import BACKEND_COMPILE_EVENT, COMPILE, COMPILE_EVENTS, DEVICE_LOOP, EVAL, OTHER, NodeTimes


PROCESSES_DIR = "processes"  # the records of a multi-process run's other processes (`follower_dir`)


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
      if event == BACKEND_COMPILE_EVENT:
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


def carry_to_host(carry: Carry) -> List[np.ndarray]:
  """The carry's leaves as numpy arrays (whole arrays, gathered from every device; from every
  process when the mesh spans several, which makes this a collective)."""
  leaves = jax.tree_util.tree_leaves(carry)
  if jax.process_count() > 1:
    return [np.asarray(multihost_utils.process_allgather(x, tiled=True)) for x in leaves]
  return [np.asarray(x) for x in jax.device_get(leaves)]


def first_process_decides(decision: bool) -> bool:
  """The first process's `decision`, in every process of the run (a collective)."""
  if jax.process_count() == 1:
    return bool(decision)
  return bool(multihost_utils.broadcast_one_to_all(np.int32(decision)))


def process_record_dir(run_dir: str, process_id: int) -> str:
  """Where process `process_id` of a device run over several processes keeps its record: the run
  directory for the first, which writes the run; RUN_DIR/processes/p<k> for process k > 0."""
  return run_dir if process_id == 0 else os.path.join(run_dir, PROCESSES_DIR, f"p{process_id}")


def follower_dir(exp: ExperimentConfig) -> Optional[str]:
  """This process's own record folder when it is a follower (process k > 0); None for the first."""
  if exp.process_id == 0:
    return None
  return process_record_dir(os.path.abspath(exp.resume or exp.run_dir), exp.process_id)


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


class SeedHost:
  """The host side of one seed of the device loop: its counters, the metric sums of the row being
  cut, and its clocks; it cuts metric rows from a chunk's outputs, evaluates and checkpoints for
  the run core. A subclass says where the seed's carry is (`carry`)."""

  def _init_host(self, core: RunCore, loop: DeviceLoop, plan: Plan, compiled_eval) -> None:
    self.core, self.loop, self.plan, self.compiled_eval = core, loop, plan, compiled_eval
    self.env_steps = self.learner_steps = self.vector_steps = 0
    self.pending = {"return_sum": 0.0, "episodes": 0, "length_sum": 0, "calls": 0, **{k: 0.0 for k in loop.metric_keys}}
    self.loop_seconds = self.eval_seconds = 0.0
    self.row_mark = (0.0, 0, 0)  # where the last row was cut: loop seconds (chunks only), env steps, learner steps
    if core.saved is not None:
      host = core.restore_books(core.saved["host"])
      self.env_steps, self.learner_steps, self.vector_steps = host["env_steps"], host["learner_steps"], host["vector_steps"]
      self.pending, self.row_mark = host["pending"], tuple(host["row_mark"])
      self.loop_seconds, self.eval_seconds = host["loop_seconds"], host["eval_seconds"]

  carry: Carry

  def account(self, core: RunCore, ys: Dict[str, np.ndarray], chunk_wall: float, chunk_began: float) -> None:
    """Counts a chunk's iterations (`ys`: this seed's outputs, [iterations]) and cuts the rows due."""
    plan, loop = self.plan, self.loop
    self.loop_seconds += chunk_wall
    loop_began = self.loop_seconds - chunk_wall
    self.vector_steps += plan.chunk_iterations * plan.vector_steps_per_iteration
    for i in range(plan.chunk_iterations):
      self.env_steps += plan.iteration_steps
      for key in self.pending:
        self.pending[key] += ys[key][i].item()
      self.learner_steps += int(ys["calls"][i]) * loop.updates_per_call
      core.books.episodes_total += int(ys["episodes"][i])
      if core.log_due(self.env_steps):
        share = (i + 1) / plan.chunk_iterations  # iterations take equal shares of their chunk's time
        self._write_rows(core, loop_began + chunk_wall * share, chunk_began + chunk_wall * share)

  def _write_rows(self, core: RunCore, loop_seconds: float, wall: float) -> None:
    """The rows summed in `pending` since the last row. Rates are the row's own: its steps and
    updates over the loop's seconds since the last row (evaluations and checkpoints left out)."""
    pending = self.pending
    mark_seconds, mark_steps, mark_updates = self.row_mark
    seconds = max(loop_seconds - mark_seconds, 1e-9)
    self.row_mark = (loop_seconds, self.env_steps, self.learner_steps)
    count, calls = pending["episodes"], pending["calls"]
    core.write_rows(self.env_steps, self.learner_steps, pending["return_sum"] / count if count else None,
                    pending["length_sum"] / count if count else None, (self.env_steps - mark_steps) / seconds,
                    (self.learner_steps - mark_updates) / seconds,
                    {k: pending[k] / calls for k in self.loop.metric_keys} if calls else {}, wall)
    self.pending = {k: 0 * v for k, v in pending.items()}

  def evaluate(self, params):
    t0 = time.monotonic()
    index = self.core.books.history.count  # evaluation k plays the same episodes however often it is run
    key = jax.device_put(evaluation_key(self.core.evaluator_seed, index), self.loop.replicated)
    returns = np.asarray(self.compiled_eval(params, key))
    self.eval_seconds += time.monotonic() - t0
    return returns, index

  def checkpoint(self, books: Dict[str, Any]):
    host = {**books, "env_steps": self.env_steps, "learner_steps": self.learner_steps,
            "vector_steps": self.vector_steps, "pending": self.pending, "row_mark": self.row_mark,
            "loop_seconds": self.loop_seconds, "eval_seconds": self.eval_seconds}
    return None, {"carry": carry_to_host(self.carry), "host": host}, None

  def close(self) -> None:
    pass


class Compiled(NamedTuple):
  """The device loop's programs, compiled ahead of time."""
  chunk: Any            # (carry, calls due [iterations]) -> (carry, outputs)
  evaluate: Any         # (params, key) -> returns [eval_episodes]
  params_of_state: Any  # learner state -> params, replicated
  seconds: float


def compile_evaluation(loop: DeviceLoop, carry_shape: Carry):
  """The evaluation of `loop` (`loop.evaluate`), compiled for one run's parameters."""
  params_shape = jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=loop.replicated),
      jax.eval_shape(lambda c: loop.learner.params(c.learner_state), carry_shape))
  key_shape = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=loop.replicated)
  return jax.jit(loop.evaluate).lower(params_shape, key_shape).compile()


def compile_loop(loop: DeviceLoop, plan: Plan, carry_shape: Carry, shardings: Optional[Carry]) -> Compiled:
  """Compiles the chunk, the evaluation and the params getter of one run."""
  start = time.monotonic()
  chunk_fn = jax.jit(loop.chunk, in_shardings=(shardings, loop.replicated),
                     out_shardings=(shardings, loop.replicated), donate_argnums=0)
  calls_example = jax.ShapeDtypeStruct((plan.chunk_iterations,), jnp.int32)
  compiled_chunk = chunk_fn.lower(carry_shape, calls_example).compile()
  compiled_eval = compile_evaluation(loop, carry_shape)
  # Given the learner state alone: the rest of the carry (env states) may hold weakly typed leaves that
  # the compiled chunk returns strongly typed (gymnax's Pendulum), and any change of type recompiles.
  params_of_state = jax.jit(loop.learner.params, out_shardings=loop.replicated)
  return Compiled(compiled_chunk, compiled_eval, params_of_state, time.monotonic() - start)


class DeviceDriver(SeedHost):
  """The device loop's host side: each `advance` runs one compiled chunk (acting and learning for
  `plan.chunk_iterations` iterations on device) and cuts the chunk's metric rows."""

  def __init__(self, exp: ExperimentConfig, agent_cfg, env: GymnaxVecEnv, parts, plan: Plan, mesh, core: RunCore,
               clock: CompileClock):
    loop = DeviceLoop(exp, agent_cfg, env, parts, mesh, plan)
    carry_shape = jax.eval_shape(loop.init, exp.seed)
    shardings = loop.carry_shardings(carry_shape)
    if core.saved is None:
      self.carry = jax.jit(loop.init, static_argnums=0, out_shardings=shardings)(exp.seed)
    else:
      self.carry = carry_from_host(core.saved["carry"], carry_shape, shardings, os.path.relpath(core.resume_info.path))
    self.compiled = compile_loop(loop, plan, carry_shape, shardings)
    self.compile_seconds = self.compiled.seconds
    self._init_host(core, loop, plan, self.compiled.evaluate)
    self.params()  # compiled now: the loop itself compiles nothing
    jax.device_put(evaluation_key(core.evaluator_seed, 0), loop.replicated)
    self.compiles_before_loop = clock.backend_compiles

  def params(self):
    return self.compiled.params_of_state(self.carry.learner_state)

  def advance(self, core: RunCore) -> None:
    chunk_start = time.monotonic()
    due = calls_due_in_chunk(self.plan, self.loop, self.vector_steps)
    self.carry, ys = self.compiled.chunk(self.carry, jax.device_put(due, self.loop.replicated))
    ys = jax.device_get(ys)
    chunk_wall = time.monotonic() - chunk_start
    self.account(core, ys, chunk_wall, core.elapsed() - chunk_wall)


def calls_due_in_chunk(plan: Plan, loop: DeviceLoop, vector_steps: int) -> np.ndarray:
  """Learner calls due at each iteration of the next chunk, as the item kind schedules them
  (replayed rows as the host counts them; exact integers)."""
  return plan.kind.device_call_schedule(loop.spec, vector_steps, plan.chunk_iterations,
                                        plan.vector_steps_per_iteration, plan.num_envs,
                                        loop.updates_per_call * loop.batch_size)


class DeviceSetup(NamedTuple):
  env: GymnaxVecEnv
  parts: Any
  mesh: jax.sharding.Mesh
  plan: Plan
  threshold: Optional[float]


def device_setup(exp: ExperimentConfig, agent_cfg, chunk_steps: Optional[int]) -> DeviceSetup:
  """The env, agent parts, mesh, loop plan and success threshold of a device run (ConfigError for
  bad input, before anything is written)."""
  env = GymnaxVecEnv(exp.env)  # ConfigError for a gymnasium or unknown id
  parts = build_device_parts(exp.agent, env, agent_cfg)
  mesh = sharding.make_mesh(exp.learner_devices)
  sharding.check_batch_size(agent_cfg.batch_size, mesh)
  plan = make_plan(exp, parts, agent_cfg, int(mesh.devices.size), chunk_steps)
  threshold = exp.reward_threshold if exp.reward_threshold is not None else reward_threshold(exp.env)
  return DeviceSetup(env, parts, mesh, plan, threshold)


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
  # Several processes (one per host) run one loop over the devices of all (the mesh): each runs
  # the same programs on its part of the envs and the batch; the first writes the run.
  if exp.num_processes > 1 and not (exp.run_dir or exp.resume):
    raise ConfigError("run_dir", "a device run over several processes needs --run_dir: every process must "
                                 "name the same folder")
  distributed.initialize(exp.coordinator_address, exp.num_processes, exp.process_id)  # before any other JAX use
  clock = CompileClock()
  cache_dir = jit_cache.enable_compilation_cache()
  env, parts, mesh, plan, threshold = device_setup(exp, agent_cfg, chunk_steps)
  if exp.num_processes > 1 and exp.process_id > 0:  # the first process has prepared the run directory
    multihost_utils.sync_global_devices("jrl: run directory prepared")
  core = RunCore(exp, agent_cfg, threshold, follower_dir=follower_dir(exp), agree=first_process_decides)
  if exp.num_processes > 1 and exp.process_id == 0:
    multihost_utils.sync_global_devices("jrl: run directory prepared")
  core.start_clock(at=start)
  driver = DeviceDriver(exp, agent_cfg, env, parts, plan, mesh, core, clock)
  core.open(driver.env_steps, f"{exp.agent} {exp.env} s{exp.seed}" + (f" p{exp.process_id}" if exp.process_id else ""))
  setup_seconds = core.elapsed() - core.books.wall_before  # metrics' wall_seconds count from the run's start
  final_params = jax.device_get(core.drive(driver))
  wall = core.elapsed()
  clock.active = False
  result, report_fields = write_run_report(core.run_dir, exp, driver, wall)
  details = {"num_envs": driver.plan.num_envs, "chunk_steps": driver.plan.chunk_steps,
             "compile_seconds": round(driver.compile_seconds, 3), "jax_compile_seconds": round(clock.seconds, 3),
             "setup_seconds": round(setup_seconds, 3), "loop_seconds": round(driver.loop_seconds, 3),
             "eval_seconds": round(driver.eval_seconds, 3),
             "loop_compiles": clock.backend_compiles - driver.compiles_before_loop, "compilation_cache": cache_dir}
  sps = report_fields["rates"]["env_steps_per_second"]
  return core.finish(driver, final_params, wall, result, report_fields, kind="device", replay="device",
                     learner_devices=mesh.devices.size, learner_processes=exp.num_processes, details=details,
                     plot_title=f"{exp.agent} on {exp.env}, seed {exp.seed} (device)",
                     done_extra=f" (compile {driver.compile_seconds:.1f}s, {sps:.0f} env-steps/s)")


class SweepShare(NamedTuple):
  """What a run of a vmapped sweep shares with the sweep's other runs, for its report."""
  runs: int             # the runs in the one program
  eval_seconds: float   # all their evaluations, made one after another by the one host thread


def write_run_report(run_dir: str, exp: ExperimentConfig, driver: DeviceDriver, wall: float,
                     sweep: Optional[SweepShare] = None):
  """RUN_DIR/report.md of a device run, as the other runs write theirs: the host's one thread spent
  its time in the compiled chunks, in evaluation, compiling (this session's programs) and on the
  rest (set-up, metrics, snapshots, checkpoints; a resumed run's earlier compiles). (verdict,
  summary.json fields).

  A run of a vmapped sweep shares that thread with the sweep's other runs (`sweep`): each of their
  evaluations held up every run, so the report charges it all of them, the sweep's time as this
  run lived it."""
  eval_seconds = driver.eval_seconds if sweep is None else sweep.eval_seconds
  phases = {DEVICE_LOOP: driver.loop_seconds, EVAL: eval_seconds, COMPILE: driver.compile_seconds}
  phases[OTHER] = max(wall - sum(phases.values()), 0.0)
  loop_seconds = max(driver.loop_seconds, 1e-9)
  rates = {"env_steps_per_second": driver.env_steps / loop_seconds,
           "updates_per_second": driver.learner_steps / loop_seconds}
  title = f"{exp.agent} on {exp.env}, seed {exp.seed}, on device: where the time went"
  extras = None
  if sweep is not None:
    extras = {"vmapped sweep": f"{sweep.runs} runs in one program: the loop and compile are theirs together, "
                               f"eval is all runs' evaluations (this run's: {driver.eval_seconds:.1f} s)"}
  return report.write_report(run_dir, [NodeTimes("main", "device", phases, wall)], rates, title, extras,
                             file_name=REPORT_FILE)
