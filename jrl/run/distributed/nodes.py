"""Launchpad node classes: counter, replay tables, learner, actors, inference servers, the driver.

The driver node (`DriverNode`; `EvaluatorNode` is its former name) runs the run core's loop
(`jrl.run.core`) over the program, as the embedded and device runs do in-process: the
evaluation schedule, policy snapshots, progress, checkpoints' schedule and summary are the core's.
The counter holds the budget: when it is reached, actors stop acting and the driver concludes.

Each node builds its pieces inside `run()` (in its own process under local_mp)
from the experiment and agent configs; handles to other nodes arrive as
courier clients (or a reverb.Client for the replay node).

Actors, inference servers and the driver node may be restarted by the supervisor
(launch/supervisor.py): a restarted one (`incarnation() > 0`) takes fresh seeds,
continues its exploration schedule and appends to its metrics. Actors wait out
a lost replay or inference server for `service_deadline_seconds`.
"""

from jrl import compat

compat.import_jax_probability()  # before anything imports TensorFlow

import concurrent.futures
import dataclasses
import json
import os
import shutil
import signal
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import jax
import launchpad as lp
import numpy as np

from jrl import cpu_jit, seeding
from jrl.actors.evaluator import Evaluator
from jrl.actors.inference import BatchedInference, InferenceClient
from jrl.actors.variables import VariableClient
from jrl.errors import Stopped
from jrl.experiment import report
from jrl.experiment.builder import (build_acting_parts, build_agent_parts, example_item, make_actor, reverb_batches,
                                    success_threshold)
from jrl.experiment.checkpoint import Checkpointer, RunWritesFailed
from jrl.experiment.config import ExperimentConfig
from jrl.experiment.files import CHECKPOINTS_DIR, REVERB_REPLAY_DIR
from jrl.experiment.logging import MetricsLogger, TensorBoard, last_step
from jrl.run.core import RunCore, WrittenCheckpoint, next_mark, save_checkpoint
from jrl.learners import distributed, sharding
from jrl.learners.learner import Learner, params_digest
from jrl.outage import Outage, ServiceLost
from jrl.replay import reverb_replay
from jrl.replay.adders import make_block_writer
from jrl.run.distributed import faults, liveness
from jrl.run.distributed.node_env import INCARNATION_ENV, RUN_DIR_ENV

# Node processes import this module before they make any array: their loops all wait for
# each result at once (see `jrl.cpu_jit.dispatch_synchronously`; actors on images switch back).
cpu_jit.dispatch_synchronously()

LOG_SECONDS = 1.0
# Longest the driver node waits for an inference server's statistics at the end.
STATS_TIMEOUT_SECONDS = 10.0
# A call to a service that has answered before counts as lost after this long without a reply.
REPLY_PATIENCE_SECONDS = 2.0
# Where nodes write their phase times for the run report (launch/distributed.py reads them),
# and how often.
TIMES_DIR = os.path.join("logs", "times")
TIMES_EVERY_SECONDS = 2.0
# The driver node repeats a progress line whose env steps (and lost hosts) have not changed only this
# often: while the actors start (imports, compiles) the count stays at its start, and one line says so.
STILL_PROGRESS_SECONDS = 30.0


@dataclasses.dataclass(frozen=True)
class Session:
  """What a node needs to know about this launch of the program beyond its config."""
  run_dir: str
  number: int = 0                 # 0 for a new run, n for its n-th resume
  checkpoint: Optional[str] = None  # the checkpoint a resumed program starts from


# The learner logs the digest of its parameters every this many calls: the processes
# of a multi-process learner must show the same digest at the same version.
DIGEST_EVERY = 50
REVERB_SCRATCH = ".reverb"  # under checkpoints/: where the replay node writes Reverb checkpoints


def report_share(budget: float, counted: float, num_actors: int) -> float:
  """How many unreported env steps an actor may hold before it reports them, beside its once a
  second: its share of what the budget has left (`counted`: the total the counter last told it).

  Actors learn the total only when they report, so without it each could run a whole second past
  the budget. With it, when the budget is passed no actor holds more than its share of what was
  left at its last report, and every actor that sees the budget passed stops: together they end
  below budget * (2 - 1/num_actors) + num_actors vector steps, and near the budget when they step
  at like speeds. No actor is waited for, so a lost one does not hold the run."""
  return max(budget - counted, 0.0) / num_actors


