"""Many seeds of one device run in one compiled program: the loop's carry gains a leading run
axis and one `jax.vmap`ped chunk steps every run at once (PureJaxRL's way of training many
agents together). A grid of hyperparameters that change no array shape (learning rates,
discount, entropy cost...) rides along as traced values: each run has its own point, and the
agent's learner and policy are built inside the vmapped program from a config holding it.

Each seed is a run of its own for everything the host does: its own run directory, config,
metrics, evaluations, policies, checkpoints, report and summary.json (the run core's, as
`run_device` writes them), so `launch.report` and the sweep report read it as any run. What the
seeds share is the program: one compilation, one call per chunk, and the learner-call schedule
(it depends on env steps only, which every seed takes in step).

  summaries = run_device_sweep(exp, agent_cfg, seeds=[0, 1, 2, 3], run_dirs=[...])
  summaries = run_device_sweep(exp, agent_cfg, seeds=[0, 0, 1, 1], run_dirs=[...],
                               points=[{"learning_rate": 1e-3}, {"learning_rate": 3e-4}] * 2)
"""

import copy
import dataclasses
import itertools
import os
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jrl import jit_cache
from jrl.run.device.loop import DeviceLoop, EvalBooks, make_plan
from jrl.run.device.runner import (ChunkSizer, CompileClock, CompiledMeanwhile, SeedHost, SweepShare, account_chunk,
                                   carry_from_host, chunk_shapes, device_setup, fetch_outputs, write_run_report,
                                   writing)
from jrl.experiment.background import BackgroundWriter
from jrl.errors import ConfigError
from jrl.experiment.config import ExperimentConfig
from jrl.experiment.interrupt import Interrupts, RunInterrupted
from jrl.run.core import RunCore, draw_learning_curves
from jrl.experiment.sweep_report import point_label
from jrl.gymnax_envs import GymnaxVecEnv, load_gymnax
from jrl.learners import sharding


Point = Mapping[str, float]  # hyperparameters of one run: agent config field -> value


def grid_points(grid: Mapping[str, Sequence[float]]) -> List[Dict[str, float]]:
  """Every combination of the grid's values, in the order given ({} for no grid)."""
  fields = list(grid)
  return [dict(zip(fields, values)) for values in itertools.product(*(grid[f] for f in fields))]


def check_one_process(exp: ExperimentConfig) -> None:
  """ConfigError unless `exp` runs in one process: a vmapped sweep does (its seeds' runs, one by
  one, may span processes or hosts)."""
  if exp.num_processes > 1 or exp.launcher != "local":
    raise ConfigError("num_processes" if exp.num_processes > 1 else "launcher",
                      "a vmapped sweep runs in one process; run its seeds over several processes or hosts one "
                      "by one (--one_by_one)")


def check_grid(exp: ExperimentConfig, agent_cfg, grid: Mapping[str, Sequence[float]]) -> None:
  """ConfigError naming the first grid field the vmapped loop cannot take as a traced value: not a
  numeric field of the agent's config, one that changes the networks or the replay layout (array
  shapes, the learner-call schedule), or one the agent uses in Python control flow."""
  fields = {f.name for f in dataclasses.fields(agent_cfg)}
  for name, values in grid.items():
    if name not in fields:
      raise ConfigError("grid", f"'{name}' is not a field of the {exp.agent} config")
    if not isinstance(getattr(agent_cfg, name), (int, float)) or isinstance(getattr(agent_cfg, name), bool):
      raise ConfigError("grid", f"'{name}' is not a number; a grid takes numeric fields that change no array shape")
    if not values:
      raise ConfigError("grid", f"'{name}' has no values")
  if not grid:
    return
  env, parts, _, _, _ = device_setup(exp, agent_cfg, None)
  state_shapes = lambda cfg: jax.eval_shape(parts.agent.make_learner(parts.agent.make_networks(env.spec, cfg), cfg).init,
                                            jax.random.PRNGKey(0))
  base_shapes = state_shapes(agent_cfg)
  for point in grid_points(grid):
    other = dataclasses.replace(agent_cfg, **point)  # the config's own checks, on each value
    if parts.agent.make_replay_spec(other) != parts.replay_spec or state_shapes(other) != base_shapes:
      raise ConfigError("grid", f"{', '.join(point)}: a value changes the networks or the replay layout "
                                "(array shapes or the learner-call schedule); sweep it with one run per value")
  fields_in = sorted(grid)
  traced = lambda values: _with_traced(agent_cfg, fields_in, values)
  try:
    jax.eval_shape(lambda v: DeviceLoop(exp, traced(v), env, parts, sharding.make_mesh(exp.learner_devices),
                                        make_plan(exp, parts, agent_cfg, 1)).init(0),
                   jax.ShapeDtypeStruct((len(fields_in),), jnp.float32))
  except (jax.errors.ConcretizationTypeError, jax.errors.TracerBoolConversionError,
          jax.errors.TracerIntegerConversionError, TypeError) as e:
    raise ConfigError("grid", f"{', '.join(fields_in)}: the {exp.agent} agent uses a value in Python, not as an "
                              f"array ({type(e).__name__}); sweep it with one run per value") from None


