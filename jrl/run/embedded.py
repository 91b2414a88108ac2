"""Single-process runner: actor, learner and evaluator interleaved in one process.

Replay is an in-process Reverb server, or with `deterministic` a seeded
in-process buffer (same seed, same bytes). Learner calls are scheduled so that
transitions sampled track `samples_per_insert` x transitions inserted, the
ratio Reverb's rate limiter enforces in distributed runs.

The run checkpoints periodically and at the end (see `jrl.experiment.checkpoint`)
and continues from its newest checkpoint with `exp.resume`. A checkpoint is taken
between loop iterations and holds the whole loop state, so a `deterministic`
run that is resumed ends with the same bytes as one that was never stopped.
"""

import os
import shutil
import tempfile
import time
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional

import jax
import numpy as np

from jrl import compat, jit_cache, seeding
from jrl.actors.evaluator import Evaluator
from jrl.actors.variables import VariableClient
from jrl.experiment import plots, report
from jrl.experiment.builder import build_acting_parts, example_item, make_actor, replay_batches, success_threshold
from jrl.experiment.checkpoint import CheckpointInfo, Checkpointer
from jrl.experiment.checkpoint_formats import write as write_data
from jrl.experiment.config import ExperimentConfig
from jrl.experiment.files import CHECKPOINTS_DIR, REPORT_FILE
from jrl.replay.checkpoint_names import REVERB_REPLAY_DIR
from jrl.run.core import RunCore
from jrl.learners import distributed, sharding
from jrl.learners.learner import Learner, params_digest
from jrl.replay.adders import make_block_writer
from jrl.replay.batches import PreparedBatch, items_per_fetch, make_assembler
from jrl.replay.buffer import SeededReplayBuffer
from jrl.replay.local import calls_due
from jrl.timing import ASSEMBLE, NULL_TIMER, SAMPLE, PhaseTimer, unwatch_compiles, watch_compiles

REPORT_NOTES = (
    "Times are this session's (a resumed run reports the part after its resume). `main` is the "
    "runner's thread: it steps the envs, runs the policy, adds to replay, calls the learner, "
    "evaluates and checkpoints, one after another, so its phases add up to its wall time. JIT "
    "compilation is taken out of the calls that triggered it into `compile`; the verdict leaves it "
    "out (it is paid once). `prefetch` (Reverb runs) samples and prepares learner batches on its "
    "own thread: its `sample` includes waits on Reverb's rate limiter, its `queue_wait` is time "
    "with batches ready and nobody taking them. samples_per_insert counts transitions inserted "
    "once replay holds min_replay_size of them, as the rate limiter does.")
SEEDED_REPLAY = "seeded_buffer"  # replay/seeded_buffer.json and .npz (jrl.experiment.checkpoint_formats)


class Replay(NamedTuple):
  writer: Any                                  # insert(block, priority)
  batches: Iterator[PreparedBatch]
  update_priorities: Callable[[Dict[int, float]], None]
  close: Callable[[], None]
  kind: str
  save: Callable[[str], None]                  # writes the contents into a checkpoint folder
  table_size: Callable[[], int]                # items in replay now


