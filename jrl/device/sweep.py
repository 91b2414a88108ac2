"""Many seeds of one device run in one compiled program: the loop's carry gains a leading seed
axis and one `jax.vmap`ped chunk steps every seed at once (PureJaxRL's way of training many
agents together).

Each seed is a run of its own for everything the host does: its own run directory, config,
metrics, evaluations, policies, checkpoints, report and summary.json (the run core's, as
`run_device` writes them), so `launch.report` and the sweep report read it as any run. What the
seeds share is the program: one compilation, one call per chunk, and the learner-call schedule
(it depends on env steps only, which every seed takes in step).

  summaries = run_device_sweep(exp, agent_cfg, seeds=[0, 1, 2, 3], run_dirs=[...])
"""

import dataclasses
import os
import time
from typing import Any, Dict, List, Optional, Sequence

import jax
import jax.numpy as jnp

from jrl import jit_cache
from jrl.device.loop import DeviceLoop, evaluation_key
from jrl.device.runner import (CompileClock, SeedHost, calls_due_in_chunk, carry_from_host, compile_loop, device_setup,
                               write_run_report)
from jrl.errors import ConfigError
from jrl.experiment.config import ExperimentConfig
from jrl.experiment.run_core import RunCore
from jrl.gymnax_envs import GymnaxVecEnv


class SeedView(SeedHost):
  """Seed `index` of a vmapped sweep, as a run core's driver sees it."""

  def __init__(self, sweep: "VmappedSeeds", index: int, core: RunCore):
    self.sweep, self.index = sweep, index
    self._init_host(core, sweep.loop, sweep.plan, sweep.compiled.evaluate)

  @property
  def carry(self):
    return jax.tree_util.tree_map(lambda x: x[self.index], self.sweep.carry)

  def params(self):
    state = jax.tree_util.tree_map(lambda x: x[self.index], self.sweep.carry.learner_state)
    return self.sweep.compiled.params_of_state(state)

  def advance(self, core: RunCore) -> None:
    raise NotImplementedError("a sweep advances all its seeds at once (VmappedSeeds.advance)")


class VmappedSeeds:
  """The sweep's one carry (leading axis: seeds) and its compiled programs."""

  def __init__(self, exp: ExperimentConfig, agent_cfg, env: GymnaxVecEnv, parts, plan, mesh,
               cores: Sequence[RunCore]):
    self.plan = plan
    self.loop = loop = DeviceLoop(exp, agent_cfg, env, parts, mesh, plan)
    seeds = jnp.asarray([core.exp.seed for core in cores], jnp.int32)
    carry_shape = jax.eval_shape(jax.vmap(loop.init), seeds)
    if all(core.saved is None for core in cores):
      self.carry = jax.jit(jax.vmap(loop.init))(seeds)
    elif all(core.saved is not None for core in cores):
      one = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), carry_shape)
      carries = [carry_from_host(core.saved["carry"], one, jax.tree_util.tree_map(lambda _: loop.replicated, one),
                                 os.path.relpath(core.resume_info.path)) for core in cores]
      self.carry = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *carries)
    else:
      raise ConfigError("resume", "some seeds of the sweep have a checkpoint and some do not; resume all or none")
    self.compiled = compile_loop(loop, plan, carry_shape, None, seeds=len(cores))
    self.views = [SeedView(self, i, core) for i, core in enumerate(cores)]
    if len({(v.env_steps, v.vector_steps) for v in self.views}) != 1:
      raise ConfigError("resume", "the seeds' checkpoints are at different env steps; resume them one by one")
    self.views[0].params()  # compiled now
    jax.device_put(evaluation_key(0, 0), loop.replicated)

  @property
  def env_steps(self) -> int:
    return self.views[0].env_steps

  def advance(self, cores: Sequence[RunCore]) -> None:
    """One chunk for every seed; each seed's rows go to its own run core."""
    chunk_start = time.monotonic()
    due = calls_due_in_chunk(self.plan, self.loop, self.views[0].vector_steps)
    self.carry, ys = self.compiled.chunk(self.carry, jax.device_put(due, self.loop.replicated))
    ys = jax.device_get(ys)
    chunk_wall = time.monotonic() - chunk_start
    for i, (view, core) in enumerate(zip(self.views, cores)):
      view.account(core, {k: v[i] for k, v in ys.items()}, chunk_wall, core.elapsed() - chunk_wall)


def run_device_sweep(exp: ExperimentConfig, agent_cfg, seeds: Sequence[int], run_dirs: Sequence[str],
                     chunk_steps: Optional[int] = None) -> List[Dict[str, Any]]:
  """Trains `exp.agent` on the gymnax env `exp.env` for every seed of `seeds` at once, seed k into
  `run_dirs[k]`; returns their summaries. `exp.resume` (any value) continues each seed from its
  run directory's newest checkpoint. Evaluations, checkpoints and the threshold rule are each
  seed's own; the sweep ends when every seed has its budget (stop_at_threshold stops no seed
  early: they step together)."""
  start = time.monotonic()
  clock = CompileClock()
  cache_dir = jit_cache.enable_compilation_cache()
  if len(seeds) != len(run_dirs) or not seeds:
    raise ValueError("give one run directory per seed")
  if len(set(seeds)) != len(seeds):
    raise ConfigError("seeds", f"a seed appears twice in {list(seeds)}")
  env, parts, mesh, plan, threshold = device_setup(exp, agent_cfg, chunk_steps)
  cores = []
  for seed, run_dir in zip(seeds, run_dirs):
    resume = run_dir if exp.resume else ""
    cores.append(RunCore(dataclasses.replace(exp, seed=seed, run_dir=run_dir, resume=resume), agent_cfg, threshold))
    cores[-1].start_clock(at=start)
  sweep = VmappedSeeds(exp, agent_cfg, env, parts, plan, mesh, cores)
  for core, view in zip(cores, sweep.views):
    core.open(view.env_steps, f"{exp.agent} {exp.env} s{core.exp.seed}")
  setup_seconds = time.monotonic() - start
  try:
    while sweep.env_steps < exp.steps:
      sweep.advance(cores)
      for core, view in zip(cores, sweep.views):
        core.after_advance(view, may_stop=False)
    finals = [jax.device_get(core.conclude(view)) for core, view in zip(cores, sweep.views)]
  finally:
    for core, view in zip(cores, sweep.views):
      core.close(view)
  clock.active = False
  summaries = []
  for core, view, final_params in zip(cores, sweep.views, finals):
    wall = core.elapsed()
    # Each seed's report charges it the sweep's whole compile and loop (they are shared).
    view.compile_seconds = sweep.compiled.seconds
    result, report_fields = write_run_report(core.run_dir, core.exp, view, wall)
    details = {"num_envs": plan.num_envs, "chunk_steps": plan.chunk_steps, "vmapped_seeds": list(seeds),
               "compile_seconds": round(sweep.compiled.seconds, 3), "jax_compile_seconds": round(clock.seconds, 3),
               "setup_seconds": round(setup_seconds, 3), "loop_seconds": round(view.loop_seconds, 3),
               "eval_seconds": round(view.eval_seconds, 3), "compilation_cache": cache_dir}
    summaries.append(core.finish(
        view, final_params, wall, result, report_fields, kind="device", replay="device",
        learner_devices=mesh.devices.size, learner_processes=1, details=details,
        plot_title=f"{exp.agent} on {exp.env}, seed {core.exp.seed} (device, {len(seeds)} seeds vmapped)"))
  return summaries