class Counter:
  """The program's shared bookkeeping: counts summed with `increment` (env steps,
  episodes, learner steps, wall seconds, ...), the run core's books (`RunBooks.state()`: the
  evaluation history, the next evaluation, the newest one) that the driver node keeps, and the
  budget: `over()` is the one place that says the run's env steps are spent, for the actors (they
  stop acting) and the driver node (it concludes the run and stops the program). It outlives
  every restartable node and goes into checkpoints (`snapshot`)."""

  def __init__(self, initial: Optional[Dict[str, Any]] = None, steps: Optional[float] = None):
    """`initial`: a checkpoint's `snapshot()` (one written before the books were kept here has
    the evaluation history alone); `steps`: the budget of env steps (None: none)."""
    self._lock = threading.Lock()
    self._counts: Dict[str, float] = dict((initial or {}).get("counts", {}))
    self._eval_history: Optional[Dict[str, Any]] = (initial or {}).get("eval_history")
    self._books: Optional[Dict[str, Any]] = (initial or {}).get("books")
    self._steps = steps

  def increment(self, **deltas) -> Dict[str, float]:
    with self._lock:
      for key, value in deltas.items():
        self._counts[key] = self._counts.get(key, 0.0) + float(value)
      return dict(self._counts)

  def get_counts(self) -> Dict[str, float]:
    with self._lock:
      return dict(self._counts)

  def over(self) -> bool:
    """Whether the env steps counted have reached the budget."""
    with self._lock:
      return self._steps is not None and self._counts.get("actor_steps", 0.0) >= self._steps

  def set_books(self, books: Dict[str, Any]) -> None:
    with self._lock:
      self._books, self._eval_history = books, books["history"]

  def get_books(self) -> Optional[Dict[str, Any]]:
    with self._lock:
      return self._books

  def set_eval_history(self, state: Dict[str, Any]) -> None:
    with self._lock:
      self._eval_history = state

  def get_eval_history(self) -> Optional[Dict[str, Any]]:
    with self._lock:
      return self._eval_history

  def snapshot(self) -> Dict[str, Any]:
    with self._lock:
      return {"counts": dict(self._counts), "eval_history": self._eval_history, "books": self._books}


def reverb_checkpointer(run_dir: str, restore_from: Optional[str]):
  """The replay node's checkpointer: writes under checkpoints/.reverb (the learner moves each
  checkpoint into the run's own); a resumed program's tables start from `restore_from`."""
  return reverb_replay.reverb.checkpointers.DefaultCheckpointer(
      os.path.join(run_dir, CHECKPOINTS_DIR, REVERB_SCRATCH), fallback_checkpoint_path=restore_from)


def make_replay_tables(exp: ExperimentConfig, agent_cfg):
  """The replay node's tables: `reverb_replay.replay_tables`, as the embedded runner's, sampled by
  the learner's processes, each its share of the batch."""
  parts = build_agent_parts(exp.agent, exp.env, agent_cfg)
  return reverb_replay.replay_tables(parts.replay_spec, example_item(parts, agent_cfg), exp.updates_per_call,
                                     agent_cfg.batch_size // exp.num_processes, exp.prefetch,
                                     samplers=exp.num_processes)


def wait_unless_stopped(future):
  """The result of a courier future; Stopped if the program stops first (a dead
  peer must not keep this node alive past the program's stop)."""
  while True:
    try:
      return future.result(timeout=0.05)  # returns as soon as the reply is in
    except concurrent.futures.TimeoutError:
      if lp.stop_event().is_set():
        raise Stopped("program stopping")


def incarnation() -> int:
  """How many times the supervisor has restarted this node's process (0: the first one)."""
  return int(os.environ.get(INCARNATION_ENV, "0"))


def node_seeds(seed: int, role: str, index: int, session: int = 0) -> seeding.NodeSeeds:
  """Env seed and key of this incarnation of a node in this session of the run: a restarted
  or resumed one does not replay its predecessor's episodes."""
  key = seeding.node_key(seed, role, index)
  fresh = 1_000 * session + incarnation()
  return seeding.NodeSeeds(seeding.env_seed(seed, role, index, fresh),
                           jax.random.fold_in(key, fresh) if fresh else key)


def continues(session: Session) -> bool:
  """Whether this node continues earlier work: restarted, or part of a resumed run."""
  return bool(incarnation() or session.number)


def host_name() -> str:
  """The placement's name of this host (multi-host launches), else 'local'."""
  return os.environ.get("JRL_HOST", "local")