def make_replay(parts, agent_cfg, exp: ExperimentConfig, batch_size: int, mesh: jax.sharding.Mesh,
                run_dir: str, restore_from: Optional[CheckpointInfo] = None,
                timer: Optional[PhaseTimer] = None) -> Replay:
  """The seeded buffer (`exp.deterministic`) or an in-process Reverb server; with
  `restore_from` (a checkpoint) it starts with the contents saved there.

  `timer` times the sampling: the caller's own timer for the seeded buffer (batches are
  drawn in the caller's thread), the prefetch thread's timer for Reverb."""
  timer = timer if timer is not None else NULL_TIMER
  spec = parts.replay_spec
  updates = spec.kind.updates_per_call(exp.updates_per_call)
  num_items = items_per_fetch(spec, updates, batch_size)

  if exp.deterministic:
    replay_seed = seeding.env_seed(exp.seed, "replay", exp.process_id)
    rng = np.random.default_rng(replay_seed + 1)
    assemble_batch = make_assembler(spec, updates, batch_size, rng)
    buffer = SeededReplayBuffer(spec, seed=replay_seed)
    if restore_from is not None:
      saved = Checkpointer.read_replay_state(restore_from, SEEDED_REPLAY)
      buffer.restore(saved["buffer"])
      rng.bit_generator.state = saved["assembler_rng"]

    def synchronous_batches():
      while True:
        timer.enter(SAMPLE)
        sampled = buffer.sample(num_items)
        timer.switch(ASSEMBLE)
        prepared = assemble_batch(sampled)
        timer.exit()
        yield prepared

    def save(folder: str) -> None:
      write_data(folder, SEEDED_REPLAY, {"buffer": buffer.state(), "assembler_rng": rng.bit_generator.state})

    return Replay(buffer, synchronous_batches(), buffer.update_priorities, lambda: None, "seeded", save,
                  lambda: buffer.size)

  from jrl.replay import reverb_replay  # the only path that loads reverb and TensorFlow

  # Reverb writes its checkpoints here; each is then moved into the run's checkpoint.
  os.makedirs(os.path.join(run_dir, CHECKPOINTS_DIR), exist_ok=True)
  scratch = tempfile.mkdtemp(prefix=".reverb-", dir=os.path.join(run_dir, CHECKPOINTS_DIR))
  fallback = os.path.join(Checkpointer.replay_dir(restore_from), REVERB_REPLAY_DIR) if restore_from is not None else None
  tables = reverb_replay.replay_tables(spec, example_item(parts, agent_cfg), exp.updates_per_call, batch_size,
                                       exp.prefetch)
  server = reverb_replay.start_server(tables, checkpoint_dir=scratch, restore_from=fallback)
  replay = reverb_replay.ReverbReplayClient(reverb_replay.reverb.Client(f"localhost:{server.port}"))
  client = replay.client
  writer = reverb_replay.ReverbItemWriter(client, **reverb_replay.frame_options(spec, exp.num_envs))
  batches = replay_batches(replay, parts, agent_cfg, exp, batch_size, mesh, timer=timer)

  def save(folder: str) -> None:
    writer.flush()
    replay.checkpoint(folder)

  def close():
    batches.close()
    writer.close()
    server.stop()
    shutil.rmtree(scratch, ignore_errors=True)

  return Replay(writer, batches, replay.update_priorities, close, "reverb", save, lambda: replay.info().size)


class Counts(NamedTuple):
  env_steps: int
  updates: int
  calls: int
  rows_written: int    # transitions (or sequences) written to replay


def session_rates(before: Counts, after: Counts, wall: float, batch_size: int, spec) -> Dict[str, Any]:
  """Rates achieved between two counts: env steps and updates per second, and rows sampled
  per row inserted (the inserts the item kind's ratio counts: transitions once replay holds
  min_size of them, as the rate limiter counts; every trajectory of an on-policy queue)."""
  wall = max(wall, 1e-9)
  calls = after.calls - before.calls
  sampled = (after.updates - before.updates) * batch_size
  inserted = spec.kind.counted_inserts(before.rows_written, after.rows_written, spec.min_size)
  return {
      "env_steps_per_second": (after.env_steps - before.env_steps) / wall,
      "updates_per_second": (after.updates - before.updates) / wall,
      "learner_calls_per_second": calls / wall,
      "samples_per_insert": sampled / inserted if inserted > 0 else None,
      "samples_per_insert_target": spec.kind.samples_per_insert(spec),
  }



