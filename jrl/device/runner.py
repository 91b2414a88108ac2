"""The device backend's runs: `run_device` compiles the loop (`jrl.device.loop`) and, between
its chunks, writes metrics, evaluates, saves policies and checkpoints, and prints progress.

Checkpoints hold the loop's whole carry and the host's counters (`HostState`), so that a
resumed run ends with the same bytes as one never stopped.
"""

import dataclasses
import math
import os
import time
from typing import Any, Dict, List, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from jrl import jit_cache
from jrl.device.loop import Carry, DeviceLoop, build_device_parts, evaluation_key, make_plan
from jrl.errors import ConfigError
from jrl.experiment import plots, report
from jrl.experiment.bookkeeping import EvalHistory
from jrl.experiment.checkpoint import Checkpointer, CheckpointSchedule, FailedWrites, checkpoint_to_resume
from jrl.experiment.config import ExperimentConfig
from jrl.experiment.files import REPORT_FILE, SUMMARY_FILE, prepare_run_dir, write_json
from jrl.experiment.logging import Progress, metric_log_positions, open_metric_logs
from jrl.experiment.snapshots import save_policy
from jrl.experiment.summary import make_summary
from jrl.gymnax_envs import GymnaxVecEnv, reward_threshold
from jrl.learners import sharding
from jrl.learners.learner import params_digest
from jrl.timing import BACKEND_COMPILE_EVENT, COMPILE, COMPILE_EVENTS, DEVICE_LOOP, EVAL, OTHER, NodeTimes

ROLES = ("actor", "learner", "evaluator")


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
  run_dir = prepare_run_dir(exp, agent_cfg)
  checkpointer = Checkpointer(run_dir, exp.keep_checkpoints)
  checkpointer.clean_partial()
  failed_writes = FailedWrites()

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
  # Given the learner state alone: the rest of the carry (env states) may hold weakly typed leaves that
  # the compiled chunk returns strongly typed (gymnax's Pendulum), and any change of type recompiles.
  params_of_state = jax.jit(loop.learner.params, out_shardings=loop.replicated)
  get_params = lambda c: params_of_state(c.learner_state)

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
  tb, loggers = open_metric_logs(run_dir, ROLES, positions if exp.resume else None)
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
      with failed_writes.attempt("policy snapshot 'best'"):
        save_policy(run_dir, "best", params, snapshot_info(**host.last_eval))
    host.eval_seconds += time.monotonic() - t0

  def save_checkpoint():
    with failed_writes.attempt("checkpoint"):
      _save_checkpoint()

  def _save_checkpoint():
    schedule.done(host.env_steps)  # a failed checkpoint is not retried at once
    state = host.state()
    state["wall_before"] = elapsed()
    run_state = {"carry": carry_to_host(carry), "host": state,
                 "positions": metric_log_positions(tb, loggers)}
    counters = {"actor_steps": host.env_steps, "learner_steps": host.learner_steps,
                "episodes": host.episodes_total, "evaluations": host.history.count}
    checkpointer.save(None, run_state, counters)
    save_policy(run_dir, "latest", jax.device_get(get_params(carry)), snapshot_info())

  def chunk_schedule() -> np.ndarray:
    """Learner calls due at each iteration of the next chunk, as the item kind schedules them
    (`ItemKind.device_call_schedule`: replayed rows as the host counts them; exact integers)."""
    return plan.kind.device_call_schedule(loop.spec, host.vector_steps, plan.chunk_iterations,
                                          plan.vector_steps_per_iteration, plan.num_envs, samples_per_call)

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
      host.vector_steps += plan.chunk_iterations * plan.vector_steps_per_iteration
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
    with failed_writes.attempt("policy snapshot 'final'"):
      save_policy(run_dir, "final", final_params, snapshot_info(**host.last_eval))
  finally:
    for logger in loggers.values():
      logger.close()
    tb.close()

  wall = elapsed()
  clock.active = False
  result, report_fields = write_run_report(run_dir, exp, host, wall, compile_seconds)
  summary = make_summary(
      exp=exp, kind="device", replay="device", actor_steps=host.env_steps, learner_steps=host.learner_steps,
      episodes=host.episodes_total, wall_seconds=wall, history=host.history.summary(),
      learner_devices=mesh.devices.size, learner_processes=1, resumed=saved is not None,
      checkpoints=[os.path.basename(p) for p in checkpointer.all()], params_digest=params_digest(final_params),
      failed_writes=failed_writes.lines, report_fields=report_fields,
      details={"num_envs": plan.num_envs, "chunk_steps": plan.chunk_steps,
               "compile_seconds": round(compile_seconds, 3), "jax_compile_seconds": round(clock.seconds, 3),
               "setup_seconds": round(setup_seconds, 3), "loop_seconds": round(host.loop_seconds, 3),
               "eval_seconds": round(host.eval_seconds, 3),
               "loop_compiles": clock.backend_compiles - compiles_before_loop, "compilation_cache": cache_dir})
  write_json(os.path.join(run_dir, SUMMARY_FILE), summary)
  plots.plot_learning_curve(run_dir, f"{exp.agent} on {exp.env}, seed {exp.seed} (device)", threshold)
  progress.maybe_print(f"report: {result.advice} ({os.path.join(run_dir, REPORT_FILE)})", force=True)
  progress.maybe_print(f"done: {host.env_steps} steps in {wall:.1f}s (compile {compile_seconds:.1f}s, "
                       f"{summary['rates']['env_steps_per_second']:.0f} env-steps/s) | eval {summary['eval_return']:.1f} "
                       f"(best {summary['best_eval_return']:.1f}) | steps to threshold "
                       f"{summary['steps_to_threshold']} | {run_dir}", force=True)
  failed_writes.check(run_dir)
  summary["run_dir"] = run_dir
  return summary


def write_run_report(run_dir: str, exp: ExperimentConfig, host: HostState, wall: float, compile_seconds: float):
  """RUN_DIR/report.md of a device run, as the other runs write theirs: the host's one thread spent
  its time in the compiled chunks, in evaluation, compiling (this session's programs) and on the
  rest (set-up, metrics, snapshots, checkpoints; a resumed run's earlier compiles). (verdict,
  summary.json fields)."""
  phases = {DEVICE_LOOP: host.loop_seconds, EVAL: host.eval_seconds, COMPILE: compile_seconds}
  phases[OTHER] = max(wall - sum(phases.values()), 0.0)
  loop_seconds = max(host.loop_seconds, 1e-9)
  rates = {"env_steps_per_second": host.env_steps / loop_seconds,
           "updates_per_second": host.learner_steps / loop_seconds}
  title = f"{exp.agent} on {exp.env}, seed {exp.seed}, on device: where the time went"
  return report.write_report(run_dir, [NodeTimes("main", "device", phases, wall)], rates, title,
                             file_name=REPORT_FILE)


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
