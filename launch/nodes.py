"""Launchpad node classes: counter, replay tables, learner, actors, inference servers, evaluator.

Each node builds its pieces inside `run()` (in its own process under local_mp)
from the experiment and agent configs; handles to other nodes arrive as
courier clients (or a reverb.Client for the replay node).

Actors, inference servers and the evaluator may be restarted by the supervisor
(launch/supervisor.py): a restarted one (`incarnation() > 0`) takes fresh seeds,
continues its exploration schedule and appends to its metrics. Actors wait out
a lost replay or inference server for `service_deadline_seconds`.
"""

from jrl import compat

compat.import_jax_probability()  # before anything imports TensorFlow

import concurrent.futures
import csv
import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional

import jax
import launchpad as lp
import numpy as np

from jrl import envs, seeding
from jrl.actors.actor import Actor, LocalPolicy
from jrl.actors.evaluator import Evaluator
from jrl.actors.inference import BatchedInference, InferenceClient
from jrl.actors.variables import VariableClient
from jrl.errors import Stopped
from jrl.experiment import plots
from jrl.experiment.builder import (build_agent_parts, example_item, items_per_fetch, make_adder, make_block_writer,
                                    success_threshold)
from jrl.experiment.config import ExperimentConfig
from jrl.experiment.logging import MetricsLogger, Progress
from jrl.experiment.files import write_json
from jrl.experiment.runner import reverb_batches
from jrl.learners import sharding
from jrl.learners.learner import Learner, params_digest
from jrl.outage import Outage, ServiceLost
from jrl.replay import reverb_replay
from launch.supervisor import INCARNATION_ENV, RUN_DIR_ENV

LOG_SECONDS = 1.0
# Longest the evaluator waits for an inference server's statistics at the end.
STATS_TIMEOUT_SECONDS = 10.0
# A call to a service that has answered before counts as lost after this long without a reply.
REPLY_PATIENCE_SECONDS = 2.0


class Counter:
  """Shared counts, summed with `increment`."""

  def __init__(self):
    self._lock = threading.Lock()
    self._counts: Dict[str, float] = {}

  def increment(self, **deltas) -> Dict[str, float]:
    with self._lock:
      for key, value in deltas.items():
        self._counts[key] = self._counts.get(key, 0.0) + float(value)
      return dict(self._counts)

  def get_counts(self) -> Dict[str, float]:
    with self._lock:
      return dict(self._counts)


def make_replay_tables(exp: ExperimentConfig, agent_cfg):
  parts = build_agent_parts(exp.agent, exp.env, agent_cfg)
  signature = reverb_replay.item_signature(example_item(parts, agent_cfg))
  # Leeway for actors and learner running at their own pace: a few learner calls' worth.
  error_buffer = 10 * items_per_fetch(parts.replay_spec, exp.updates_per_call, agent_cfg.batch_size)
  return [reverb_replay.make_table(parts.replay_spec, signature, error_buffer)]


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


def node_seeds(seed: int, role: str, index: int) -> seeding.NodeSeeds:
  """Env seed and key of this incarnation of a node: a restarted one does not replay its predecessor's episodes."""
  key = seeding.node_key(seed, role, index)
  return seeding.NodeSeeds(seeding.env_seed(seed, role, index, incarnation()),
                           jax.random.fold_in(key, incarnation()) if incarnation() else key)


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


