"""Single-process runner: actor, learner and evaluator interleaved in one process.

Replay is an in-process Reverb server, or with `deterministic` a seeded
in-process buffer (same seed, same bytes). Learner calls are scheduled so that
transitions sampled track `samples_per_insert` x transitions inserted, the
ratio Reverb's rate limiter enforces in distributed runs.
"""

import dataclasses
import json
import os
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional

import jax
import numpy as np

from jrl import envs
from jrl.actors.actor import Actor, LocalPolicy
from jrl.actors.evaluator import Evaluator
from jrl.actors.variables import VariableClient
from jrl.experiment import plots
from jrl.experiment.builder import (build_agent_parts, example_item, items_per_fetch, make_adder, make_assembler,
                                    make_block_writer, success_threshold)
from jrl.experiment.config import ExperimentConfig
from jrl.experiment.logging import MetricsLogger, Progress, make_tensorboard
from jrl.learners import distributed, sharding
from jrl.learners.learner import Learner, params_digest
from jrl.replay.batches import PrefetchIterator, PreparedBatch
from jrl.replay.buffer import SeededReplayBuffer


class Replay(NamedTuple):
  writer: Any                                  # insert(block, priority)
  batches: Iterator[PreparedBatch]
  update_priorities: Callable[[Dict[int, float]], None]
  close: Callable[[], None]
  kind: str


def make_replay(parts, agent_cfg, exp: ExperimentConfig, batch_size: int, mesh: jax.sharding.Mesh) -> Replay:
  spec = parts.replay_spec
  num_items = items_per_fetch(spec, exp.updates_per_call, batch_size)

  if exp.deterministic:
    assemble_batch = make_assembler(spec, exp.updates_per_call, batch_size, np.random.default_rng(exp.local_seed + 1))
    buffer = SeededReplayBuffer(spec, seed=exp.local_seed)

    def synchronous_batches():
      while True:
        yield assemble_batch(buffer.sample(num_items))

    return Replay(buffer, synchronous_batches(), buffer.update_priorities, lambda: None, "seeded")

  from jrl.replay import reverb_replay  # the only path that loads reverb and TensorFlow

  example = example_item(parts, agent_cfg)
  signature = reverb_replay.item_signature(example)
  # Leeway for the batches prepared ahead plus the samples the dataset keeps in flight.
  error_buffer = (exp.prefetch + 4) * num_items
  server = reverb_replay.start_server([reverb_replay.make_table(spec, signature, error_buffer)])
  address = f"localhost:{server.port}"
  client = reverb_replay.reverb.Client(address)
  writer = reverb_replay.ReverbItemWriter(client)
  batches = reverb_batches(address, parts, agent_cfg, exp, batch_size, mesh)

  def close():
    batches.close()
    writer.close()
    server.stop()

  return Replay(writer, batches, reverb_replay.ReverbPriorityUpdater(client), close, "reverb")


def reverb_batches(address: str, parts, agent_cfg, exp: ExperimentConfig, batch_size: int,
                   mesh: jax.sharding.Mesh, stop: Optional[threading.Event] = None) -> PrefetchIterator:
  """Learner batches from a Reverb table, prepared on a background thread: sample the
  items of one call, deal them into batches, place them sharded on `mesh`."""
  from jrl.replay import reverb_replay

  spec = parts.replay_spec
  sampler = reverb_replay.ReverbItemSampler(address, items_per_fetch(spec, exp.updates_per_call, batch_size),
                                            example_item(parts, agent_cfg))
  assemble_batch = make_assembler(spec, exp.updates_per_call, batch_size, np.random.default_rng(exp.local_seed + 1))

  def produce() -> PreparedBatch:
    prepared = assemble_batch(sampler.sample())
    return prepared._replace(batch=sharding.put_batch(prepared.batch, mesh))

  return PrefetchIterator(produce, depth=exp.prefetch, stop=stop)


def _json_default(value):
  if isinstance(value, tuple):
    return list(value)
  raise TypeError(f"not JSON serialisable: {value!r}")


def write_json(path: str, payload: Dict) -> None:
  with open(path, "w") as f:
    json.dump(payload, f, indent=2, default=_json_default)
    f.write("\n")