def _with_traced(agent_cfg, fields: Sequence[str], values):
  """`agent_cfg` holding the traced grid values (int fields as int32, the rest float32). The
  config's own checks ran on every point's concrete values (`check_grid`, the run cores); they
  cannot run on tracers, so the fields are set without them."""
  cfg = copy.copy(agent_cfg)
  for i, f in enumerate(fields):
    object.__setattr__(cfg, f, values[i].astype(jnp.int32) if isinstance(getattr(agent_cfg, f), int) else values[i])
  return cfg


class SeedView(SeedHost):
  """Run `index` of a vmapped sweep, as a run core's driver sees it."""

  def __init__(self, sweep: "VmappedRuns", index: int, core: RunCore, point_loop: Callable[[], DeviceLoop]):
    self.sweep, self.index, self._point_loop = sweep, index, point_loop
    self._init_host(core, sweep.loop, sweep.plan)

  def params(self):
    return jax.tree_util.tree_map(lambda x: x[self.index], self.sweep.host_params())

  def carry_leaves(self) -> List[np.ndarray]:
    return [leaf[self.index] for leaf in self.sweep.host_carry()]

  def evaluation_loop(self) -> DeviceLoop:
    return self._point_loop()  # the run's own hyperparameters (a greedy policy may use them); built if needed

  def advance(self, core: RunCore) -> None:
    raise NotImplementedError("a sweep advances all its runs at once (VmappedRuns.advance)")


