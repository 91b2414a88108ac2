"""Launchpad node classes: counter, replay tables, learner, actors, inference servers, evaluator.

Each node builds its pieces inside `run()` (in its own process under local_mp)
from the experiment and agent configs; handles to other nodes arrive as
courier clients (or a reverb.Client for the replay node).
"""

from jrl import compat

compat.import_jax_probability()  # before anything imports TensorFlow

import concurrent.futures
import os
import threading
import time
from typing import Dict, List

import jax
import launchpad as lp
import numpy as np

from jrl import envs
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
from jrl.experiment.runner import reverb_batches, write_json
from jrl.learners import sharding
from jrl.learners.learner import Learner, params_digest
from jrl.replay import reverb_replay

LOG_SECONDS = 1.0


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


def exit_soon_after_stop(grace_seconds: float = 5.0) -> None:
  """Ends this node's process `grace_seconds` after the program's stop, wherever its
  main thread is (still compiling, or waiting on a peer that is gone): a node must
  not outlive the program, and Launchpad kills the whole runtime, launcher
  included, when one lingers."""
  def watchdog():
    lp.wait_for_stop()
    time.sleep(grace_seconds)
    os._exit(0)

  threading.Thread(target=watchdog, name="exit-after-stop", daemon=True).start()


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
    self._learner = Learner(parts.agent.make_learner(parts.networks, cfg), jax.random.PRNGKey(exp.seed), batches,
                            updater, mesh=mesh)
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
    seed = exp.seed + 1_000 * (self._id + 1)
    env = envs.make_vector_env(exp.env, exp.num_envs, seed)
    if self._inference is None:
      variables = VariableClient(AsyncRemoteVariables(self._learner), exp.variable_update_period)
      policy = LocalPolicy(parts.agent.make_policy(parts.networks, cfg), variables, jax.random.PRNGKey(seed))
    else:
      server = self._inference
      remote_infer = lambda actor_id, obs: wait_unless_stopped(server.futures.infer(actor_id, obs))
      policy = InferenceClient(remote_infer, self._id // exp.num_inference_servers)
    writer = reverb_replay.ReverbItemWriter(self._replay, stop=lp.stop_event())
    blocks = make_block_writer(parts.replay_spec, writer)
    actor = Actor(env, policy, make_adder(parts.replay_spec, exp.num_envs, cfg), sink=blocks.add)
    logger = MetricsLogger(self._run_dir, f"actor{self._id}")
    try:
      self._act(actor, policy, logger)
    except Stopped:
      pass

  def _act(self, actor, policy, logger):
    exp = self._exp
    returns: List[float] = []
    last_time, last_steps = time.monotonic(), 0
    while not lp.stop_event().is_set():
      returns += actor.step().returns
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

  def __init__(self, exp: ExperimentConfig, agent_cfg, learner, num_actors: int, server_id: int = 0):
    self._exp, self._cfg, self._learner = exp, agent_cfg, learner
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
    self._core = BatchedInference(parts.agent.make_policy(parts.networks, cfg), variables,
                                  jax.random.PRNGKey(exp.seed + 7_919 * (self._id + 1)), self._num_actors,
                                  exp.num_envs, parts.env_spec.observation_shape, exp.inference_timeout_ms)
    self._ready.set()
    self._core.serve(lp.stop_event())


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
                          exp.eval_episodes, seed=exp.seed + 10_000)
    logger = MetricsLogger(self._run_dir, "evaluator")
    progress = Progress(f"{exp.agent} {exp.env} s{exp.seed} distributed/{exp.inference}", exp.progress_seconds)
    try:
      self._evaluate(exp, evaluator, logger, progress, threshold)
    except Stopped:
      pass

  def _evaluate(self, exp, evaluator, logger, progress, threshold):
    start = time.monotonic()
    history, steps_to_threshold, next_eval = [], None, exp.eval_every
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
    server_stats = [wait_unless_stopped(s.futures.stats()) for s in self._servers]
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
