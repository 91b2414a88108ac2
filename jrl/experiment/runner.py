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
import pickle
import shutil
import tempfile
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional

import jax
import numpy as np

from jrl import compat, jit_cache, seeding
from jrl.actors.evaluator import Evaluator
from jrl.actors.variables import VariableClient
from jrl.experiment import files, plots, report
from jrl.experiment.bookkeeping import EvalHistory
from jrl.experiment.builder import build_acting_parts, example_item, make_actor, success_threshold
from jrl.experiment.checkpoint import Checkpointer, CheckpointSchedule, FailedWrites, checkpoint_to_resume
from jrl.experiment.config import ExperimentConfig
from jrl.experiment.files import CHECKPOINTS_DIR, REPORT_FILE, SUMMARY_FILE, write_json
from jrl.experiment.summary import make_summary
from jrl.experiment.logging import Progress, metric_log_positions, open_metric_logs
from jrl.experiment.snapshots import save_policy
from jrl.learners import distributed, sharding
from jrl.learners.learner import Learner, params_digest
from jrl.replay.adders import make_block_writer
from jrl.replay.batches import PrefetchIterator, PreparedBatch, items_per_fetch, make_assembler
from jrl.replay.buffer import SeededReplayBuffer
from jrl.replay.local import calls_due

ROLES = ("actor", "learner", "evaluator")
REPORT_NOTES = (
    "Times are this session's (a resumed run reports the part after its resume). `main` is the "
    "runner's thread: it steps the envs, runs the policy, adds to replay, calls the learner, "
    "evaluates and checkpoints, one after another, so its phases add up to its wall time. JIT "
    "compilation is taken out of the calls that triggered it into `compile`; the verdict leaves it "
    "out (it is paid once). `prefetch` (Reverb runs) samples and prepares learner batches on its "
    "own thread: its `sample` includes waits on Reverb's rate limiter, its `queue_wait` is time "
    "with batches ready and nobody taking them. samples_per_insert counts transitions inserted "
    "once replay holds min_replay_size of them, as the rate limiter does.")
SEEDED_REPLAY_FILE = "seeded_buffer.pkl"
REVERB_REPLAY_DIR = "reverb"


class Replay(NamedTuple):
  writer: Any                                  # insert(block, priority)
  batches: Iterator[PreparedBatch]
  update_priorities: Callable[[Dict[int, float]], None]
  close: Callable[[], None]
  kind: str
  save: Callable[[str], None]                  # writes the contents into a checkpoint folder
  table_size: Callable[[], int]                # items in replay now


def make_replay(parts, agent_cfg, exp: ExperimentConfig, batch_size: int, mesh: jax.sharding.Mesh,
                run_dir: str, restore_from: Optional[str] = None,
                timer: Optional[report.PhaseTimer] = None) -> Replay:
  """The seeded buffer (`exp.deterministic`) or an in-process Reverb server; with
  `restore_from` (a checkpoint's replay folder) it starts with the saved contents.

  `timer` times the sampling: the caller's own timer for the seeded buffer (batches are
  drawn in the caller's thread), the prefetch thread's timer for Reverb."""
  timer = timer if timer is not None else report.NULL_TIMER
  spec = parts.replay_spec
  updates = spec.kind.updates_per_call(exp.updates_per_call)
  num_items = items_per_fetch(spec, updates, batch_size)

  if exp.deterministic:
    replay_seed = seeding.env_seed(exp.seed, "replay", exp.process_id)
    rng = np.random.default_rng(replay_seed + 1)
    assemble_batch = make_assembler(spec, updates, batch_size, rng)
    buffer = SeededReplayBuffer(spec, seed=replay_seed)
    if restore_from is not None:
      with open(os.path.join(restore_from, SEEDED_REPLAY_FILE), "rb") as f:
        saved = pickle.load(f)
      buffer.restore(saved["buffer"])
      rng.bit_generator.state = saved["assembler_rng"]

    def synchronous_batches():
      while True:
        timer.enter(report.SAMPLE)
        sampled = buffer.sample(num_items)
        timer.switch(report.ASSEMBLE)
        prepared = assemble_batch(sampled)
        timer.exit()
        yield prepared

    def save(folder: str) -> None:
      with open(os.path.join(folder, SEEDED_REPLAY_FILE), "wb") as f:
        pickle.dump({"buffer": buffer.state(), "assembler_rng": rng.bit_generator.state}, f,
                    protocol=pickle.HIGHEST_PROTOCOL)

    return Replay(buffer, synchronous_batches(), buffer.update_priorities, lambda: None, "seeded", save,
                  lambda: buffer.size)

  from jrl.replay import reverb_replay  # the only path that loads reverb and TensorFlow

  example = example_item(parts, agent_cfg)
  signature = reverb_replay.item_signature(example)
  # Leeway for the batches prepared ahead plus the samples the dataset keeps in flight.
  error_buffer = (exp.prefetch + 4) * num_items
  # Reverb writes its checkpoints here; each is then moved into the run's checkpoint.
  os.makedirs(os.path.join(run_dir, CHECKPOINTS_DIR), exist_ok=True)
  scratch = tempfile.mkdtemp(prefix=".reverb-", dir=os.path.join(run_dir, CHECKPOINTS_DIR))
  fallback = os.path.join(restore_from, REVERB_REPLAY_DIR) if restore_from is not None else None
  server = reverb_replay.start_server([reverb_replay.make_table(spec, signature, error_buffer)],
                                      checkpoint_dir=scratch, restore_from=fallback)
  address = f"localhost:{server.port}"
  client = reverb_replay.reverb.Client(address)
  writer = reverb_replay.ReverbItemWriter(client)
  batches = reverb_batches(address, parts, agent_cfg, exp, batch_size, mesh, timer=timer)

  def save(folder: str) -> None:
    writer.flush()
    shutil.move(client.checkpoint(), os.path.join(folder, REVERB_REPLAY_DIR))

  def close():
    batches.close()
    writer.close()
    server.stop()
    shutil.rmtree(scratch, ignore_errors=True)

  return Replay(writer, batches, reverb_replay.ReverbPriorityUpdater(client), close, "reverb", save,
                lambda: int(client.server_info()[reverb_replay.TABLE].current_size))