class VmappedRuns:
  """The sweep's one carry (leading axis: runs), each run's hyperparameter point, and the
  compiled chunk: every run's steps, learning and evaluations in one call."""

  def __init__(self, exp: ExperimentConfig, agent_cfg, env: GymnaxVecEnv, parts, plan, mesh,
               cores: Sequence[RunCore], points: Sequence[Point]):
    start = time.monotonic()
    self.plan = plan
    self.loop = loop = DeviceLoop(exp, agent_cfg, env, parts, mesh, plan)  # host-side shapes and schedule
    fields = sorted(points[0])
    # The loops at the runs' points have the host loop's metrics: each would otherwise trace the update for them.
    loop_at = lambda v: DeviceLoop(exp, _with_traced(agent_cfg, fields, v), env, parts, mesh, plan, loop.metric_keys)
    self.values = jnp.asarray([[point[f] for f in fields] for point in points], jnp.float32)  # [runs, fields]
    seeds = jnp.asarray([core.exp.seed for core in cores], jnp.int32)
    init = jax.vmap(lambda v, seed: loop_at(v).init(seed))
    carry_shape = jax.eval_shape(init, self.values, seeds)  # the init's trace (the jit below reuses it)
    one = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), carry_shape)
    fresh = all(core.saved is None for core in cores)
    if not fresh and not all(core.saved is not None for core in cores):
      raise ConfigError("resume", "some runs of the sweep have a checkpoint and some do not; resume all or none")
    self._host_carry: Optional[List[np.ndarray]] = None
    self._host_params: Optional[Any] = None
    point_loop = lambda point: lambda: DeviceLoop(exp, dataclasses.replace(agent_cfg, **point), env, parts, mesh, plan,
                                                  loop.metric_keys)
    self.views = [SeedView(self, i, core, point_loop(point)) for i, (core, point) in enumerate(zip(cores, points))]
    if len({(v.env_steps, v.vector_steps) for v in self.views}) != 1:
      raise ConfigError("resume", "the runs' checkpoints are at different env steps; resume them one by one")
    if not fresh:  # a saved carry that does not fit is a ConfigError before anything compiles
      carries = [carry_from_host(core.saved["carry"], one, jax.tree_util.tree_map(lambda _: loop.replicated, one),
                                 os.path.relpath(core.resume_info.path)) for core in cores]
      self.carry = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *carries)
    # Runs step together and do not stop at their thresholds: the loop's trip count is the sweep's.
    chunk = jax.vmap(lambda v, carry, inputs, books, open_row: loop_at(v).chunk(carry, inputs, books, open_row),
                     in_axes=(0, 0, None, 0, 0))
    shapes = chunk_shapes(plan, self.eval_books(), self.open_rows())
    lowered = jax.jit(chunk, donate_argnums=1).lower(self.values, carry_shape, *shapes)
    with CompiledMeanwhile(lowered.compile) as compiling:  # XLA compiles the chunk while the init compiles and runs
      if fresh:  # placed as the chunk returns it (and as a resumed carry is): one params program for both
        self.carry = jax.jit(init, out_shardings=loop.replicated)(self.values, seeds)
      self.chunk = compiling.result()
    self.sizer = ChunkSizer(plan, exp.steps)
    self.params_of_runs = jax.jit(jax.vmap(loop.learner.params), out_shardings=loop.replicated)
    self.host_params()  # compiled now
    self.compile_seconds = time.monotonic() - start
    # The next chunk's evaluation books and open rows, every run's (stacked), kept from the chunks'
    # outputs: the next chunk does not wait for the runs' books (`_behind`).
    self.next_books, self.next_open_rows = self.eval_books(), self.open_rows()
    self.host_syncs = 0  # chunks run: each a dispatch and one transfer of every run's outputs

  @property
  def env_steps(self) -> int:
    return self.views[0].env_steps

  def eval_books(self) -> EvalBooks:
    """Every run's evaluation books, stacked (leading axis: runs)."""
    books = [view.eval_books(view.core, may_stop=False) for view in self.views]
    return jax.tree_util.tree_map(lambda *xs: np.stack(xs), *books)

  def open_rows(self) -> Dict[str, np.ndarray]:
    """Every run's open metric row, stacked (leading axis: runs)."""
    rows = [view.open_row() for view in self.views]
    return {k: np.stack([row[k] for row in rows]) for k in rows[0]}

  def host_params(self) -> Any:
    """Every run's parameters on the host (leading axis: runs), fetched once per chunk."""
    if self._host_params is None:
      self._host_params = jax.device_get(self.params_of_runs(self.carry.learner_state))
    return self._host_params

  def host_carry(self) -> List[np.ndarray]:
    """The carry's leaves on the host, fetched once per chunk (each run's checkpoint takes its row)."""
    if self._host_carry is None:
      self._host_carry = [np.asarray(x) for x in jax.device_get(jax.tree_util.tree_leaves(self.carry))]
    return self._host_carry

  def advance(self, cores: Sequence[RunCore]) -> None:
    """One chunk for every run: one call, one transfer of its reduced outputs, and every run's
    books take it at once (`account_chunk`: array work over the runs, one write each)."""
    schedule = self.views[0].schedule(cores[0], self.sizer.next)  # every run's
    chunk_start = time.monotonic()
    put = lambda tree: jax.device_put(tree, self.loop.replicated)
    inputs = (put(schedule.inputs), put(self.next_books), put(self.next_open_rows))
    self._host_carry = self._host_params = None
    self.host_syncs += 1
    # The writer works from the dispatch on (the earlier chunks' rows): XLA's CPU client runs some
    # calls in this thread.
    with writing(cores[0].writer):
      self.carry, out = self.chunk(self.values, self.carry, *inputs)
      out, best_params = fetch_outputs(out)
    chunk_wall = time.monotonic() - chunk_start
    ran = int(out.iterations[0])
    if ran != schedule.iterations or np.any(out.iterations != ran):
      raise AssertionError(f"a sweep's chunk ran {out.iterations} iterations, scheduled {schedule.iterations}")
    self.sizer.ran(ran, chunk_wall)
    self.next_books = books_after(self.next_books, len(schedule.evals), out.eval_means)
    self.next_open_rows = {k: np.asarray(out.rows[k][:, len(schedule.rows)], dtype)
                           for k, dtype in self.loop.stat_dtypes().items()}
    account_chunk(self.views, cores, schedule, out, chunk_wall, [core.elapsed() - chunk_wall for core in cores],
                  best_params)
    marks = lambda core: (core.books.next_log, core.books.next_eval, core.schedule.next_steps)
    if any(marks(core) != marks(cores[0]) for core in cores[1:]):
      raise AssertionError("the sweep's runs scheduled different chunks; they step together")

  def check_books(self) -> None:
    """AssertionError unless the books kept from the chunks' outputs are the runs' own (caught up)."""
    books, rows = self.eval_books(), self.open_rows()
    same = lambda a, b: all(np.array_equal(x, y) for x, y in zip(jax.tree_util.tree_leaves(a),
                                                                    jax.tree_util.tree_leaves(b)))
    if not (same(books, self.next_books) and same(rows, self.next_open_rows)):
      raise AssertionError("the sweep's evaluation books or open rows differ from its runs'")