def metrics_logger(run_dir: str, role: str, **kwargs) -> MetricsLogger:
  """The node's metrics; a restarted node appends to its predecessor's rows."""
  path = os.path.join(run_dir, "metrics", f"{role}.csv")
  resume_from = os.path.getsize(path) if incarnation() and os.path.exists(path) else None
  return MetricsLogger(run_dir, role, resume_from=resume_from, **kwargs)


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
  """Samples replay, updates, serves `get_variables()` -> (params as numpy, version)."""

  def __init__(self, exp: ExperimentConfig, agent_cfg, replay, counter, run_dir: str):
    self._exp, self._cfg, self._replay, self._counter, self._run_dir = exp, agent_cfg, replay, counter, run_dir
    self._ready = threading.Event()
    self._served = (-1, None)

  def version(self) -> int:
    self._ready.wait()
    return self._learner.version

  def get_variables(self):
    self._ready.wait()
    version = self._learner.version
    if self._served[0] != version:
      params, version = self._learner.get_variables()
      self._served = (version, jax.device_get(params))
    return self._served[1], self._served[0]

  def run(self):
    exit_soon_after_stop()
    exp, cfg = self._exp, self._cfg
    parts = build_agent_parts(exp.agent, exp.env, cfg)
    mesh = sharding.make_mesh(exp.learner_devices)
    spec = parts.replay_spec
    batches = reverb_batches(self._replay.server_address, parts, cfg, exp, cfg.batch_size, mesh,
                             stop=lp.stop_event())
    updater = reverb_replay.ReverbPriorityUpdater(self._replay) if spec.prioritized else None
    self._learner = Learner(parts.agent.make_learner(parts.networks, cfg), seeding.node_key(exp.seed, "learner"),
                            batches, updater, mesh=mesh)
    self._ready.set()
    logger = MetricsLogger(self._run_dir, "learner", step_key="learner_steps")
    try:
      self._learn(logger)
    except Stopped:
      pass

  def _learn(self, logger):
    exp = self._exp
    last_time, last_steps = time.monotonic(), 0
    while not lp.stop_event().is_set():
      try:
        metrics = self._learner.step()
      except StopIteration:  # the program is stopping
        break
      if exp.crash_learner_after and self._learner.version >= exp.crash_learner_after:
        raise RuntimeError(f"injected learner failure after {self._learner.version} calls (crash_learner_after)")
      now = time.monotonic()
      if now - last_time >= LOG_SECONDS:
        steps = self._learner.steps
        counts = wait_unless_stopped(self._counter.futures.increment(learner_steps=steps - last_steps))
        logger.write({"learner_steps": steps, "actor_steps": counts.get("actor_steps", 0.0), **metrics,
                      "updates_per_second": (steps - last_steps) / (now - last_time)})
        last_time, last_steps = now, steps