def reverb_batches(address: str, parts, agent_cfg, exp: ExperimentConfig, batch_size: int,
                   mesh: jax.sharding.Mesh, stop: Optional[threading.Event] = None,
                   timer: Optional[report.PhaseTimer] = None) -> PrefetchIterator:
  """Learner batches from a Reverb table, prepared on a background thread: sample the
  items of one call, deal them into batches, place them sharded on `mesh`. `timer`, if
  given, is that thread's: it gets sample (Reverb's rate limiter included), assemble,
  place and queue_wait."""
  from jrl.replay import reverb_replay

  spec = parts.replay_spec
  updates = spec.kind.updates_per_call(exp.updates_per_call)
  sampler = reverb_replay.ReverbItemSampler(address, items_per_fetch(spec, updates, batch_size),
                                            example_item(parts, agent_cfg))
  rng = np.random.default_rng(seeding.env_seed(exp.seed, "replay", exp.process_id) + 1)
  assemble_batch = make_assembler(spec, updates, batch_size, rng)

  clock = timer if timer is not None else report.NULL_TIMER

  def produce() -> PreparedBatch:
    clock.enter(report.SAMPLE)
    sampled = sampler.sample()
    clock.switch(report.ASSEMBLE)
    prepared = assemble_batch(sampled)
    clock.switch(report.PLACE)
    prepared = prepared._replace(batch=sharding.put_batch(prepared.batch, mesh))
    clock.exit()
    return prepared

  return PrefetchIterator(produce, depth=exp.prefetch, stop=stop, timer=timer)


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


class LoopState:
  """The runner's own bookkeeping between iterations (everything else lives in the shells)."""

  def __init__(self, exp: ExperimentConfig, threshold: Optional[float]):
    self.episodes_total = 0
    self.recent_returns: List[float] = []
    self.recent_lengths: List[int] = []
    self.history = EvalHistory(threshold)
    self.learner_metrics: Dict[str, float] = {}
    self.next_log, self.next_eval = exp.log_every, exp.eval_every
    self.last_eval_steps = -1
    self.last_eval: Dict[str, Any] = {}  # which evaluation saw the newest params: seed, index, return
    self.wall_before = 0.0         # wall seconds of earlier sessions of this run
    self.lost_sequences = 0        # queued trajectories a resumed Reverb run never got back
    self.sessions = 0              # times this run was resumed

  def state(self) -> Dict[str, Any]:
    return {**{k: v for k, v in vars(self).items() if k != "history"}, "history": self.history.state()}

  def restore(self, state: Dict[str, Any]) -> None:
    for key, value in state.items():
      setattr(self, key, EvalHistory.from_state(value) if key == "history" else value)