class EmbeddedDriver:
  """Acting and learning in this process: each `advance` steps the actor's envs once, then makes
  the learner calls the item kind's schedule owes (`ItemKind.rows_scheduled`)."""

  def __init__(self, exp: ExperimentConfig, agent_cfg, parts, asynchronous: bool, mesh: jax.sharding.Mesh,
               core: RunCore, timer: PhaseTimer, prefetch_timer: Optional[PhaseTimer]):
    self.exp, self.spec = exp, parts.replay_spec
    resume_info, saved = core.resume_info, core.saved
    # Each process feeds its own slice of the global batch from its own replay; this process is
    # actor `process_id` of the run (several processes share one learner).
    self.batch_size = agent_cfg.batch_size // jax.process_count()
    self.replay = make_replay(parts, agent_cfg, exp, self.batch_size, mesh, core.run_dir,
                              restore_from=resume_info,
                              timer=timer if exp.deterministic else prefetch_timer)
    agent, networks = parts.agent, parts.networks
    self.learner = Learner(agent.make_learner(networks, agent_cfg), seeding.node_key(exp.seed, "learner"),
                           self.replay.batches, self.replay.update_priorities if self.spec.prioritized else None,
                           mesh=mesh, timer=timer)
    self.initial_digest = params_digest(self.params())  # the same embedded and distributed for a seed
    self.block_writer = make_block_writer(self.spec, self.replay.writer)
    variables = VariableClient(self.learner)
    # Seeded runs ask for actions after the learner's call (same bytes); Reverb runs overlap the policy
    # with inserts, and with other env groups' steps, where the policy computes asynchronously (images:
    # `cpu_jit.choose_dispatch`).
    actor_seed = seeding.env_seed(exp.seed, "actor", exp.process_id)
    self.actor = make_actor(exp, parts, agent_cfg, (variables, seeding.node_key(exp.seed, "actor", exp.process_id),
                                                    None), actor_seed, self.block_writer.add, timer,
                            dispatch_ahead=not exp.deterministic and asynchronous)
    self.evaluator = Evaluator(exp.env, agent.make_policy(networks, agent_cfg, evaluation=True),
                               exp.eval_episodes, seed=core.evaluator_seed, should_stop=core.stop_requested,
                               progress=core.eval_progress, progress_seconds=core.eval_progress_seconds)
    self.recent_returns: List[float] = []
    self.recent_lengths: List[int] = []
    self.learner_metrics: Dict[str, float] = {}
    self.lost_sequences = 0  # queued trajectories a resumed Reverb run never got back
    if saved is not None:
      loop = core.restore_books(saved["loop"])
      self.recent_returns, self.recent_lengths = loop["recent_returns"], loop["recent_lengths"]
      self.learner_metrics, self.lost_sequences = loop["learner_metrics"], loop["lost_sequences"]
      self.learner.restore(Checkpointer.restore_learner(resume_info, self.learner.state), saved["learner_steps"],
                           saved["learner_version"])
      variables.update()  # the actor acts with the restored parameters
      reset_seed = seeding.env_seed(exp.seed, "actor", exp.process_id, incarnation=core.books.sessions)
      if not self.actor.restore(saved["actor"], reset_seed=reset_seed):
        print(f"[resume] {exp.env} envs cannot be saved; they restart with fresh episodes", flush=True)
      self.block_writer.restore(saved["block_writer"])
      if self.replay.kind == "reverb" and self.spec.frame_stack:
        # Rows in flight at the checkpoint name frames only the last session's writer held: they are
        # dropped (no more than the rows the schedule holds back anyway) and the adders start afresh.
        self.block_writer.drop_staged()
        for group in getattr(self.actor, "groups", [self.actor]):
          group.replace_adder(self.spec.make_adder(group.num_envs))
      self.evaluator.restore(saved["evaluator"])
      if self.replay.kind == "reverb":  # a queue's trajectories the sampler took but did not train on are gone
        self.lost_sequences += self.spec.kind.items_lost_on_resume(
            self.block_writer.transitions_written - self.lost_sequences, self.learner.version * self.batch_size,
            self.replay.table_size)
    self.samples_per_call = self.spec.kind.updates_per_call(exp.updates_per_call) * self.batch_size
    self.last_step = time.perf_counter()
    self.last_row = (time.monotonic(), self.env_steps, self.learner_steps)  # time, env steps, learner steps

  @property
  def env_steps(self) -> int:
    return self.actor.env_steps

  @property
  def learner_steps(self) -> int:
    return self.learner.steps

  def counts(self) -> Counts:
    return Counts(self.actor.env_steps, self.learner.steps, self.learner.version,
                  self.block_writer.transitions_written)

  def calls_owed(self) -> int:
    """Learner calls due by the rows the item kind schedules by: one per batch of trajectories
    written (on-policy), or enough to keep rows sampled at samples_per_insert x inserted
    (transitions: env steps less those the adder may hold back)."""
    rows = self.spec.kind.rows_scheduled(self.spec, self.block_writer.transitions_written - self.lost_sequences,
                                         self.actor.env_steps, self.exp.num_envs)
    return calls_due(rows, self.spec, self.samples_per_call)

  def advance(self, core: RunCore) -> None:
    stats = self.actor.step()
    self.last_step = time.perf_counter()
    core.books.episodes_total += len(stats.returns)
    self.recent_returns += stats.returns
    self.recent_lengths += stats.lengths
    while self.learner.version < self.calls_owed():
      self.learner_metrics = self.learner.step()
    if core.log_due(self.env_steps):
      now = time.monotonic()
      dt = max(now - self.last_row[0], 1e-9)
      sps, ups = (self.env_steps - self.last_row[1]) / dt, (self.learner_steps - self.last_row[2]) / dt
      self.last_row = (now, self.env_steps, self.learner_steps)
      returns, lengths = self.recent_returns, self.recent_lengths
      core.write_rows(self.env_steps, self.learner_steps, float(np.mean(returns)) if returns else None,
                      float(np.mean(lengths)) if lengths else None, sps, ups, self.learner_metrics, core.elapsed())
      self.recent_returns, self.recent_lengths = [], []

  def params(self):
    return self.learner.get_variables()[0]

  def evaluate(self, params):
    index = self.evaluator.state()["count"]
    return self.evaluator.run(params), index

  def checkpoint(self, books: Dict[str, Any]):
    loop = {**books, "recent_returns": self.recent_returns, "recent_lengths": self.recent_lengths,
            "learner_metrics": self.learner_metrics, "lost_sequences": self.lost_sequences}
    run_state = {"actor": self.actor.state(), "block_writer": self.block_writer.state(),
                 "evaluator": self.evaluator.state(), "learner_steps": self.learner.steps,
                 "learner_version": self.learner.version, "loop": loop}
    return self.learner.state, run_state, self.replay.save

  def close(self) -> None:
    self.replay.close()
    self.evaluator.close()
    self.actor.close()