def log(text: str) -> None:
  """A line in this node's log (its stdout under local_mp)."""
  print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def continued_exploration(state: Any, env_steps: float) -> Any:
  """A restarted node's policy state with the env-step count that drives exploration
  schedules set to `env_steps` (one actor's share of the program's steps so far), so
  that it does not start exploring from scratch. States without one are returned as is."""
  if not (hasattr(state, "_replace") and hasattr(state, "env_steps")):
    return state
  return state._replace(env_steps=np.full(np.shape(state.env_steps), int(env_steps), np.asarray(state.env_steps).dtype))


def metrics_logger(session: Session, role: str, step_key: str = "actor_steps") -> MetricsLogger:
  """The node's metrics, in its CSV and its own TensorBoard folder (tensorboard/<role>/); a
  restarted or resumed node appends to its predecessor's rows (a resumed run has cut them back
  to its checkpoint) and has TensorBoard drop the predecessor's points after the last of them."""
  path = os.path.join(session.run_dir, "metrics", f"{role}.csv")
  resume_from = os.path.getsize(path) if continues(session) and os.path.exists(path) else None
  last = last_step(path, step_key) if resume_from is not None else None
  tb = TensorBoard(session.run_dir, subdir=role, continue_after=last, flush_each=True)
  return MetricsLogger(session.run_dir, role, tb, step_key=step_key, resume_from=resume_from)


def exit_soon_after_stop(grace_seconds: float = 5.0) -> None:
  """Ends this node's process `grace_seconds` after the program's stop, wherever its
  main thread is (still compiling, or waiting on a peer that is gone): a node must
  not outlive the program, and Launchpad kills the whole runtime, launcher
  included, when one lingers. Only in a process of its own (started by the
  supervisor): under local_mt the nodes are threads of the launcher."""
  if not os.environ.get(RUN_DIR_ENV):
    return
  stop = lp.stop_event()  # here: Launchpad's worker manager is only known to the node's own thread

  def watchdog():
    stop.wait()
    time.sleep(grace_seconds)
    os._exit(0)

  threading.Thread(target=watchdog, name="exit-after-stop", daemon=True).start()


def times_folder(run_dir: str, session_number: int) -> str:
  return os.path.join(run_dir, TIMES_DIR, f"session{session_number}")


class TimesFile:
  """One node's phase times (`PhaseTimer`s, as `NodeTimes` dicts) and counts for the run
  report, written to `logs/times/session<n>/<name>.<incarnation>.json` every
  TIMES_EVERY_SECONDS (`maybe_write`) and when the node ends (`write`): a node killed
  without warning still leaves its last few seconds' books."""

  def __init__(self, session: Session, name: str, collect: Callable[[], Dict[str, Any]]):
    self._path = os.path.join(times_folder(session.run_dir, session.number),
                              f"{name.replace('/', '-')}.{incarnation()}.json")
    self._collect = collect
    self._last = time.monotonic()

  def maybe_write(self) -> None:
    if time.monotonic() - self._last >= TIMES_EVERY_SECONDS:
      self.write()

  def write(self) -> None:
    self._last = time.monotonic()
    os.makedirs(os.path.dirname(self._path), exist_ok=True)
    tmp = f"{self._path}.tmp"
    with open(tmp, "w") as f:
      json.dump(self._collect(), f)
    os.replace(tmp, self._path)

  def write_every(self, stop: threading.Event) -> None:
    """Writes periodically from a thread of its own until `stop`."""
    def loop():
      while not stop.wait(TIMES_EVERY_SECONDS):
        self.write()
    threading.Thread(target=loop, name="times-file", daemon=True).start()


class TimedItemWriter(reverb_replay.ReverbItemWriter):
  """The replay writer with its waits for insert confirmations (where Reverb's rate limiter
  holds inserts) timed as `rate_limit_wait`, apart from the rest of the insert."""

  timer = report.NULL_TIMER

  def _flush(self, max_in_flight: int) -> None:
    self.timer.enter(report.RATE_LIMIT_WAIT)
    try:
      super()._flush(max_in_flight)
    finally:
      self.timer.exit()


