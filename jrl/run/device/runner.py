"""The device backend's runs: `run_device` compiles the loop (`jrl.run.device.loop`) and, between
its chunks, writes metrics, evaluates, saves policies and checkpoints, and prints progress.

The run itself (evaluations, metric files, checkpoints, summary) is the run core's
(`jrl.run.core`); `DeviceDriver` is what differs: acting and learning happen on device.
Checkpoints hold the loop's whole carry and the host's counters, so that a resumed run ends
with the same bytes as one never stopped.
"""

import contextlib
import functools
import os
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from jrl import jit_cache
from jrl.run.device.loop import (CHUNK_SECONDS, FIRST_CHUNK_SHARE, Carry, ChunkInputs, ChunkOutputs, DeviceLoop,
                             EvalBooks, Plan, build_device_parts, evaluation_key, make_plan)
from jrl.errors import ConfigError
from jrl.experiment import report
from jrl.experiment.config import ExperimentConfig
from jrl.experiment.files import REPORT_FILE
from jrl.experiment.background import BackgroundWriter
from jrl.experiment.bookkeeping import evaluation_row
from jrl.run.core import (RunCore, actor_row, evaluation_info, evaluator_row, learner_row,
                           next_mark)
from jrl.gymnax_envs import GymnaxVecEnv, load_gymnax, reward_threshold
from jrl.learners import distributed, sharding
from jrl.timing import BACKEND_COMPILE_EVENT, COMPILE, COMPILE_EVENTS, DEVICE_LOOP, EVAL, OTHER, NodeTimes


PROCESSES_DIR = "processes"  # the records of a multi-process run's other processes (`follower_dir`)
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"  # JAX's event for a program loaded from its persistent cache


class CompileClock:
  """Wall seconds JAX spent tracing, lowering and compiling, from its monitoring events (the
  union of their intervals: nested jits report nested events); backend compiles counted."""

  def __init__(self):
    self._intervals: List[tuple] = []
    self.by_event: Dict[str, float] = {}  # summed per event (nested events overlap)
    self.backend_compiles = 0
    self.cache_hits = 0  # programs loaded from the persistent compilation cache instead of compiled
    self.active = True
    jax.monitoring.register_event_duration_secs_listener(self._listen)
    jax.monitoring.register_event_listener(self._count)

  def _count(self, event: str, **_) -> None:
    if self.active and event == CACHE_HIT_EVENT:
      self.cache_hits += 1

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
  return bool(first_process_value(int(decision)))


def first_process_value(value: int) -> int:
  """The first process's `value` (an int taken on a local clock: a chunk's length), in every
  process of the run (a collective; the value itself where the run is one process)."""
  if jax.process_count() == 1:
    return int(value)
  return int(multihost_utils.broadcast_one_to_all(np.int32(value)))


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


class ChunkSchedule(NamedTuple):
  """The host's plan of one chunk: where its metric rows and evaluations fall (iterations of the
  chunk after which they are due), and the chunk's inputs (numpy)."""
  iterations: int            # iterations it runs (unless the run reaches its threshold)
  rows: Tuple[int, ...]      # after these iterations a metric row is complete (the k-th: row k)
  evals: Tuple[int, ...]     # after these an evaluation is made (the k-th: slot k)
  events: Tuple[int, ...]    # rows and evaluations, sorted
  inputs: ChunkInputs