def run_devices(mesh: jax.sharding.Mesh, driver: EmbeddedDriver) -> Dict[str, List[str]]:
  """role -> the devices it ran on: the learner's mesh, the device the actor's policy acted on
  (--actor_device's pick, `make_actor`) and where the evaluator's parameters are (the learner's first
  device: it acts with them)."""
  params = jax.tree_util.tree_leaves(driver.params())
  return {"learner": [report.device_name(d) for d in mesh.devices.flat],
          "actor": [report.device_name(driver.actor.policy_device)],
          "evaluator": sorted({report.device_name(d) for leaf in params for d in leaf.devices()})}


def run(exp: ExperimentConfig, agent_cfg) -> Dict[str, Any]:
  """Trains `exp.agent` on `exp.env` for `exp.steps` env steps; returns the summary.

  Every phase of the loop is timed (`jrl.experiment.report`): the run writes
  RUN_DIR/report.md and adds the bottleneck, the rates and the phase seconds to the summary."""
  entered = time.perf_counter()
  jit_cache.enable_compilation_cache()  # a rerun loads its compiled programs (JRL_JAX_CACHE=off: never)
  distributed.initialize(exp.coordinator_address, exp.num_processes, exp.process_id)
  parts, asynchronous = build_acting_parts(exp.agent, exp.env, agent_cfg, exp.actor_device)
  mesh = sharding.make_mesh(exp.learner_devices)
  sharding.check_batch_size(agent_cfg.batch_size, mesh)
  # One timer per thread: this one, and the Reverb batch-prefetch thread's.
  timer = PhaseTimer()
  prefetch_timer = None if exp.deterministic else PhaseTimer()

  def check_stack():  # a Reverb run where Reverb is not installed (a core install): refused before writing
    if not exp.deterministic:
      compat.check_distributed_stack("deterministic", "a run without --deterministic (Reverb replay)")

  core = RunCore(exp, agent_cfg, success_threshold(exp), before_writing=check_stack, timer=timer)
  driver = EmbeddedDriver(exp, agent_cfg, parts, asynchronous, mesh, core, timer, prefetch_timer)
  core.open(driver.env_steps, f"{exp.agent} {exp.env} s{exp.seed}")
  core.start_clock()
  loop_started = time.perf_counter()
  timer.start()
  watch_compiles(timer)  # JIT compilation in this thread is its own phase
  plots.preload_in_background()  # matplotlib loads while the first calls compile
  first_step_unix = time.time()
  at_start = driver.counts()
  try:
    final_params = core.drive(driver)
  finally:
    unwatch_compiles()
  wall = core.elapsed()
  timer.stop()
  nodes = [timer.node("main", "embedded")]
  if prefetch_timer is not None:
    nodes.append(prefetch_timer.node("prefetch", "sampler", helper=True))
  rates = session_rates(at_start, driver.counts(), timer.wall(), driver.batch_size, parts.replay_spec)
  rates["setup_seconds"] = loop_started - entered
  devices = run_devices(mesh, driver)
  result, report_fields = report.write_report(
      core.run_dir, nodes, rates, title=f"{exp.agent} on {exp.env}, seed {exp.seed}: where the time went",
      extras={report.DEVICES: report.devices_text(devices, {"actor": f"--actor_device {exp.actor_device}"}),
              "notes": REPORT_NOTES}, file_name=REPORT_FILE)
  details = {
      "initial_params_digest": driver.initial_digest,
      # Where each part ran (report.device_name), and the --actor_device setting that picked the actor's.
      "devices": devices,
      "actor_device": exp.actor_device,
      # When this session's first and last env steps began and ended (time.time()), and the seconds
      # from the last one to this summary (final evaluation, checkpoint, shutdown).
      "first_step_unix": round(first_step_unix, 3),
      "last_step_unix": round(first_step_unix + (driver.last_step - loop_started), 3),
      "seconds_after_last_step": round(time.perf_counter() - driver.last_step, 3),
  }
  return core.finish(driver, final_params, wall, result, report_fields, kind="embedded", replay=driver.replay.kind,
                     learner_devices=mesh.devices.size, learner_processes=jax.process_count(), details=details,
                     plot_title=f"{exp.agent} on {exp.env}, seed {exp.seed}")