class ServiceCall:
  """Calls one method of a courier service, waiting out its outages.

  Courier waits for a server that is gone until one listens on its address
  again, so a lost server shows as a reply that does not come: once the
  service has answered before, a call unanswered for REPLY_PATIENCE_SECONDS
  counts as an outage; an error reply is retried with backoff. Both are
  logged once per interval and end in ServiceLost after `deadline_s`. Before
  the first answer the service may still be starting, and the call waits.
  """

  def __init__(self, client, method: str, service: str, deadline_s: float, stop: threading.Event,
               log_fn: Optional[Callable[[str], None]] = None):
    self._client, self._method, self._stop = client, method, stop
    self._outage = Outage(service, deadline_s, log_fn or log)
    self._answered = False

  def __call__(self, *args):
    backoff = 0.1
    while True:
      start = time.monotonic()
      future = getattr(self._client.futures, self._method)(*args)
      try:
        result = self._reply(future, start)
      except (Stopped, ServiceLost):
        raise
      except Exception as e:  # the call failed: retry until the deadline
        self._outage.failing(f"{type(e).__name__}: {e}")
        if self._stop.wait(backoff):
          raise Stopped("program stopping")
        backoff = min(2 * backoff, 2.0)
        continue
      self._answered = True
      self._outage.ok()
      return result

  def _reply(self, future, start: float):
    while True:
      try:
        return future.result(timeout=0.05)
      except concurrent.futures.TimeoutError:
        if self._stop.is_set():
          future.cancel()
          raise Stopped("program stopping")
        waited = time.monotonic() - start
        if self._answered and waited >= REPLY_PATIENCE_SECONDS:
          try:
            self._outage.failing(f"no reply for {waited:.0f}s", since=start)
          except ServiceLost:
            future.cancel()
            raise


class AsyncRemoteVariables:
  """Variable source over RPC that refreshes in the background: each call
  returns the newest parameters received and keeps one request in flight."""

  def __init__(self, learner):
    self._learner = learner
    self._latest = wait_unless_stopped(learner.futures.get_variables())
    self._future = learner.futures.get_variables()

  def get_variables(self):
    if self._future.done():
      self._latest = self._future.result()
      self._future = self._learner.futures.get_variables()
    return self._latest