def prepare_run_dir(exp: ExperimentConfig, agent_cfg) -> str:
  """`files.prepare_run_dir`; a Reverb run where Reverb is not installed (a core install) is
  refused once the folder is checked, before anything is written."""
  def check_stack():
    if not exp.deterministic:
      compat.check_distributed_stack("deterministic", "a run without --deterministic (Reverb replay)")
  return files.prepare_run_dir(exp, agent_cfg, before_writing=check_stack)


def run(exp: ExperimentConfig, agent_cfg) -> Dict[str, Any]:
  """Trains `exp.agent` on `exp.env` for `exp.steps` env steps; returns the summary.

  Every phase of the loop is timed (`jrl.experiment.report`): the run writes
  RUN_DIR/report.md and adds the bottleneck, the rates and the phase seconds to the summary."""
  entered = time.perf_counter()
  jit_cache.enable_compilation_cache()  # a rerun loads its compiled programs (JRL_JAX_CACHE=off: never)
  distributed.initialize(exp.coordinator_address, exp.num_processes, exp.process_id)
  parts, asynchronous = build_acting_parts(exp.agent, exp.env, agent_cfg)
  agent, networks, replay_spec = parts.agent, parts.networks, parts.replay_spec
  mesh = sharding.make_mesh(exp.learner_devices)
  sharding.check_batch_size(agent_cfg.batch_size, mesh)
  threshold = success_threshold(exp)
  resume_info = checkpoint_to_resume(exp.resume, exp.steps) if exp.resume else None
  saved: Optional[Dict[str, Any]] = Checkpointer.read_run_state(resume_info) if resume_info else None
  run_dir = prepare_run_dir(exp, agent_cfg)
  checkpointer = Checkpointer(run_dir, exp.keep_checkpoints)
  checkpointer.clean_partial()
  failed_writes = FailedWrites()
  # This process is actor `process_id` of the run (several processes share one learner).
  learner_key = seeding.node_key(exp.seed, "learner")
  actor_key = seeding.node_key(exp.seed, "actor", exp.process_id)
  # Each process feeds its own slice of the global batch from its own replay.
  local_batch_size = agent_cfg.batch_size // jax.process_count()
  # One timer per thread: this one, and the Reverb batch-prefetch thread's.
  timer = report.PhaseTimer()
  prefetch_timer = None if exp.deterministic else report.PhaseTimer()
  replay = make_replay(parts, agent_cfg, exp, local_batch_size, mesh, run_dir,
                       restore_from=Checkpointer.replay_dir(resume_info) if resume_info else None,
                       timer=timer if exp.deterministic else prefetch_timer)
  learner = Learner(agent.make_learner(networks, agent_cfg), learner_key, replay.batches,
                    replay.update_priorities if replay_spec.prioritized else None, mesh=mesh, timer=timer)
  initial_digest = params_digest(learner.get_variables()[0])  # the same embedded and distributed for a seed
  block_writer = make_block_writer(replay_spec, replay.writer)
  variables = VariableClient(learner)
  # The learner times its parameter copies itself (the policy's fetch is a cached read otherwise).
  # Seeded runs ask for actions after the learner's call (same bytes); Reverb runs overlap the policy with
  # inserts, and with other env groups' steps, where the policy computes asynchronously (images:
  # `cpu_jit.choose_dispatch`).
  actor = make_actor(exp, parts, agent_cfg, (variables, actor_key, None),
                     seeding.env_seed(exp.seed, "actor", exp.process_id), block_writer.add, timer,
                     dispatch_ahead=not exp.deterministic and asynchronous)
  evaluator_seed = seeding.env_seed(exp.seed, "evaluator")
  evaluator = Evaluator(exp.env, agent.make_policy(networks, agent_cfg, evaluation=True),
                        exp.eval_episodes, seed=evaluator_seed)
  loop = LoopState(exp, threshold)

  positions: Dict[str, Any] = {}
  if saved is not None:
    loop.restore(saved["loop"])
    loop.sessions += 1
    learner.restore(Checkpointer.restore_learner(resume_info, learner.state), saved["learner_steps"],
                    saved["learner_version"])
    variables.update()  # the actor acts with the restored parameters
    if not actor.restore(saved["actor"], reset_seed=seeding.env_seed(exp.seed, "actor", exp.process_id,
                                                                      incarnation=loop.sessions)):
      print(f"[resume] {exp.env} envs cannot be saved; they restart with fresh episodes", flush=True)
    block_writer.restore(saved["block_writer"])
    evaluator.restore(saved["evaluator"])
    positions = saved["positions"]
    if replay.kind == "reverb":  # a queue's trajectories the sampler had taken but not trained on are gone
      loop.lost_sequences += replay_spec.kind.items_lost_on_resume(
          block_writer.transitions_written - loop.lost_sequences, learner.version * local_batch_size,
          replay.table_size)

  # A resumed run drops what was logged after its checkpoint (everything, without one).
  tb, loggers = open_metric_logs(run_dir, ROLES, positions if exp.resume else None)
  progress = Progress(f"{exp.agent} {exp.env} s{exp.seed}", exp.progress_seconds)
  samples_per_call = replay_spec.kind.updates_per_call(exp.updates_per_call) * local_batch_size
  schedule = CheckpointSchedule(exp.checkpoint_every_steps, exp.checkpoint_every_seconds, actor.env_steps)

  def calls_owed() -> int:
    """Learner calls due by the rows the item kind schedules by (`ItemKind.rows_scheduled`): one
    per batch of trajectories written (on-policy), or enough to keep rows sampled at
    samples_per_insert x inserted (transitions: env steps less those the adder may hold back)."""
    rows = replay_spec.kind.rows_scheduled(replay_spec, block_writer.transitions_written - loop.lost_sequences,
                                           actor.env_steps, exp.num_envs)
    return calls_due(rows, replay_spec, samples_per_call)

  start = time.monotonic()
  elapsed = lambda: loop.wall_before + time.monotonic() - start
  loop_started = time.perf_counter()
  timer.start()
  report.watch_compiles(timer)  # JIT compilation in this thread is its own phase
  plots.preload_in_background()  # matplotlib loads while the first calls compile
  first_step_unix = time.time()
  at_start = Counts(actor.env_steps, learner.steps, learner.version, block_writer.transitions_written)
  last_step = time.perf_counter()
  last_log = (start, actor.env_steps, learner.steps)  # time, actor steps, learner steps

  def snapshot_info(**extra) -> Dict[str, Any]:
    return {"actor_steps": actor.env_steps, "learner_steps": learner.steps, **extra}

  def evaluate():
    with timer.phase(report.EVAL):
      _evaluate()

  def _evaluate():
    loop.last_eval_steps = actor.env_steps
    eval_index = evaluator.state()["count"]
    params = learner.get_variables()[0]
    row = loop.history.record(actor.env_steps, evaluator.run(params))
    loggers["evaluator"].write({"actor_steps": actor.env_steps, "learner_steps": learner.steps,
                                **{k: v for k, v in row.items() if k != "is_best"},
                                "wall_seconds": elapsed()})
    loop.last_eval = {"eval_return": row["eval_return"], "eval_index": eval_index, "eval_seed": evaluator_seed,
                      "eval_episodes": exp.eval_episodes}
    if row["is_best"]:
      with timer.phase(report.CHECKPOINT), failed_writes.attempt("policy snapshot 'best'"):
        save_policy(run_dir, "best", params, snapshot_info(**loop.last_eval))

  def save_checkpoint():
    with timer.phase(report.CHECKPOINT), failed_writes.attempt("checkpoint"):
      _save_checkpoint()

  def _save_checkpoint():
    params = learner.get_variables()[0]
    loop_state = loop.state()
    loop_state["wall_before"] = elapsed()
    run_state = {
        "actor": actor.state(), "block_writer": block_writer.state(), "evaluator": evaluator.state(),
        "learner_steps": learner.steps, "learner_version": learner.version, "loop": loop_state,
        "positions": metric_log_positions(tb, loggers),
    }
    counters = {"actor_steps": actor.env_steps, "learner_steps": learner.steps, "episodes": loop.episodes_total,
                "evaluations": loop.history.count}
    schedule.done(actor.env_steps)  # a failed checkpoint is not retried at once
    checkpointer.save(learner.state, run_state, counters, write_replay=replay.save)
    save_policy(run_dir, "latest", params, snapshot_info())

  try:
    while actor.env_steps < exp.steps:
      stats = actor.step()
      last_step = time.perf_counter()
      loop.episodes_total += len(stats.returns)
      loop.recent_returns += stats.returns
      loop.recent_lengths += stats.lengths

      while learner.version < calls_owed():
        loop.learner_metrics = learner.step()

      if actor.env_steps >= loop.next_eval:
        loop.next_eval += exp.eval_every
        evaluate()
        if exp.stop_at_threshold and loop.history.reached:
          break

      if actor.env_steps >= loop.next_log:
        loop.next_log += exp.log_every
        now = time.monotonic()
        dt = max(now - last_log[0], 1e-9)
        actor_sps = (actor.env_steps - last_log[1]) / dt
        updates_ps = (learner.steps - last_log[2]) / dt
        last_log = (now, actor.env_steps, learner.steps)
        returns, lengths = loop.recent_returns, loop.recent_lengths
        loggers["actor"].write({"actor_steps": actor.env_steps, "episodes": loop.episodes_total,
                                "episode_return": float(np.mean(returns)) if returns else float("nan"),
                                "episode_length": float(np.mean(lengths)) if lengths else float("nan"),
                                "steps_per_second": actor_sps, "wall_seconds": elapsed()})
        if loop.learner_metrics:
          loggers["learner"].write({"actor_steps": actor.env_steps, "learner_steps": learner.steps,
                                    **loop.learner_metrics, "updates_per_second": updates_ps,
                                    "wall_seconds": elapsed()})
        history = loop.history.returns
        episode_text = f"{np.mean(returns):.1f}" if returns else "-"
        eval_text = f"{history[-1]:.1f} (best {max(history):.1f})" if history else "-"
        progress.maybe_print(f"steps {actor.env_steps}/{exp.steps} | {actor_sps:.0f} steps/s | "
                             f"updates {learner.steps} ({updates_ps:.0f}/s) | episode return {episode_text} | "
                             f"eval {eval_text}")
        loop.recent_returns, loop.recent_lengths = [], []

      if schedule.due(actor.env_steps) and actor.env_steps < exp.steps:  # the last one follows the loop
        save_checkpoint()

    if loop.last_eval_steps != actor.env_steps:  # always finish on an evaluation of the final parameters
      evaluate()
    save_checkpoint()
    final_params = learner.get_variables()[0]
    with timer.phase(report.CHECKPOINT), failed_writes.attempt("policy snapshot 'final'"):
      save_policy(run_dir, "final", final_params, snapshot_info(**loop.last_eval))
  finally:
    report.unwatch_compiles()
    replay.close()
    evaluator.close()
    actor.close()
    for logger in loggers.values():
      logger.close()
    tb.close()

  wall = elapsed()
  timer.stop()
  nodes = [timer.node("main", "embedded")]
  if prefetch_timer is not None:
    nodes.append(prefetch_timer.node("prefetch", "sampler", helper=True))
  rates = session_rates(at_start, Counts(actor.env_steps, learner.steps, learner.version,
                                         block_writer.transitions_written),
                        timer.wall(), local_batch_size, replay_spec)
  rates["setup_seconds"] = loop_started - entered
  result, report_fields = report.write_report(
      run_dir, nodes, rates, title=f"{exp.agent} on {exp.env}, seed {exp.seed}: where the time went",
      extras={"notes": REPORT_NOTES}, file_name=REPORT_FILE)
  summary = make_summary(
      exp=exp, kind="embedded", replay=replay.kind, actor_steps=actor.env_steps, learner_steps=learner.steps,
      episodes=loop.episodes_total, wall_seconds=wall, history=loop.history.summary(),
      learner_devices=mesh.devices.size, learner_processes=jax.process_count(), resumed=saved is not None,
      checkpoints=[os.path.basename(p) for p in checkpointer.all()], params_digest=params_digest(final_params),
      failed_writes=failed_writes.lines, report_fields=report_fields,
      details={
          "initial_params_digest": initial_digest,
          # When this session's first and last env steps began and ended (time.time()), and the
          # seconds from the last one to this summary (final evaluation, checkpoint, shutdown).
          "first_step_unix": round(first_step_unix, 3),
          "last_step_unix": round(first_step_unix + (last_step - loop_started), 3),
          "seconds_after_last_step": round(time.perf_counter() - last_step, 3),
      })
  write_json(os.path.join(run_dir, SUMMARY_FILE), summary)
  plots.plot_learning_curve(run_dir, f"{exp.agent} on {exp.env}, seed {exp.seed}", threshold)
  progress.maybe_print(f"report: {result.advice} ({os.path.join(run_dir, REPORT_FILE)})", force=True)
  progress.maybe_print(f"done: {actor.env_steps} steps in {wall:.1f}s | eval {summary['eval_return']:.1f} "
                       f"(best {summary['best_eval_return']:.1f}) | steps to threshold "
                       f"{summary['steps_to_threshold']} | {run_dir}", force=True)
  failed_writes.check(run_dir)
  summary["run_dir"] = run_dir
  return summary
