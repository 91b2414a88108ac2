"""The program's learner node: samples replay, updates, serves its parameters (the variable source)
and writes the run's checkpoints where its state lives."""

import dataclasses
import os
import signal
import threading
import time
from typing import Any, Dict, Optional, Tuple

import jax

from jrl import seeding
from jrl.errors import Stopped
from jrl.experiment import report
from jrl.experiment.builder import build_agent_parts, replay_batches
from jrl.experiment.checkpoint import Checkpointer
from jrl.experiment.config import ExperimentConfig
from jrl.learners import distributed, sharding
from jrl.learners.learner import Learner, params_digest
from jrl.run.core import save_checkpoint
from jrl.run.distributed import faults
from jrl.run.distributed.node_io import LOG_SECONDS, Session, TimesFile, exit_soon_after_stop, host_name, log, \
    metrics_logger
from jrl.run.distributed.rpc import wait_unless_stopped

# The learner logs the digest of its parameters every this many calls: the processes
# of a multi-process learner must show the same digest at the same version.
DIGEST_EVERY = 50


class LearnerNode:
  """Samples replay, updates, serves `get_variables()` -> (params as numpy, version).

  A learner of P processes (`exp.num_processes`) is P of these nodes joined by
  `jax.distributed`: each samples its share of the batch, they update in
  lockstep, and process 0 serves parameters, counts learner steps and writes
  the run's checkpoints when the driver node asks (on the run core's schedule, and at the end)
  or the launcher does (a stop from outside).
  """

  def __init__(self, exp: ExperimentConfig, agent_cfg, replay, counter, session: Session, process_id: int = 0, *,
               engine):
    self._exp, self._cfg, self._session, self._process = exp, agent_cfg, session, process_id
    self._engine = engine
    self._replay, self._counter = engine.replay(replay), engine.handle(counter)
    self._ready = threading.Event()
    self._served = (-1, None)
    self._checkpoint_lock = threading.Lock()
    self._publish_lock = threading.Lock()
    self._publish = [0.0, 0]  # seconds and copies spent handing out new parameters (RPC threads)
    self._faults = faults.from_environment()
    self._count_lock = threading.Lock()
    self._counted = 0  # the learner steps the counter has (process 0 counts them)
    self._stop: Optional[threading.Event] = None  # the engine's, from the node's own thread (run)

  def _count_steps(self, steps: int) -> Dict[str, float]:
    """Brings the counter's learner steps to `steps`; the counts."""
    with self._count_lock:
      counts = wait_unless_stopped(self._counter.future("increment", learner_steps=steps - self._counted), self._stop)
      self._counted = steps
    return counts

  def version(self) -> int:
    self._ready.wait()
    return self._learner.version

  def mesh_size(self) -> int:
    """The devices of the learner's mesh, for the run's summary: the evaluator, confined to the CPU
    on a GPU host (jrl.accelerators), cannot count them itself."""
    self._ready.wait()
    return self._mesh_size

  def get_variables(self):
    self._ready.wait()
    version = self._learner.version
    if self._served[0] != version:
      start = time.perf_counter()
      params, version = self._learner.get_variables()
      self._served = (version, jax.device_get(params))
      with self._publish_lock:
        self._publish[0] += time.perf_counter() - start
        self._publish[1] += 1
    return self._served[1], self._served[0]

  def checkpoint(self) -> Tuple[str, Optional[str]]:
    """Writes a checkpoint now (learner state, the counter's bookkeeping, replay) and the 'latest'
    policy of its parameters: `run_core.save_checkpoint`'s (path, failed-write line of the policy
    or None)."""
    self._ready.wait()
    with self._checkpoint_lock:
      state, steps, version = self._learner.snapshot()
      # The counter learns the learner's steps once a second; a checkpoint (the final one too,
      # before the summary is written) brings it up to date, and keeps the steps it saves.
      self._count_steps(self._learner.steps)
      bookkeeping = wait_unless_stopped(self._counter.future("snapshot"), self._stop)
      counts = bookkeeping["counts"]
      counts["learner_steps"] = float(steps)
      run_state = {"counter": bookkeeping, "learner_steps": steps, "learner_version": version,
                   "sessions": self._session.number}
      counters = {"actor_steps": counts.get("actor_steps", 0.0), "learner_steps": steps, "learner_version": version,
                  "episodes": counts.get("episodes", 0.0)}
      path, failed_policy = save_checkpoint(self._checkpointer, self._session.run_dir, state, run_state, counters,
                                            self._replay.checkpoint, self._fns.params(state))
      log(f"checkpoint {os.path.basename(path)}: {counts.get('actor_steps', 0):.0f} env steps, {steps} updates")
      return path, failed_policy

  def run(self):
    self._stop = stop = self._engine.stop_event()
    exit_soon_after_stop(stop)
    exp, cfg, processes = self._exp, self._cfg, self._exp.num_processes
    main = threading.current_thread() is threading.main_thread()  # Ray runs a node in a thread of its pool
    handler = signal.getsignal(signal.SIGTERM) if main else None
    distributed.initialize(exp.coordinator_address, processes, self._process)  # before any other JAX use
    if main:
      signal.signal(signal.SIGTERM, handler)  # JAX's preemption notifier took SIGTERM from Launchpad's stop
    parts = build_agent_parts(exp.agent, exp.env, cfg)
    mesh = sharding.make_mesh(exp.learner_devices)
    self._mesh_size = int(mesh.devices.size)
    sharding.check_batch_size(cfg.batch_size, mesh)
    spec = parts.replay_spec
    # One timer per thread: the learner's own (sample wait, update, checkpoints) and its batch prefetch.
    self._timer, prefetch_timer = report.PhaseTimer(), report.PhaseTimer()
    batches = replay_batches(self._replay, parts, cfg, dataclasses.replace(exp, process_id=self._process),
                             cfg.batch_size // processes, mesh, stop=stop, timer=prefetch_timer)
    updater = self._replay.update_priorities if spec.prioritized else None
    self._fns = parts.agent.make_learner(parts.networks, cfg)
    self._learner = Learner(self._fns, seeding.node_key(exp.seed, "learner"), batches, updater, mesh=mesh,
                            timer=self._timer)
    log(f"learner process {self._process}/{processes} on {host_name()}: initial params_digest "
        f"{params_digest(self._learner.get_variables()[0])}")
    self._checkpointer = Checkpointer(self._session.run_dir, exp.keep_checkpoints)
    if self._session.checkpoint is not None:
      info = self._checkpointer.verify(self._session.checkpoint)
      saved = Checkpointer.read_run_state(info)
      self._learner.restore(Checkpointer.restore_learner(info, self._learner.state), saved["learner_steps"],
                            saved["learner_version"])
      log(f"restored {os.path.basename(info.path)}: version {saved['learner_version']}")
    self._counted = self._learner.steps
    self._ready.set()
    role = "learner" if processes == 1 else f"learner{self._process}"
    logger = metrics_logger(self._session, role, step_key="learner_steps")
    name = f"learner/{self._process}"

    def books() -> Dict[str, Any]:
      times = [self._timer.node(name, "learner"), prefetch_timer.node(f"{name} prefetch", "sampler", helper=True)]
      if self._process == 0:  # parameters handed to actors, servers and the evaluator, in RPC threads
        with self._publish_lock:
          seconds, copies = self._publish
        wall = times[0].wall
        times.append(report.NodeTimes(f"{name} publish", "publisher", {report.PARAM_FETCH: seconds,
                                                                        report.IDLE: max(wall - seconds, 0.0)},
                                      wall, {report.PARAM_FETCH: copies}, helper=True))
      return {"nodes": [t.as_dict() for t in times], "updates": self._learner.steps, "calls": self._learner.version}

    self._times = TimesFile(self._session, name, books)
    self._timer.start()
    report.watch_compiles(self._timer)
    try:
      self._learn(logger)
    except Stopped:
      pass
    finally:
      report.unwatch_compiles()
      self._timer.stop()
      self._times.write()
    log(f"[learner] params_digest at version {self._learner.version}: "
        f"{params_digest(self._learner.get_variables()[0])}")

  def _learn(self, logger):
    lead = self._process == 0
    last_time, last_steps = time.monotonic(), self._learner.steps
    while not self._stop.is_set():
      try:
        metrics = self._learner.step()
      except StopIteration:  # the program is stopping
        break
      version = self._learner.version
      self._faults.check_learner(version)
      if version % DIGEST_EVERY == 0:
        log(f"[learner] params_digest at version {version}: {params_digest(self._learner.get_variables()[0])}")
      now = time.monotonic()
      if now - last_time >= LOG_SECONDS:
        steps = self._learner.steps
        counts = self._count_steps(steps) if lead else wait_unless_stopped(self._counter.future("get_counts"),
                                                                            self._stop)
        logger.write({"learner_steps": steps, "learner_version": version,
                      "actor_steps": counts.get("actor_steps", 0.0), **metrics,
                      "updates_per_second": (steps - last_steps) / (now - last_time), "host": host_name()})
        last_time, last_steps = now, steps
        self._times.maybe_write()