class LearnerNode:
  """Samples replay, updates, serves `get_variables()` -> (params as numpy, version).

  A learner of P processes (`exp.num_processes`) is P of these nodes joined by
  `jax.distributed`: each samples its share of the batch, they update in
  lockstep, and process 0 serves parameters, counts learner steps and writes
  the run's checkpoints when the driver node asks (on the run core's schedule, and at the end)
  or the launcher does (a stop from outside).
  """

  def __init__(self, exp: ExperimentConfig, agent_cfg, replay, counter, session: Session, process_id: int = 0):
    self._exp, self._cfg, self._replay, self._counter = exp, agent_cfg, replay, counter
    self._session, self._process = session, process_id
    self._ready = threading.Event()
    self._served = (-1, None)
    self._checkpoint_lock = threading.Lock()
    self._publish_lock = threading.Lock()
    self._publish = [0.0, 0]  # seconds and copies spent handing out new parameters (RPC threads)
    self._faults = faults.from_environment()
    self._count_lock = threading.Lock()
    self._counted = 0  # the learner steps the counter has (process 0 counts them)

  def _count_steps(self, steps: int) -> Dict[str, float]:
    """Brings the counter's learner steps to `steps`; the counts."""
    with self._count_lock:
      counts = wait_unless_stopped(self._counter.futures.increment(learner_steps=steps - self._counted))
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
      bookkeeping = wait_unless_stopped(self._counter.futures.snapshot())
      counts = bookkeeping["counts"]
      counts["learner_steps"] = float(steps)

      def write_replay(folder: str) -> None:
        shutil.move(self._replay.checkpoint(), os.path.join(folder, REVERB_REPLAY_DIR))

      run_state = {"counter": bookkeeping, "learner_steps": steps, "learner_version": version,
                   "sessions": self._session.number}
      counters = {"actor_steps": counts.get("actor_steps", 0.0), "learner_steps": steps, "learner_version": version,
                  "episodes": counts.get("episodes", 0.0)}
      path, failed_policy = save_checkpoint(self._checkpointer, self._session.run_dir, state, run_state, counters,
                                            write_replay, self._fns.params(state))
      log(f"checkpoint {os.path.basename(path)}: {counts.get('actor_steps', 0):.0f} env steps, {steps} updates")
      return path, failed_policy

  def run(self):
    exit_soon_after_stop()
    exp, cfg, processes = self._exp, self._cfg, self._exp.num_processes
    handler = signal.getsignal(signal.SIGTERM)
    distributed.initialize(exp.coordinator_address, processes, self._process)  # before any other JAX use
    signal.signal(signal.SIGTERM, handler)  # JAX's preemption notifier took SIGTERM from Launchpad's stop
    parts = build_agent_parts(exp.agent, exp.env, cfg)
    mesh = sharding.make_mesh(exp.learner_devices)
    self._mesh_size = int(mesh.devices.size)
    sharding.check_batch_size(cfg.batch_size, mesh)
    spec = parts.replay_spec
    # One timer per thread: the learner's own (sample wait, update, checkpoints) and its batch prefetch.
    self._timer, prefetch_timer = report.PhaseTimer(), report.PhaseTimer()
    batches = reverb_batches(self._replay.server_address, parts, cfg, dataclasses.replace(exp, process_id=self._process),
                             cfg.batch_size // processes, mesh, stop=lp.stop_event(), timer=prefetch_timer)
    updater = reverb_replay.ReverbPriorityUpdater(self._replay) if spec.prioritized else None
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
    while not lp.stop_event().is_set():
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
        counts = self._count_steps(steps) if lead else wait_unless_stopped(self._counter.futures.get_counts())
        logger.write({"learner_steps": steps, "learner_version": version,
                      "actor_steps": counts.get("actor_steps", 0.0), **metrics,
                      "updates_per_second": (steps - last_steps) / (now - last_time), "host": host_name()})
        last_time, last_steps = now, steps
        self._times.maybe_write()


class ActorNode:
  """Steps `num_envs` envs and writes the agent's replay items (transitions or trajectories)."""

  def __init__(self, actor_id: int, exp: ExperimentConfig, agent_cfg, replay, learner, counter,
               inference=None, session: Session = Session("")):
    self._id, self._exp, self._cfg = actor_id, exp, agent_cfg
    self._replay, self._learner, self._counter, self._inference = replay, learner, counter, inference
    self._session = session
    self._faults = faults.from_environment()

  def run(self):
    exit_soon_after_stop()
    exp, cfg = self._exp, self._cfg
    parts, asynchronous = build_acting_parts(exp.agent, exp.env, cfg)
    # A local policy on images computes its next actions while the adder and the inserts run.
    ahead = asynchronous and self._inference is None
    seed, key = node_seeds(exp.seed, "actor", self._id, self._session.number)
    timer = report.PhaseTimer()
    if self._inference is None:
      variables = VariableClient(AsyncRemoteVariables(self._learner), exp.variable_update_period)
      policy = (variables, key, timer)  # the agent's policy, made in this process by make_actor
    else:
      server_id = self._id % exp.num_inference_servers
      infer = ServiceCall(self._inference, "infer", f"inference server inference/{server_id} "
                          f"({self._inference.address})", exp.service_deadline_seconds, lp.stop_event())
      policy = InferenceClient(infer, self._id // exp.num_inference_servers, timer=timer)
    writer = TimedItemWriter(self._replay, stop=lp.stop_event(), deadline_s=exp.service_deadline_seconds, log=log,
                             **reverb_replay.frame_options(parts.replay_spec, exp.num_envs))
    writer.timer = timer
    blocks = make_block_writer(parts.replay_spec, writer)
    actor = make_actor(exp, parts, cfg, policy, seed, blocks.add, timer, dispatch_ahead=ahead)
    policy = actor.policy
    if self._inference is None and continues(self._session):
      policy.restore(continued_exploration(policy.state(), self._steps_per_actor()))
    logger = metrics_logger(self._session, f"actor{self._id}")
    log(f"actor {self._id} acting on {host_name()} (session {self._session.number}, incarnation {incarnation()}, "
        f"env seed {seed}{', next actions asked ahead' if ahead else ''})")
    name = f"actor/{self._id}"
    self._lags: Dict[str, int] = {}  # policy lag (learner calls) -> times seen
    self._times = TimesFile(self._session, name, lambda: {"nodes": [timer.node(name, "actor").as_dict()],
                                                          "env_steps": actor.env_steps, "policy_lag": dict(self._lags)})
    timer.start()
    report.watch_compiles(timer)
    try:
      self._act(actor, policy, writer, logger)
    except Stopped:
      pass
    finally:
      report.unwatch_compiles()
      timer.stop()
      self._times.write()
    lp.wait_for_stop()

  def _steps_per_actor(self) -> float:
    counts = wait_unless_stopped(self._counter.futures.get_counts())
    return counts.get("actor_steps", 0.0) / self._exp.num_actors

  def _act(self, actor, policy, writer, logger):
    exp = self._exp
    returns: List[float] = []
    last_time, last_steps = time.monotonic(), 0  # at the last report
    counted = wait_unless_stopped(self._counter.futures.get_counts()).get("actor_steps", 0.0)
    while not lp.stop_event().is_set():
      returns += actor.step().returns
      self._faults.check_actor(self._id, actor.env_steps)
      now = time.monotonic()
      if now - last_time >= LOG_SECONDS or \
          actor.env_steps - last_steps >= report_share(exp.steps, counted, exp.num_actors):
        counts = wait_unless_stopped(self._counter.futures.increment(actor_steps=actor.env_steps - last_steps,
                                                                     episodes=len(returns)))
        lag = wait_unless_stopped(self._learner.futures.version()) - policy.version
        self._counter.futures.increment(policy_lag_sum=lag, policy_lag_count=1)
        self._lags[str(lag)] = self._lags.get(str(lag), 0) + 1
        self._times.maybe_write()
        logger.write({"actor_steps": actor.env_steps, "total_actor_steps": counts["actor_steps"],
                      "episode_return": float(np.mean(returns)) if returns else float("nan"),
                      "steps_per_second": (actor.env_steps - last_steps) / (now - last_time),
                      "policy_version": policy.version, "policy_lag": lag,
                      "items_inserted": writer.items_inserted, "host": host_name()})
        last_time, last_steps, returns = now, actor.env_steps, []
        counted = counts["actor_steps"]
        if wait_unless_stopped(self._counter.futures.over()):  # the budget is the counter's to decide
          break


class InferenceNode:
  """Central batched inference over the agent's pure policy; `infer(actor_id, obs_bytes) -> bytes`."""

  def __init__(self, exp: ExperimentConfig, agent_cfg, learner, num_actors: int, server_id: int = 0,
               counter=None, session: Session = Session("")):
    self._exp, self._cfg, self._learner, self._counter = exp, agent_cfg, learner, counter
    self._num_actors, self._id, self._session = num_actors, server_id, session
    self._ready = threading.Event()

  def infer(self, actor_id: int, obs_bytes: bytes) -> bytes:
    self._ready.wait()
    return self._core.infer(actor_id, obs_bytes)

  def stats(self) -> Dict[str, float]:
    self._ready.wait()
    return self._core.stats()

  def run(self):
    exit_soon_after_stop()
    exp, cfg = self._exp, self._cfg
    parts = build_agent_parts(exp.agent, exp.env, cfg)
    # Refreshed every `variable_update_period` batches, like an actor's every so many steps: each
    # refresh is an RPC to the learner, and a device copy when the version changed.
    variables = VariableClient(AsyncRemoteVariables(self._learner), exp.variable_update_period)
    _, key = node_seeds(exp.seed, "inference", self._id, self._session.number)
    self._core = BatchedInference(parts.agent.make_policy(parts.networks, cfg), variables, key, self._num_actors,
                                  exp.num_envs, parts.env_spec.observation_shape, exp.inference_timeout_ms,
                                  obs_dtype=parts.env_spec.observation_dtype)
    if continues(self._session) and self._counter is not None:
      counts = wait_unless_stopped(self._counter.futures.get_counts())
      self._core.restore(continued_exploration(self._core.state(), counts.get("actor_steps", 0.0) / exp.num_actors))
    self._ready.set()
    log(f"inference server {self._id} serving (incarnation {incarnation()})")
    name, core = f"inference/{self._id}", self._core
    times = TimesFile(self._session, name, lambda: {
        "nodes": [core.timer.node(name, "inference").as_dict()],
        "batch_sizes": {str(k): v for k, v in sorted(core.batch_size_counts.items())}})
    times.write_every(lp.stop_event())
    report.watch_compiles(core.timer)
    try:
      core.serve(lp.stop_event())
    finally:
      report.unwatch_compiles()
      times.write()


class ProgramDriver:
  """The run core's `Driver` over the distributed program, in the driver node: `advance` waits
  for the counter's env steps to move (and shows the progress line, with the hosts the launcher
  found lost); `params` are the learner's variables (fetched once per look at the counter, so that
  the final policy, its evaluation and the summary's digest are of the same parameters); `evaluate`
  is the node's `Evaluator`; `checkpoint` is the learner node's (which writes it where its state
  lives); `over` is the counter's word on the budget.

  The run core's books are kept in the counter too (`Counter.set_books`): a restarted driver node,
  or a resumed run's, continues them, and evaluation k plays the same episodes whoever runs it."""

  def __init__(self, exp: ExperimentConfig, parts, agent_cfg, learner, counter, core: RunCore, session: Session,
               timer: report.PhaseTimer, times: "TimesFile"):
    self._exp, self._learner, self._counter, self._session = exp, learner, counter, session
    self._timer, self._times = timer, times
    books = wait_unless_stopped(counter.futures.get_books())
    if books is None:  # a fresh run, or a checkpoint written when the counter held the history alone
      history = wait_unless_stopped(counter.futures.get_eval_history())
      books = core.books.state() if history is None else legacy_books(history, exp)
    core.restore_books(books)
    core.books.sessions = session.number
    self.evaluator = Evaluator(exp.env, parts.agent.make_policy(parts.networks, agent_cfg, evaluation=True),
                               exp.eval_episodes, seed=core.evaluator_seed, first_index=core.books.history.count)
    self.over: bool = wait_unless_stopped(counter.futures.over())  # before the counts: see _look
    self._counts: Dict[str, float] = wait_unless_stopped(counter.futures.get_counts())
    self._last_time = time.monotonic()
    self._params, self.version = None, None
    self._printed: Tuple[Any, float] = (None, 0.0)  # the env steps (and lost hosts) of the last progress line, when

  @property
  def env_steps(self) -> int:
    return int(self._counts.get("actor_steps", 0))

  @property
  def learner_steps(self) -> int:
    return int(self._counts.get("learner_steps", 0))

  def advance(self, core: RunCore) -> None:
    self._counter.futures.set_books(core.books.state())  # what was recorded since the last look
    start = self.env_steps
    while True:
      if self._pause():
        raise Stopped("program stopping")
      self._times.maybe_write()
      self._look(core)
      self._show_progress(core)
      if self.env_steps != start or self.over:
        return

  def _pause(self) -> bool:
    """Waits a moment (idle); whether the program is stopping."""
    self._timer.enter(report.IDLE)
    try:
      return lp.stop_event().wait(0.2)
    finally:
      self._timer.exit()

  def _look(self, core: RunCore) -> None:
    """The counter's counts and word on the budget; the program's wall seconds (counted here, so
    that a restarted driver node continues them) are the core's clock."""
    now = time.monotonic()
    # The budget's word first, the counts after: counts only grow, so counts read after `over`
    # said yes are at or past the budget (read the other way round, an actor's last report could
    # land between the two, and a finished run's summary said 3,296 of its 3,300 steps).
    self.over = wait_unless_stopped(self._counter.futures.over())
    self._counts = wait_unless_stopped(self._counter.futures.increment(wall_seconds=now - self._last_time))
    self._last_time = now
    self._params = None
    core.books.episodes_total = int(self._counts.get("episodes", 0))
    core.books.wall_before = self._counts.get("wall_seconds", 0.0)
    core.start_clock(now)

  def _show_progress(self, core: RunCore) -> None:
    counts = self._counts
    lost = liveness.describe_lost(liveness.read_lost(self._session.run_dir))
    moved = (self.env_steps, lost) != self._printed[0] or time.monotonic() - self._printed[1] >= STILL_PROGRESS_SECONDS
    rate = self.env_steps / max(counts.get("wall_seconds", 0.0), 1e-9)
    if (moved or self.over) and core.progress.maybe_print(
        core.progress_text(self.env_steps, rate, f"{counts.get('learner_steps', 0):.0f}",
                           f"episodes {counts.get('episodes', 0):.0f}", f"lost {lost}" if lost else ""),
        force=self.over):
      self._printed = ((self.env_steps, lost), time.monotonic())

  def params(self):
    if self._params is None:
      self._params, self.version = wait_unless_stopped(self._learner.futures.get_variables())
    return self._params

  def evaluate(self, params):
    index = self.evaluator.next_index
    return self.evaluator.run(params), index

  def evaluation_columns(self) -> Dict[str, Any]:
    return {"learner_version": self.version,
            "lost_nodes": len(liveness.lost_nodes(liveness.read_lost(self._session.run_dir)))}

  def checkpoint(self, books: Dict[str, Any]) -> WrittenCheckpoint:
    wait_unless_stopped(self._counter.futures.set_books(books))  # in the checkpoint's counter
    path, failed_policy = wait_unless_stopped(self._learner.futures.checkpoint())
    # The learner brought the counter's learner steps up to its checkpoint's: the summary's are as of it.
    self._counts["learner_steps"] = wait_unless_stopped(self._counter.futures.get_counts()).get("learner_steps", 0.0)
    return WrittenCheckpoint(path, failed_policy)

  def close(self) -> None:
    self.evaluator.close()


def legacy_books(history: Dict[str, Any], exp: ExperimentConfig) -> Dict[str, Any]:
  """The run core's books from an evaluation history alone (a checkpoint written before the
  counter kept the books): the next evaluation is the first evaluation point past the last one."""
  evaluated = history["actor_steps"]
  last = evaluated[-1] if evaluated else 0
  return {"history": history, "next_log": exp.log_every, "next_eval": next_mark(last, 0, exp.eval_every),
          "last_eval_steps": last if evaluated else -1}


class DriverNode:
  """The program's driver: runs the run core's loop (`RunCore.drive`) over the program with a
  `ProgramDriver`, as the embedded and device runs do in-process. It evaluates the learner's
  parameters on the core's schedule, saves the best and final policies, prints progress, has the
  learner checkpoint on the core's schedule and at the end, writes the summary (with the writes
  that failed) and the learning curve, and then stops the program. The run ends when the counter
  says the budget is reached (or the threshold, with stop_at_threshold); the launcher adds the run
  report, restarts and lost hosts to the summary afterwards (launch/distributed.py)."""

  def __init__(self, exp: ExperimentConfig, agent_cfg, learner, counter, inference_servers, session: Session,
               replay=None):
    self._exp, self._cfg, self._learner, self._counter, self._replay = exp, agent_cfg, learner, counter, replay
    self._servers, self._session = list(inference_servers), session

  def run(self):
    exit_soon_after_stop()
    exp, cfg, session = self._exp, self._cfg, self._session
    parts = build_agent_parts(exp.agent, exp.env, cfg)
    # Not a stage of the pipeline (actors do not wait on it): a helper in the run report.
    timer = report.PhaseTimer()
    times = TimesFile(session, "evaluator/0",
                      lambda: {"nodes": [timer.node("evaluator/0", "evaluator", helper=True).as_dict()]})
    try:
      core = RunCore(exp, cfg, success_threshold(exp), timer=timer, prepared=(session.run_dir, session.number > 0))
      driver = ProgramDriver(exp, parts, cfg, self._learner, self._counter, core, session, timer, times)
      core.open(driver.env_steps, f"{exp.agent} {exp.env} s{exp.seed} distributed/{exp.inference}",
                loggers={"evaluator": metrics_logger(session, "evaluator")})
      timer.start()
      report.watch_compiles(timer)
      final_params = core.drive(driver, signals=False)  # Launchpad stops its nodes with SIGTERM
      self._finish(core, driver, final_params)
    except Stopped:
      return  # stopped from outside before the end
    finally:
      report.unwatch_compiles()
      timer.stop()
      times.write()
    lp.stop()

  def _finish(self, core: RunCore, driver: ProgramDriver, final_params) -> None:
    """The summary (the launcher adds the run report) and the learning curve."""
    exp = self._exp
    server_stats = self._server_stats()
    replay_info = self._replay.server_info()[reverb_replay.TABLE] if self._replay is not None else None
    batches = sum(s["batches"] for s in server_stats)
    counts = wait_unless_stopped(self._counter.futures.get_counts())
    written = core.checkpointed[1]
    details = {
        "inference": exp.inference, "num_actors": exp.num_actors,
        "final_checkpoint": os.path.basename(written) if written else None,
        "inference_batch_mean": (sum(s["batch_mean"] * s["batches"] for s in server_stats) / batches
                                 if batches else None),
        "policy_lag_mean": counts.get("policy_lag_sum", 0.0) / max(counts.get("policy_lag_count", 0.0), 1.0),
        "learner_version": int(driver.version),
        **({"replay_size": int(replay_info.current_size),
            "replay_items_inserted": int(replay_info.rate_limiter_info.insert_stats.completed),
            "replay_items_sampled": int(replay_info.rate_limiter_info.sample_stats.completed)}
           if replay_info is not None else {}),
    }
    try:
      core.finish(driver, final_params, core.elapsed(), None, None, kind="distributed", replay="reverb",
                  learner_devices=wait_unless_stopped(self._learner.futures.mesh_size()),
                  learner_processes=exp.num_processes, details=details,
                  plot_title=f"{exp.agent} on {exp.env}, seed {exp.seed} (distributed)")
    except RunWritesFailed:
      pass  # in the summary's failed_writes: the launcher ends non-zero after the run report

  def _server_stats(self) -> List[Dict[str, float]]:
    """Batching statistics of the inference servers that answer in time (a server being
    restarted is left out; a restarted one counts from its restart)."""
    stats = []
    for server_id, server in enumerate(self._servers):
      future = server.futures.stats()
      try:
        stats.append(future.result(timeout=min(STATS_TIMEOUT_SECONDS, self._exp.service_deadline_seconds)))
      except Exception as e:  # a missing statistic must not fail the run
        future.cancel()
        log(f"inference server inference/{server_id} gave no stats ({type(e).__name__}: {e}); "
            "left out of inference_batch_mean")
    return stats


EvaluatorNode = DriverNode  # its former name: the node evaluated, and ended the program itself