class ActorNode:
  """Steps `num_envs` envs and writes the agent's replay items (transitions or trajectories)."""

  def __init__(self, actor_id: int, exp: ExperimentConfig, agent_cfg, replay, learner, counter,
               inference=None, run_dir: str = ""):
    self._id, self._exp, self._cfg = actor_id, exp, agent_cfg
    self._replay, self._learner, self._counter, self._inference = replay, learner, counter, inference
    self._run_dir = run_dir

  def run(self):
    exit_soon_after_stop()
    exp, cfg = self._exp, self._cfg
    parts = build_agent_parts(exp.agent, exp.env, cfg)
    seed, key = node_seeds(exp.seed, "actor", self._id)
    env = envs.make_vector_env(exp.env, exp.num_envs, seed)
    if self._inference is None:
      variables = VariableClient(AsyncRemoteVariables(self._learner), exp.variable_update_period)
      policy = LocalPolicy(parts.agent.make_policy(parts.networks, cfg), variables, key)
      if incarnation():
        policy.restore(continued_exploration(policy.state(), self._steps_per_actor()))
    else:
      server_id = self._id % exp.num_inference_servers
      infer = ServiceCall(self._inference, "infer", f"inference server inference/{server_id} "
                          f"({self._inference.address})", exp.service_deadline_seconds, lp.stop_event())
      policy = InferenceClient(infer, self._id // exp.num_inference_servers)
    writer = reverb_replay.ReverbItemWriter(self._replay, stop=lp.stop_event(),
                                            deadline_s=exp.service_deadline_seconds, log=log)
    blocks = make_block_writer(parts.replay_spec, writer)
    actor = Actor(env, policy, make_adder(parts.replay_spec, exp.num_envs, cfg), sink=blocks.add)
    logger = metrics_logger(self._run_dir, f"actor{self._id}")
    log(f"actor {self._id} acting (incarnation {incarnation()}, env seed {seed})")
    try:
      self._act(actor, policy, logger)
    except Stopped:
      pass

  def _steps_per_actor(self) -> float:
    counts = wait_unless_stopped(self._counter.futures.get_counts())
    return counts.get("actor_steps", 0.0) / self._exp.num_actors

  def _act(self, actor, policy, logger):
    exp = self._exp
    returns: List[float] = []
    last_time, last_steps = time.monotonic(), 0
    while not lp.stop_event().is_set():
      returns += actor.step().returns
      if exp.crash_actor_after and self._id == 0 and actor.env_steps >= exp.crash_actor_after:
        raise RuntimeError(f"injected actor failure after {actor.env_steps} env steps (crash_actor_after)")
      now = time.monotonic()
      if now - last_time >= LOG_SECONDS:
        counts = wait_unless_stopped(self._counter.futures.increment(actor_steps=actor.env_steps - last_steps,
                                                                     episodes=len(returns)))
        lag = wait_unless_stopped(self._learner.futures.version()) - policy.version
        self._counter.futures.increment(policy_lag_sum=lag, policy_lag_count=1)
        logger.write({"actor_steps": actor.env_steps, "total_actor_steps": counts["actor_steps"],
                      "episode_return": float(np.mean(returns)) if returns else float("nan"),
                      "steps_per_second": (actor.env_steps - last_steps) / (now - last_time),
                      "policy_version": policy.version, "policy_lag": lag})
        last_time, last_steps, returns = now, actor.env_steps, []
        if counts["actor_steps"] >= exp.steps:
          break
    lp.wait_for_stop()


class InferenceNode:
  """Central batched inference over the agent's pure policy; `infer(actor_id, obs_bytes) -> bytes`."""

  def __init__(self, exp: ExperimentConfig, agent_cfg, learner, num_actors: int, server_id: int = 0,
               counter=None):
    self._exp, self._cfg, self._learner, self._counter = exp, agent_cfg, learner, counter
    self._num_actors, self._id = num_actors, server_id
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
    variables = VariableClient(AsyncRemoteVariables(self._learner), 1)
    _, key = node_seeds(exp.seed, "inference", self._id)
    self._core = BatchedInference(parts.agent.make_policy(parts.networks, cfg), variables, key, self._num_actors,
                                  exp.num_envs, parts.env_spec.observation_shape, exp.inference_timeout_ms)
    if incarnation() and self._counter is not None:
      counts = wait_unless_stopped(self._counter.futures.get_counts())
      self._core.restore(continued_exploration(self._core.state(), counts.get("actor_steps", 0.0) / exp.num_actors))
    self._ready.set()
    log(f"inference server {self._id} serving (incarnation {incarnation()})")
    self._core.serve(lp.stop_event())


def previous_evaluations(path: str, threshold: Optional[float]):
  """(eval returns, steps to threshold, wall seconds) of the rows a predecessor wrote to `path`;
  the wall time continues from its last row plus the time since that row was written."""
  if not os.path.exists(path):
    return [], None, 0.0
  with open(path, newline="") as f:
    rows = list(csv.DictReader(f))
  if not rows:
    return [], None, 0.0
  history = [float(row["eval_return"]) for row in rows]
  steps_to_threshold = next((int(float(row["actor_steps"])) for row in rows
                             if threshold is not None and float(row["eval_return"]) >= threshold), None)
  elapsed = float(rows[-1]["wall_seconds"]) + max(0.0, time.time() - os.path.getmtime(path))
  return history, steps_to_threshold, elapsed


class EvaluatorNode:
  """Evaluates the learner's parameters, prints progress, and stops the program at the budget."""

  def __init__(self, exp: ExperimentConfig, agent_cfg, learner, counter, inference_servers, run_dir: str,
               replay=None):
    self._exp, self._cfg, self._learner, self._counter, self._replay = exp, agent_cfg, learner, counter, replay
    self._servers, self._run_dir = list(inference_servers), run_dir

  def run(self):
    exit_soon_after_stop()
    exp, cfg = self._exp, self._cfg
    parts = build_agent_parts(exp.agent, exp.env, cfg)
    threshold = success_threshold(exp)
    evaluator = Evaluator(exp.env, parts.agent.make_policy(parts.networks, cfg, evaluation=True),
                          exp.eval_episodes, seed=seeding.env_seed(exp.seed, "evaluator"))
    path = os.path.join(self._run_dir, "metrics", "evaluator.csv")
    previous = previous_evaluations(path, threshold) if incarnation() else None  # before the logger touches it
    logger = metrics_logger(self._run_dir, "evaluator")
    progress = Progress(f"{exp.agent} {exp.env} s{exp.seed} distributed/{exp.inference}", exp.progress_seconds)
    try:
      self._evaluate(exp, evaluator, logger, progress, threshold, previous)
    except Stopped:
      pass

  def _evaluate(self, exp, evaluator, logger, progress, threshold, previous=None):
    start = time.monotonic()
    history, steps_to_threshold, next_eval = [], None, exp.eval_every
    if previous is not None:  # a restart: continue the predecessor's history, and evaluate at once
      history, steps_to_threshold, elapsed = previous
      start, next_eval = start - elapsed, 0
    while not lp.stop_event().wait(0.2):
      counts = wait_unless_stopped(self._counter.futures.get_counts())
      actor_steps = counts.get("actor_steps", 0.0)
      done = actor_steps >= exp.steps
      if actor_steps >= next_eval or done:
        next_eval = (actor_steps // exp.eval_every + 1) * exp.eval_every
        params, version = wait_unless_stopped(self._learner.futures.get_variables())
        returns = evaluator.run(params)
        history.append(float(np.mean(returns)))
        if steps_to_threshold is None and threshold is not None and history[-1] >= threshold:
          steps_to_threshold = int(actor_steps)
        logger.write({"actor_steps": actor_steps, "learner_steps": counts.get("learner_steps", 0.0),
                      "learner_version": version, "eval_return": history[-1],
                      "eval_return_std": float(np.std(returns)), "wall_seconds": time.monotonic() - start})
      elapsed = time.monotonic() - start
      progress.maybe_print(f"steps {actor_steps:.0f}/{exp.steps} | {actor_steps / elapsed:.0f} steps/s | "
                           f"updates {counts.get('learner_steps', 0):.0f} | episodes {counts.get('episodes', 0):.0f} | "
                           f"eval {history[-1] if history else float('nan'):.1f}", force=done)
      if done or (exp.stop_at_threshold and steps_to_threshold is not None):
        break
    else:
      return  # stopped from outside before the budget
    server_stats = self._server_stats()
    replay_info = self._replay.server_info()[reverb_replay.TABLE] if self._replay is not None else None
    batches = sum(s["batches"] for s in server_stats)
    summary = {
        "agent": exp.agent, "env": exp.env, "seed": exp.seed, "replay": "reverb", "distributed": True,
        "inference": exp.inference, "num_actors": exp.num_actors,
        "actor_steps": int(actor_steps), "learner_steps": int(counts.get("learner_steps", 0)),
        "wall_seconds": round(time.monotonic() - start, 3),
        "eval_return": history[-1], "best_eval_return": max(history),
        "reward_threshold": threshold, "steps_to_threshold": steps_to_threshold,
        "learner_devices": sharding.make_mesh(exp.learner_devices).devices.size, "learner_processes": 1,
        "inference_batch_mean": (sum(s["batch_mean"] * s["batches"] for s in server_stats) / batches
                                 if batches else None),
        "policy_lag_mean": counts.get("policy_lag_sum", 0.0) / max(counts.get("policy_lag_count", 0.0), 1.0),
        "learner_version": int(version),
        **({"replay_size": int(replay_info.current_size),
            "replay_items_inserted": int(replay_info.rate_limiter_info.insert_stats.completed),
            "replay_items_sampled": int(replay_info.rate_limiter_info.sample_stats.completed)}
           if replay_info is not None else {}),
        "params_digest": params_digest(params),
    }
    write_json(os.path.join(self._run_dir, "summary.json"), summary)
    plots.plot_learning_curve(self._run_dir, f"{exp.agent} on {exp.env}, seed {exp.seed} (distributed)", threshold)
    lp.stop()

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