def books_after(books: EvalBooks, evaluations: int, means: np.ndarray) -> EvalBooks:
  """Every run's evaluation books after a chunk that made its first `evaluations` evaluations with
  these means ([runs, slots]): the count moves on, and the best is EvalHistory.record's rule (the
  first evaluation, or a mean above the best), as the chunk applies it."""
  best, first = np.array(books.best, np.float32), np.asarray(books.first_index)
  for k in range(evaluations):
    mean = means[:, k].astype(np.float32)
    best = np.where((first + k == 0) | (mean > best), mean, best)
  return books._replace(first_index=(first + evaluations).astype(np.int32), best=best.astype(np.float32))


class SweepProgress:
  """One progress line for all the sweep's runs (they step together), at most every
  `seconds`: steps, the sweep's env steps per second, and the runs' latest evaluations."""

  def __init__(self, prefix: str, steps: int, seconds: float):
    self.prefix, self.steps, self.seconds = prefix, steps, seconds
    self._last = 0.0  # the first chunk prints
    self._start_steps: Optional[int] = None
    self._start = time.monotonic()

  def maybe_print(self, sweep: "VmappedRuns", cores: Sequence[RunCore]) -> None:
    now = time.monotonic()
    if self._start_steps is None:
      self._start_steps, self._start = sweep.env_steps, now
    if self.seconds <= 0 or now - self._last < self.seconds:
      return
    self._last = now
    latest = [core.books.history.returns[-1] for core in cores if core.books.history.returns]
    evals = f"{min(latest):.1f} / {np.mean(latest):.1f} / {max(latest):.1f}" if latest else "-"
    rate = (sweep.env_steps - self._start_steps) * len(cores) / max(now - self._start, 1e-9)
    print(f"[{self.prefix}] steps {sweep.env_steps}/{self.steps} per run | {rate:.0f} env-steps/s, all runs | "
          f"eval min / mean / max {evals}", flush=True)


def interrupted_at(cores: Sequence[RunCore], views: Sequence[SeedView], signum: int) -> None:
  """Ctrl-C or SIGTERM between chunks: each run checkpoints (`RunCore.interrupted`) and the sweep
  raises RunInterrupted naming the first run's checkpoint (all are at the same env steps)."""
  first = None
  for core, view in zip(cores, views):
    try:
      core.interrupted(view, signum)
    except RunInterrupted as e:
      first = first or e
  raise first