def run(exp: ExperimentConfig, agent_cfg) -> Dict[str, Any]:
  """Trains `exp.agent` on `exp.env` for `exp.steps` env steps; returns the summary."""
  distributed.initialize(exp.coordinator_address, exp.num_processes, exp.process_id)
  parts = build_agent_parts(exp.agent, exp.env, agent_cfg)
  agent, networks, replay_spec = parts.agent, parts.networks, parts.replay_spec
  mesh = sharding.make_mesh(exp.learner_devices)
  sharding.check_batch_size(agent_cfg.batch_size, mesh)
  threshold = success_threshold(exp)
  env = envs.make_vector_env(exp.env, exp.num_envs, exp.local_seed)

  run_dir = exp.run_dir or exp.default_run_dir()
  os.makedirs(run_dir, exist_ok=True)
  write_json(os.path.join(run_dir, "config.json"),
             {"experiment": dataclasses.asdict(exp), "agent": dataclasses.asdict(agent_cfg)})

  learner_key, actor_key, _ = jax.random.split(jax.random.PRNGKey(exp.seed), 3)
  actor_key = jax.random.fold_in(actor_key, exp.process_id)
  # Each process feeds its own slice of the global batch from its own replay.
  local_batch_size = agent_cfg.batch_size // jax.process_count()
  replay = make_replay(parts, agent_cfg, exp, local_batch_size, mesh)
  learner = Learner(agent.make_learner(networks, agent_cfg), learner_key, replay.batches,
                    replay.update_priorities if replay_spec.prioritized else None, mesh=mesh)
  block_writer = make_block_writer(replay_spec, replay.writer)
  adder = make_adder(replay_spec, exp.num_envs, agent_cfg)
  actor = Actor(env, LocalPolicy(agent.make_policy(networks, agent_cfg), VariableClient(learner), actor_key),
                adder=adder, sink=block_writer.add)
  evaluator = Evaluator(exp.env, agent.make_policy(networks, agent_cfg, evaluation=True),
                        exp.eval_episodes, seed=exp.seed + 10_000)

  tb = make_tensorboard(run_dir)
  loggers = {role: MetricsLogger(run_dir, role, tb) for role in ("actor", "learner", "evaluator")}
  progress = Progress(f"{exp.agent} {exp.env} s{exp.seed}", exp.progress_seconds)
  samples_per_call = exp.updates_per_call * local_batch_size

  def calls_owed(written: int) -> int:
    """Learner calls due once `written` rows are in replay: one per batch of sequences
    (on-policy), or enough to keep transitions sampled at samples_per_insert x inserted."""
    if replay_spec.sequences:
      return written // local_batch_size
    if written < replay_spec.min_size:
      return 0
    return int((written - replay_spec.min_size) * replay_spec.samples_per_insert // samples_per_call) + 1

  start = time.monotonic()
  episodes_total = 0
  recent_returns: List[float] = []
  recent_lengths: List[int] = []
  eval_history: List[float] = []
  steps_to_threshold: Optional[int] = None
  learner_metrics: Dict[str, float] = {}
  next_log, next_eval = exp.log_every, exp.eval_every
  last_log = (start, 0, 0)  # time, actor steps, learner steps

  last_eval_steps = -1

  def evaluate():
    nonlocal steps_to_threshold, last_eval_steps
    last_eval_steps = actor.env_steps
    returns = evaluator.run(learner.get_variables()[0])
    mean_return = float(np.mean(returns))
    eval_history.append(mean_return)
    if steps_to_threshold is None and threshold is not None and mean_return >= threshold:
      steps_to_threshold = actor.env_steps
    loggers["evaluator"].write({"actor_steps": actor.env_steps, "learner_steps": learner.steps,
                                "eval_return": mean_return, "eval_return_std": float(np.std(returns)),
                                "eval_return_min": float(np.min(returns)),
                                "eval_return_max": float(np.max(returns)),
                                "wall_seconds": time.monotonic() - start})

  try:
    while actor.env_steps < exp.steps:
      stats = actor.step()
      episodes_total += len(stats.returns)
      recent_returns += stats.returns
      recent_lengths += stats.lengths

      while learner.version < calls_owed(block_writer.transitions_written):
        learner_metrics = learner.step()

      if actor.env_steps >= next_eval:
        next_eval += exp.eval_every
        evaluate()
        if exp.stop_at_threshold and steps_to_threshold is not None:
          break

      if actor.env_steps >= next_log:
        next_log += exp.log_every
        now = time.monotonic()
        dt = max(now - last_log[0], 1e-9)
        actor_sps = (actor.env_steps - last_log[1]) / dt
        updates_ps = (learner.steps - last_log[2]) / dt
        last_log = (now, actor.env_steps, learner.steps)
        loggers["actor"].write({"actor_steps": actor.env_steps, "episodes": episodes_total,
                                "episode_return": float(np.mean(recent_returns)) if recent_returns else float("nan"),
                                "episode_length": float(np.mean(recent_lengths)) if recent_lengths else float("nan"),
                                "steps_per_second": actor_sps, "wall_seconds": now - start})
        if learner_metrics:
          loggers["learner"].write({"actor_steps": actor.env_steps, "learner_steps": learner.steps,
                                    **learner_metrics, "updates_per_second": updates_ps,
                                    "wall_seconds": now - start})
        episode_text = f"{np.mean(recent_returns):.1f}" if recent_returns else "-"
        eval_text = f"{eval_history[-1]:.1f} (best {max(eval_history):.1f})" if eval_history else "-"
        progress.maybe_print(f"steps {actor.env_steps}/{exp.steps} | {actor_sps:.0f} steps/s | "
                             f"updates {learner.steps} ({updates_ps:.0f}/s) | episode return {episode_text} | "
                             f"eval {eval_text}")
        recent_returns, recent_lengths = [], []

    if last_eval_steps != actor.env_steps:  # always finish on an evaluation of the final parameters
      evaluate()
  finally:
    replay.close()
    evaluator.close()
    env.close()
    for logger in loggers.values():
      logger.close()
    tb.close()

  wall = time.monotonic() - start
  summary = {
      "agent": exp.agent, "env": exp.env, "seed": exp.seed, "replay": replay.kind,
      "actor_steps": actor.env_steps, "learner_steps": learner.steps,
      "wall_seconds": round(wall, 3),
      "eval_return": eval_history[-1], "best_eval_return": max(eval_history),
      "reward_threshold": threshold, "steps_to_threshold": steps_to_threshold,
      "learner_devices": int(mesh.devices.size), "learner_processes": jax.process_count(),
      "params_digest": params_digest(learner.get_variables()[0]),
  }
  write_json(os.path.join(run_dir, "summary.json"), summary)
  plots.plot_learning_curve(run_dir, f"{exp.agent} on {exp.env}, seed {exp.seed}", threshold)
  progress.maybe_print(f"done: {actor.env_steps} steps in {wall:.1f}s | eval {summary['eval_return']:.1f} "
                       f"(best {summary['best_eval_return']:.1f}) | steps to threshold {steps_to_threshold} | "
                       f"{run_dir}", force=True)
  summary["run_dir"] = run_dir
  return summary