def mark_iterations(first_steps: int, iteration_steps: int, iterations: int, mark: int, every: int) -> List[int]:
  """The iterations (of `iterations`, after `first_steps` env steps) whose end first reaches each
  mark from `mark` on, the next mark after each as `next_mark` sets it: the host's rule for metric
  rows and evaluations, applied ahead (one entry per mark reached, not per iteration)."""
  found = []
  while True:
    i = max(-(-(mark - first_steps) // iteration_steps), 1) - 1
    if i >= iterations:
      return found
    found.append(i)
    mark = next_mark(first_steps + (i + 1) * iteration_steps, mark, every)


def schedule_chunk(plan: Plan, call_schedule: Callable[[int, int], np.ndarray], vector_steps: int, env_steps: int,
                   budget: int, next_log: int, log_every: int, next_eval: int, eval_every: int,
                   checkpoint_at: Optional[int], iterations: Optional[int] = None) -> ChunkSchedule:
  """The next chunk of a run at `env_steps`: `iterations` (at most `plan.chunk_iterations`, the
  default), ending at the first iteration that reaches the budget or `checkpoint_at` (a checkpoint
  due by env steps), with a row where `next_log` and every `log_every` after fall, an evaluation
  where `next_eval` and every `eval_every` after fall, and one at the run's last iteration.
  `call_schedule(vector_steps, iterations)`: the learner calls due at each iteration."""
  it = plan.iteration_steps
  n = min(iterations or plan.chunk_iterations, plan.chunk_iterations, max(1, -(-(budget - env_steps) // it)))
  if checkpoint_at is not None and checkpoint_at < budget:
    n = min(n, max(1, -(-(checkpoint_at - env_steps) // it)))
  rows = mark_iterations(env_steps, it, n, next_log, log_every)
  evals = mark_iterations(env_steps, it, n, next_eval, eval_every)
  if env_steps + n * it >= budget and (not evals or evals[-1] != n - 1):
    evals.append(n - 1)  # the run's final parameters
  if len(evals) > plan.eval_slots or len(rows) > plan.row_slots:
    raise AssertionError(f"chunk schedule: {len(evals)} evaluations, {len(rows)} rows exceed the plan {plan}")
  slots = np.full(plan.chunk_iterations, -1, np.int32)
  slots[evals] = np.arange(len(evals), dtype=np.int32)
  row = np.searchsorted(np.asarray(rows, np.int64), np.arange(plan.chunk_iterations), side="left")
  inputs = ChunkInputs(np.int32(n), call_schedule(vector_steps, plan.chunk_iterations).astype(np.int32),
                       row.astype(np.int32), slots)
  return ChunkSchedule(n, tuple(rows), tuple(evals), tuple(sorted(set(rows) | set(evals))), inputs)


class ChunkSizer:
  """How many iterations the next chunk runs: about CHUNK_SECONDS of wall at the rate of the chunk
  before (growing at most eightfold a chunk), the first FIRST_CHUNK_SHARE of the run; every chunk
  the plan's length where it is fixed (`chunk_steps`). Where chunks end changes no bytes."""

  def __init__(self, plan: Plan, steps: int):
    self.plan = plan
    first = int(steps * FIRST_CHUNK_SHARE) // plan.iteration_steps
    self.next = plan.chunk_iterations if plan.fixed else max(1, min(plan.chunk_iterations, first))

  def ran(self, iterations: int, seconds: float) -> None:
    if self.plan.fixed or iterations <= 0:
      return
    wanted = int(iterations / max(seconds, 1e-6) * CHUNK_SECONDS)
    self.next = max(1, min(self.plan.chunk_iterations, wanted, self.next * 8))


def float32_at_least(value: float) -> np.float32:
  """The smallest float32 >= `value`: `mean32 >= it` on device is `float(mean32) >= value` on the host."""
  low = np.float32(value)
  return low if float(low) >= value else np.nextafter(low, np.float32(np.inf))


class SeedHost:
  """The host side of one seed of the device loop: its counters, the metric sums of the row being
  cut, and its clocks; it writes a chunk's metric rows and records its evaluations (for the run
  core) from the chunk's outputs, and checkpoints. A subclass says where the seed's carry is
  (`carry_leaves`) and how to evaluate off the loop (`evaluate`)."""

  def _init_host(self, core: RunCore, loop: DeviceLoop, plan: Plan) -> None:
    self.core, self.loop, self.plan = core, loop, plan
    self.env_steps = self.learner_steps = self.vector_steps = 0
    self.pending = {k: np.zeros((), dtype).item() for k, dtype in loop.stat_dtypes().items()}  # the open row's sums
    self.loop_seconds = self.eval_seconds = 0.0
    self.device_evaluations = 0
    self.row_mark = (0.0, 0, 0)  # where the last row was cut: loop seconds (chunks only), env steps, learner steps
    self.evaluation_key = np.asarray(jax.random.PRNGKey(core.evaluator_seed))  # host data: every process puts it
    self._compiled_eval = None
    if core.saved is not None:
      host = core.restore_books(core.saved["host"])
      self.env_steps, self.learner_steps, self.vector_steps = host["env_steps"], host["learner_steps"], host["vector_steps"]
      self.pending, self.row_mark = host["pending"], tuple(host["row_mark"])
      self.loop_seconds, self.eval_seconds = host["loop_seconds"], host["eval_seconds"]

  def schedule(self, core: RunCore, iterations: int) -> ChunkSchedule:
    books, exp = core.books, core.exp
    return schedule_chunk(self.plan, lambda v, n: calls_due_in_chunk(self.plan, self.loop, v, n), self.vector_steps,
                          self.env_steps, exp.steps, books.next_log, exp.log_every, books.next_eval, exp.eval_every,
                          core.schedule.next_steps, iterations)

  def eval_books(self, core: RunCore, may_stop: bool) -> EvalBooks:
    history = core.books.history
    if not may_stop:
      stop_at = np.float32(np.inf)
    elif history.reached:  # reached before: the run ends at its next evaluation (as RunCore's rule)
      stop_at = np.float32(-np.inf)
    else:
      stop_at = float32_at_least(history.threshold) if history.threshold is not None else np.float32(np.inf)
    best = np.float32(max(history.returns)) if history.returns else np.float32(0.0)
    return EvalBooks(self.evaluation_key, np.int32(history.count), best, stop_at)

  def open_row(self) -> Dict[str, np.ndarray]:
    """The sums of the metric row in progress, as the chunk continues them (in its stats' types)."""
    return {k: np.asarray(self.pending[k], dtype) for k, dtype in self.loop.stat_dtypes().items()}

  def evaluate(self, params):
    """An evaluation off the loop (the run core's, where no chunk made it: a run resumed at its
    budget). Compiled on first use."""
    t0 = time.monotonic()
    index = self.core.books.history.count  # evaluation k plays the same episodes however often it is run
    if self._compiled_eval is None:
      self._compiled_eval = jax.jit(self.evaluation_loop().evaluate)
    key = jax.device_put(evaluation_key(self.core.evaluator_seed, index), self.loop.replicated)
    returns = np.asarray(self._compiled_eval(params, key))
    self.eval_seconds += time.monotonic() - t0
    return returns, index

  def evaluation_loop(self) -> DeviceLoop:
    return self.loop

  def carry_leaves(self) -> List[np.ndarray]:
    raise NotImplementedError

  def checkpoint(self, books: Dict[str, Any]):
    host = {**books, "env_steps": self.env_steps, "learner_steps": self.learner_steps,
            "vector_steps": self.vector_steps, "pending": self.pending, "row_mark": self.row_mark,
            "loop_seconds": self.loop_seconds, "eval_seconds": self.eval_seconds}
    return None, {"carry": self.carry_leaves(), "host": host}, None

  def close(self) -> None:
    pass


class RunsChunk(NamedTuple):
  """One run's share of a chunk its books took (`account_chunk`), for its writer: the rows it
  completed and the evaluations it made, as lists of plain numbers."""
  events: List[Tuple[bool, int]]   # (a row?, its index among the rows or evaluations), in the order they fell
  row_steps: List[int]             # env steps at each row (every run's)
  row_loop_seconds: List[float]    # the loop's seconds at each row, its rates' clock (every run's)
  row_walls: List[float]           # the run's wall seconds at each row
  row_learner_steps: List[int]
  row_episodes: List[int]          # episodes so far at each row
  row_sums: Dict[str, List[Any]]   # each row's sums of the loop's stats
  mark: Tuple[float, int, int]     # the row before the chunk's first: loop seconds, env steps, learner steps
  eval_steps: List[int]
  eval_learner_steps: List[int]
  eval_walls: List[float]
  eval_means: List[float]
  eval_returns: np.ndarray         # [evaluations, episodes]
  bests: List[bool]
  first_eval_index: int            # the run's count of evaluations before the chunk's first
  best_params: Any                 # the parameters of the evaluation `best_slot` (None: no new best to save)
  best_slot: int


def account_chunk(hosts: Sequence["SeedHost"], cores: Sequence[RunCore], schedule: ChunkSchedule,
                  out: ChunkOutputs, chunk_wall: float, began: Sequence[float],
                  best_params: Callable[[], Any]) -> None:
  """Every run's books take a chunk: `out` is its outputs on the host with a leading axis of runs
  (`hosts[k]` and `cores[k]` are run k's; one run is a sweep of one). The runs step together, so
  where the chunk's rows and evaluations fell, and the env steps there, are worked out once; the
  rows' numbers are sliced for all runs at once; each run's books then move to the chunk's end (a
  few scalars, and its evaluations' means into its history), and its rows and evaluations go to
  its writer as one write, formatted there in the order they fell. `began[k]`: run k's wall
  seconds when the chunk began. `best_params()`: every run's parameters of its chunk's best
  evaluation (fetched only when one of them is a new best to save)."""
  first, plan, upc = hosts[0], hosts[0].plan, hosts[0].loop.updates_per_call
  ran = int(out.iterations[0])
  rows = [i for i in schedule.rows if i < ran]
  evals = [i for i in schedule.evals if i < ran]
  n, m = len(rows), len(evals)
  events = sorted([(i, 0, k) for k, i in enumerate(rows)] + [(i, 1, k) for k, i in enumerate(evals)])
  first_steps = first.env_steps  # every run's
  steps_at = lambda i: first_steps + (i + 1) * plan.iteration_steps
  share = lambda i: (i + 1) / ran  # iterations take equal shares of their chunk's time
  row_steps, eval_steps = [steps_at(i) for i in rows], [steps_at(i) for i in evals]
  row_loop_seconds = [first.loop_seconds + chunk_wall * share(i) for i in rows]
  # Learner calls and episodes since the chunk began, to the end of each row (row 0 continued the
  # open row, whose counts the host had taken already): exact integers, [runs, rows + 1].
  since = {key: np.cumsum(out.rows[key][:, :n + 1].astype(np.int64), axis=1)
           - np.asarray([h.pending[key] for h in hosts], np.int64)[:, None] for key in ("calls", "episodes")}
  learner_before = np.asarray([h.learner_steps for h in hosts], np.int64)[:, None]
  episodes_before = np.asarray([c.books.episodes_total for c in cores], np.int64)[:, None]
  row_learner = (learner_before + since["calls"] * upc).tolist()
  row_episodes = (episodes_before + since["episodes"]).tolist()
  sums = {key: out.rows[key][:, :n + 1].tolist() for key in first.pending}
  eval_learner = (learner_before + out.eval_counts["calls"][:, :m].astype(np.int64) * upc).tolist()
  eval_means = out.eval_means[:, :m].tolist()
  best_slots = out.best_slot.tolist()
  fetched = []
  next_log = {}
  for r, (host, core) in enumerate(zip(hosts, cores)):
    first_eval_index = core.books.history.count
    bests = core.book_evaluations(eval_steps, eval_means[r], core.exp.eval_episodes)
    slot = best_slots[r]
    if 0 <= slot < m and not bests[slot]:
      raise AssertionError(f"evaluation {slot} of the chunk: best on device, not in the run's history")
    saves_best = 0 <= slot < m
    if saves_best and not fetched:
      fetched.append(best_params())
    walls = lambda marks: [began[r] + chunk_wall * share(i) for i in marks]
    chunk = RunsChunk([(kind == 0, k) for _, kind, k in events], row_steps, row_loop_seconds, walls(rows),
                      row_learner[r][:n], row_episodes[r][:n], {key: v[r][:n] for key, v in sums.items()},
                      host.row_mark, eval_steps, eval_learner[r], walls(evals), eval_means[r], out.eval_returns[r, :m],
                      bests, first_eval_index, _run(fetched[0], r) if saves_best else None, slot)
    if core.books.next_log not in next_log:  # every run's the same: its marks are its steps'
      mark = core.books.next_log
      for steps in row_steps:
        mark = next_mark(steps, mark, core.exp.log_every) if steps >= mark else mark
      next_log[core.books.next_log] = mark
    core.books.next_log = next_log[core.books.next_log]
    # The books at the chunk's end.
    host.env_steps = steps_at(ran - 1)
    host.vector_steps += ran * plan.vector_steps_per_iteration
    host.learner_steps = row_learner[r][n]
    core.books.episodes_total = row_episodes[r][n]
    host.loop_seconds += chunk_wall
    host.device_evaluations += m
    host.pending = {key: v[r][n] for key, v in sums.items()}
    if n:
      host.row_mark = (row_loop_seconds[-1], row_steps[-1], row_learner[r][n - 1])
    progress = None
    if n and core.progress.periodic:
      progress = _row_progress(core, chunk, n - 1, host.loop.metric_keys)
    core.submit(functools.partial(_write_chunk, core, chunk, host.loop.metric_keys, progress))


def _run(tree, i: int):
  """Run i's part of a tree with a leading axis of runs."""
  return jax.tree_util.tree_map(lambda x: x[i], tree)


def _row_values(chunk: RunsChunk, k: int, metric_keys: Sequence[str]):
  """Row k's numbers as `RunCore.write_rows` takes them: its episodes' mean return and length, its
  env steps and updates per second of the loop's time since the row before, its learner metrics
  (means over its learner calls)."""
  before = chunk.mark if k == 0 else (chunk.row_loop_seconds[k - 1], chunk.row_steps[k - 1],
                                      chunk.row_learner_steps[k - 1])
  seconds = max(chunk.row_loop_seconds[k] - before[0], 1e-9)
  sums = {key: v[k] for key, v in chunk.row_sums.items()}
  count, calls = sums["episodes"], sums["calls"]
  return (sums["return_sum"] / count if count else None, sums["length_sum"] / count if count else None,
          (chunk.row_steps[k] - before[1]) / seconds, (chunk.row_learner_steps[k] - before[2]) / seconds,
          {key: sums[key] / calls for key in metric_keys} if calls else {})


def _row_progress(core: RunCore, chunk: RunsChunk, k: int, metric_keys: Sequence[str]) -> str:
  episode_return, _, steps_per_second, updates_per_second, _ = _row_values(chunk, k, metric_keys)
  return core.row_progress_text(chunk.row_steps[k], chunk.row_learner_steps[k], episode_return, steps_per_second,
                                updates_per_second)


def _write_chunk(core: RunCore, chunk: RunsChunk, metric_keys: Sequence[str], progress: Optional[str]) -> None:
  """A run's rows and evaluations of one chunk into its files (on its writer's thread), in the
  order they fell; the new best's policy; the progress line of its last row."""
  for is_row, k in chunk.events:
    if is_row:
      episode_return, episode_length, steps_per_second, updates_per_second, metrics = _row_values(chunk, k, metric_keys)
      wall = chunk.row_walls[k]
      core.loggers["actor"].write(actor_row(chunk.row_steps[k], chunk.row_episodes[k], episode_return,
                                            episode_length, steps_per_second, wall))
      learner = learner_row(chunk.row_steps[k], chunk.row_learner_steps[k], metrics, updates_per_second, wall)
      if learner is not None:
        core.loggers["learner"].write(learner)
      continue
    row = evaluation_row(chunk.eval_means[k], chunk.eval_returns[k], chunk.bests[k])
    core.loggers["evaluator"].write(evaluator_row(chunk.eval_steps[k], chunk.eval_learner_steps[k], row,
                                                  chunk.eval_walls[k]))
    if k == chunk.best_slot and chunk.best_params is not None:
      info = evaluation_info(row, chunk.first_eval_index + k, core.evaluator_seed, core.exp.eval_episodes)
      core.snapshot_at("best", chunk.best_params, chunk.eval_steps[k], chunk.eval_learner_steps[k], **info)
  if progress is not None:
    core.progress.maybe_print(progress)


def writing(writer: Optional[BackgroundWriter]):
  """Lets the run's background writer work while the host thread waits on its device."""
  return writer.working() if writer is not None else contextlib.nullcontext()


def fetch_outputs(out: ChunkOutputs) -> Tuple[ChunkOutputs, Callable[[], Any]]:
  """A chunk's outputs on the host in one transfer, but its best parameters, which are fetched
  (once) only when asked for."""
  host = jax.device_get(out._replace(best_params=None))
  fetched = []

  def best_params():
    if not fetched:
      fetched.append(jax.device_get(out.best_params))
    return fetched[0]
  return host, best_params


def chunk_shapes(plan: Plan, eval_books: EvalBooks, open_row: Dict[str, Any]) -> Tuple[ChunkInputs, EvalBooks, Dict]:
  """Shapes of a chunk's inputs, and of `eval_books` and `open_row` (arrays: a run's, or stacked runs')."""
  vector = lambda dtype: jax.ShapeDtypeStruct((plan.chunk_iterations,), dtype)
  inputs = ChunkInputs(jax.ShapeDtypeStruct((), jnp.int32), vector(jnp.int32), vector(jnp.int32), vector(jnp.int32))
  shape = lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype)
  return inputs, jax.tree_util.tree_map(shape, eval_books), jax.tree_util.tree_map(shape, open_row)


class CompiledMeanwhile:
  """A lowered program compiled by XLA on a thread of its own while the host thread goes on: XLA
  compiles without holding the GIL, so the chunk compiles while the loop's init compiles and
  runs, and a run's set-up takes about the longer of the two compiles rather than their sum (on
  a host with a core to spare). `result()` waits for the program and returns it, or raises the
  error its compile raised. Used as a context, it is waited for however the block ends: no
  compile outlives the set-up that started it."""

  def __init__(self, compile_program: Callable[[], Any]):
    self._program: Any = None
    self._error: Optional[BaseException] = None
    self._thread = threading.Thread(target=self._compile, args=(compile_program,), name="jrl-compile", daemon=True)
    self._thread.start()

  def _compile(self, compile_program: Callable[[], Any]) -> None:
    try:
      self._program = compile_program()
    except BaseException as e:  # noqa: BLE001 - raised in the host thread, by result()
      self._error = e

  def result(self) -> Any:
    self._thread.join()
    if self._error is not None:
      raise self._error
    return self._program

  def __enter__(self) -> "CompiledMeanwhile":
    return self

  def __exit__(self, *exc) -> None:
    self._thread.join()


class Compiled(NamedTuple):
  """The device loop's programs, compiled ahead of time."""
  chunk: Any            # (carry, ChunkInputs, EvalBooks, open row) -> (carry, ChunkOutputs)
  params_of_state: Any  # learner state -> params, replicated
  seconds: float        # from the chunk's trace to its compiled program (the init compiled and ran meanwhile)


def lower_chunk(loop: DeviceLoop, plan: Plan, carry_shape: Carry, shardings: Optional[Carry], books: EvalBooks,
                open_row: Dict[str, Any], may_stop: bool) -> jax.stages.Lowered:
  """The chunk of one run (its evaluations in it), traced and lowered for XLA to compile."""
  chunk_fn = jax.jit(functools.partial(loop.chunk, may_stop=may_stop),
                     in_shardings=(shardings, loop.replicated, loop.replicated, loop.replicated),
                     out_shardings=(shardings, loop.replicated), donate_argnums=0)
  return chunk_fn.lower(carry_shape, *chunk_shapes(plan, books, open_row))


class DeviceDriver(SeedHost):
  """The device loop's host side: each `advance` runs one compiled chunk (acting, learning and
  evaluating for up to `plan.chunk_iterations` iterations on device), then writes its rows and
  records its evaluations."""

  def __init__(self, exp: ExperimentConfig, agent_cfg, env: GymnaxVecEnv, parts, plan: Plan, mesh, core: RunCore,
               clock: CompileClock):
    loop = DeviceLoop(exp, agent_cfg, env, parts, mesh, plan)
    init = loop.init  # one function object: the jit below reuses this trace
    carry_shape = jax.jit(init, static_argnums=0).eval_shape(exp.seed)
    shardings = loop.carry_shardings(carry_shape)
    self._init_host(core, loop, plan)
    self.may_stop = exp.stop_at_threshold
    if core.saved is not None:  # a saved carry that does not fit is a ConfigError before anything compiles
      self.carry = carry_from_host(core.saved["carry"], carry_shape, shardings, os.path.relpath(core.resume_info.path))
    start = time.monotonic()
    lowered = lower_chunk(loop, plan, carry_shape, shardings, self.eval_books(core, self.may_stop), self.open_row(),
                          self.may_stop)
    with CompiledMeanwhile(lowered.compile) as compiling:
      if core.saved is None:
        self.carry = jax.jit(init, static_argnums=0, out_shardings=shardings)(exp.seed)
      chunk = compiling.result()
    # Given the learner state alone: the rest of the carry (env states) may hold weakly typed leaves that
    # the compiled chunk returns strongly typed (gymnax's Pendulum), and any change of type recompiles.
    params_of_state = jax.jit(loop.learner.params, out_shardings=loop.replicated)
    self.compiled = Compiled(chunk, params_of_state, time.monotonic() - start)
    self.sizer = ChunkSizer(plan, exp.steps)
    self.compile_seconds = self.compiled.seconds
    self.params()  # compiled now: the loop itself compiles nothing
    self.compiles_before_loop = clock.backend_compiles

  def params(self):
    return self.compiled.params_of_state(self.carry.learner_state)

  def carry_leaves(self) -> List[np.ndarray]:
    return carry_to_host(self.carry)

  def advance(self, core: RunCore) -> None:
    # Every process of a run runs the same chunk: its length is the first process's (sized on its clock).
    schedule = self.schedule(core, first_process_value(self.sizer.next))
    chunk_start = time.monotonic()
    put = lambda tree: jax.device_put(tree, self.loop.replicated)
    inputs = (put(schedule.inputs), put(self.eval_books(core, self.may_stop)), put(self.open_row()))
    with writing(core.writer):  # the earlier chunks' rows, while this one runs
      self.carry, out = self.compiled.chunk(self.carry, *inputs)
      out, best_params = fetch_outputs(out)
    chunk_wall = time.monotonic() - chunk_start
    self.sizer.ran(int(out.iterations), chunk_wall)
    one = lambda tree: jax.tree_util.tree_map(lambda x: np.asarray(x)[None], tree)  # a sweep of one run
    account_chunk([self], [core], schedule, one(out), chunk_wall, [core.elapsed() - chunk_wall],
                  lambda: one(best_params()))


def calls_due_in_chunk(plan: Plan, loop: DeviceLoop, vector_steps: int, iterations: Optional[int] = None) -> np.ndarray:
  """Learner calls due at each of the next `iterations` (a chunk's, by default) after
  `vector_steps`, as the item kind schedules them (replayed rows as the host counts them; exact
  integers)."""
  return plan.kind.device_call_schedule(loop.spec, vector_steps, iterations or plan.chunk_iterations,
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
  # Several processes (one per host) run one loop over the devices of all (the mesh): each runs
  # the same programs on its part of the envs and the batch; the first writes the run.
  if exp.num_processes > 1 and not (exp.run_dir or exp.resume):
    raise ConfigError("run_dir", "a device run over several processes needs --run_dir: every process must "
                                 "name the same folder")
  distributed.initialize(exp.coordinator_address, exp.num_processes, exp.process_id)  # before any other JAX use
  load_gymnax()  # the backend's start-up (it starts JAX's backend: after the line above), not the run's
  start = time.monotonic()
  clock = CompileClock()
  cache_dir = jit_cache.enable_compilation_cache()
  env, parts, mesh, plan, threshold = device_setup(exp, agent_cfg, chunk_steps)
  if exp.num_processes > 1 and exp.process_id > 0:  # the first process has prepared the run directory
    multihost_utils.sync_global_devices("jrl: run directory prepared")
  writer = BackgroundWriter()  # the run's rows are written while its chunks run
  core = RunCore(exp, agent_cfg, threshold, follower_dir=follower_dir(exp), agree=first_process_decides,
                 writer=writer)
  if exp.num_processes > 1 and exp.process_id == 0:
    multihost_utils.sync_global_devices("jrl: run directory prepared")
  core.start_clock(at=start)
  driver = DeviceDriver(exp, agent_cfg, env, parts, plan, mesh, core, clock)
  core.open(driver.env_steps, f"{exp.agent} {exp.env} s{exp.seed}" + (f" p{exp.process_id}" if exp.process_id else ""))
  setup_seconds = core.elapsed() - core.books.wall_before  # metrics' wall_seconds count from the run's start
  try:
    final_params = jax.device_get(core.drive(driver))
  finally:
    writer.close()
  wall = core.elapsed()
  clock.active = False
  chunk_compile_seconds = driver.compile_seconds
  # The report's compile phase: every second JAX spent tracing, lowering and compiling (its own
  # events: the chunk's, and the set-up's shape checks and small programs), not the chunk's alone.
  driver.compile_seconds = max(driver.compile_seconds, clock.seconds)
  devices = {"loop": [report.device_name(d) for d in mesh.devices.flat]}  # acting, learning and evaluating
  result, report_fields = write_run_report(core.run_dir, exp, driver, wall, devices=devices)
  details = {"devices": devices, "num_envs": driver.plan.num_envs, "chunk_steps": driver.plan.chunk_steps,
             "compile_seconds": round(driver.compile_seconds, 3), "jax_compile_seconds": round(clock.seconds, 3),
             "chunk_compile_seconds": round(chunk_compile_seconds, 3),
             "setup_seconds": round(setup_seconds, 3), "loop_seconds": round(driver.loop_seconds, 3),
             "eval_seconds": round(driver.eval_seconds, 3), "device_evaluations": driver.device_evaluations,
             "loop_compiles": clock.backend_compiles - driver.compiles_before_loop,
             "backend_compiles": clock.backend_compiles, "compilation_cache": cache_dir,
             "compilation_cache_hits": clock.cache_hits}
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
                     sweep: Optional[SweepShare] = None, devices: Optional[Mapping[str, Sequence[str]]] = None):
  """RUN_DIR/report.md of a device run, as the other runs write theirs: the host's one thread spent
  its time in the compiled chunks (acting, learning and the evaluations they make), in evaluation
  off the loop (rare: a run resumed at its budget), compiling (this session's programs) and on the
  rest (set-up, metrics, snapshots, checkpoints; a resumed run's earlier compiles). (verdict,
  summary.json fields).

  A run of a vmapped sweep shares that thread with the sweep's other runs (`sweep`): the report
  charges it all their evaluations off the loop, the sweep's time as this run lived it. `devices`
  (role -> device names, its summary's details["devices"]) is the report's devices line."""
  eval_seconds = driver.eval_seconds if sweep is None else sweep.eval_seconds
  phases = {DEVICE_LOOP: driver.loop_seconds, EVAL: eval_seconds, COMPILE: driver.compile_seconds}
  phases[OTHER] = max(wall - sum(phases.values()), 0.0)
  loop_seconds = max(driver.loop_seconds, 1e-9)
  rates = {"env_steps_per_second": driver.env_steps / loop_seconds,
           "updates_per_second": driver.learner_steps / loop_seconds}
  title = f"{exp.agent} on {exp.env}, seed {exp.seed}, on device: where the time went"
  extras = {report.DEVICES: report.devices_text(devices)} if devices else {}
  extras["evaluations"] = (f"{driver.device_evaluations} of this session's evaluations ran inside the compiled "
                           f"loop ({DEVICE_LOOP}); {EVAL} is the host's own")
  if sweep is not None:
    extras["vmapped sweep"] = (f"{sweep.runs} runs in one program: the loop and compile are theirs together, "
                               f"eval is all runs' evaluations off the loop (this run's: {driver.eval_seconds:.1f} s)")
  return report.write_report(run_dir, [NodeTimes("main", "device", phases, wall)], rates, title, extras,
                             file_name=REPORT_FILE)