def run_device_sweep(exp: ExperimentConfig, agent_cfg, seeds: Sequence[int], run_dirs: Sequence[str],
                     chunk_steps: Optional[int] = None, points: Optional[Sequence[Point]] = None) -> List[Dict[str, Any]]:
  """Trains `exp.agent` on the gymnax env `exp.env` as one program of runs: run k has seed
  `seeds[k]`, hyperparameters `points[k]` (agent config fields; all points name the same fields;
  `check_grid` first) and writes into `run_dirs[k]`. Returns their summaries. `exp.resume` (any
  value) continues each run from its run directory's newest checkpoint. Evaluations, checkpoints
  and the threshold rule are each run's own; the sweep ends when every run has its budget
  (stop_at_threshold stops no run early: they step together)."""
  load_gymnax()  # the backend's start-up, not the runs'
  start = time.monotonic()
  clock = CompileClock()
  cache_dir = jit_cache.enable_compilation_cache()
  points = [dict(p) for p in points] if points is not None else [{} for _ in seeds]
  if not (len(seeds) == len(run_dirs) == len(points)) or not seeds:
    raise ValueError("give one run directory and one point per seed")
  if len({(seed, tuple(sorted(p.items()))) for seed, p in zip(seeds, points)}) != len(seeds):
    raise ConfigError("seeds", "a (seed, grid point) appears twice")
  if len({tuple(sorted(p)) for p in points}) != 1:
    raise ValueError("every point must name the same fields")
  check_one_process(exp)
  env, parts, mesh, plan, threshold = device_setup(exp, agent_cfg, chunk_steps)
  cores, writer = [], BackgroundWriter()  # every run's rows, written while the chunks run
  for seed, run_dir, point in zip(seeds, run_dirs, points):
    resume = run_dir if exp.resume else ""
    cores.append(RunCore(dataclasses.replace(exp, seed=seed, run_dir=run_dir, resume=resume),
                         dataclasses.replace(agent_cfg, **point), threshold, writer=writer))
    cores[-1].start_clock(at=start)
  sweep = VmappedRuns(exp, agent_cfg, env, parts, plan, mesh, cores, points)
  compiles_before_loop = clock.backend_compiles
  for core, view, point in zip(cores, sweep.views, points):
    label = f" {point_label(point)}" if point else ""
    core.open(view.env_steps, f"{exp.agent} {exp.env} s{core.exp.seed}{label}")
    core.progress.periodic = False  # the sweep's one line below; each run still prints its closing lines
  progress = SweepProgress(f"{exp.agent} {exp.env} {len(seeds)} runs", exp.steps, exp.progress_seconds)
  setup_seconds = time.monotonic() - start
  try:
    with Interrupts() as interrupts:
      while sweep.env_steps < exp.steps:
        sweep.advance(cores)
        # The runs evaluate inside their chunks and do not stop at thresholds: between chunks a run
        # core has only checkpoints to do.
        if interrupts.signum is not None or any(core.schedule.due(sweep.env_steps) for core in cores):
          for core, view in zip(cores, sweep.views):
            core.after_advance(view, may_stop=False)
        progress.maybe_print(sweep, cores)
        if interrupts.signum is not None:  # every run checkpoints where they all stand, then the sweep stops
          interrupted_at(cores, sweep.views, interrupts.signum)
      sweep.check_books()
      finals = [jax.device_get(core.conclude(view)) for core, view in zip(cores, sweep.views)]
  finally:
    try:
      for core, view in zip(cores, sweep.views):
        core.close(view)
    finally:
      writer.close()
  clock.active = False
  summaries, curves = [], []  # the runs' learning curves, drawn together at the end
  shared = SweepShare(runs=len(seeds), eval_seconds=sum(view.eval_seconds for view in sweep.views))
  walls = [core.elapsed() for core in cores]  # the sweep's, as each run lived it (not the others' reports and plots)
  try:
    for core, view, final_params, point, wall in zip(cores, sweep.views, finals, points, walls):
      # Each run's report charges it the sweep's whole compile, loop and evaluations (they are shared).
      view.compile_seconds = max(sweep.compile_seconds, clock.seconds)  # JAX's own compile events, as run_device
      result, report_fields = write_run_report(core.run_dir, core.exp, view, wall, shared)
      details = {"num_envs": plan.num_envs, "chunk_steps": plan.chunk_steps, "vmapped_runs": len(seeds),
                 "grid_point": point, "compile_seconds": round(view.compile_seconds, 3),
                 "chunk_compile_seconds": round(sweep.compile_seconds, 3),
                 "jax_compile_seconds": round(clock.seconds, 3), "setup_seconds": round(setup_seconds, 3),
                 "loop_seconds": round(view.loop_seconds, 3), "eval_seconds": round(view.eval_seconds, 3),
                 "device_evaluations": view.device_evaluations,
                 "loop_compiles": clock.backend_compiles - compiles_before_loop,
                 "backend_compiles": clock.backend_compiles, "compilation_cache": cache_dir,
                 "compilation_cache_hits": clock.cache_hits, "host_syncs": sweep.host_syncs}
      label = point_label(point, ", ")
      summaries.append(core.finish(
          view, final_params, wall, result, report_fields, kind="device", replay="device",
          learner_devices=mesh.devices.size, learner_processes=1, details=details,
          plot_title=f"{exp.agent} on {exp.env}, seed {core.exp.seed}{' (' + label + ')' if label else ''} "
                     f"(device, {len(seeds)} runs vmapped)", curves=curves))
  finally:
    draw_learning_curves(curves)  # those of the runs whose summary was written
  return summaries
