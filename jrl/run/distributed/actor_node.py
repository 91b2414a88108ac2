"""The program's actor node: steps `num_envs` envs with the agent's policy (its own, or a central
inference server's) and writes the agent's replay items."""

import time
from typing import Dict, List

import numpy as np

from jrl.actors.inference import InferenceClient
from jrl.actors.variables import VariableClient
from jrl.errors import Stopped
from jrl.experiment import report
from jrl.experiment.builder import build_acting_parts, make_actor
from jrl.experiment.config import ExperimentConfig
from jrl.replay.adders import make_block_writer
from jrl.run.distributed import faults
from jrl.run.distributed.counter import report_share
from jrl.run.distributed.node_io import (LOG_SECONDS, Session, TimesFile, continued_exploration, continues,
                                         exit_soon_after_stop, host_name, incarnation, log, metrics_logger,
                                         node_seeds)
from jrl.run.distributed.rpc import AsyncRemoteVariables, ServiceCall, wait_unless_stopped


class ActorNode:
  """Steps `num_envs` envs and writes the agent's replay items (transitions or trajectories)."""

  def __init__(self, actor_id: int, exp: ExperimentConfig, agent_cfg, replay, learner, counter,
               inference=None, session: Session = Session(""), *, engine):
    self._id, self._exp, self._cfg, self._engine = actor_id, exp, agent_cfg, engine
    self._replay, self._learner, self._counter = engine.replay(replay), engine.handle(learner), engine.handle(counter)
    self._inference = engine.handle(inference) if inference is not None else None
    self._session = session
    self._faults = faults.from_environment()

  def run(self):
    self._stop = stop = self._engine.stop_event()
    exit_soon_after_stop(stop)
    exp, cfg = self._exp, self._cfg
    parts, asynchronous = build_acting_parts(exp.agent, exp.env, cfg)
    # A local policy on images computes its next actions while the adder and the inserts run.
    ahead = asynchronous and self._inference is None
    seed, key = node_seeds(exp.seed, "actor", self._id, self._session.number)
    timer = report.PhaseTimer()
    if self._inference is None:
      variables = VariableClient(AsyncRemoteVariables(self._learner, stop), exp.variable_update_period)
      policy = (variables, key, timer)  # the agent's policy, made in this process by make_actor
    else:
      server_id = self._id % exp.num_inference_servers
      infer = ServiceCall(self._inference, "infer", f"inference server inference/{server_id} "
                          f"({self._inference.address})", exp.service_deadline_seconds, stop)
      policy = InferenceClient(infer, self._id // exp.num_inference_servers, timer=timer)
    writer = self._replay.writer(parts.replay_spec, exp.num_envs, stop, exp.service_deadline_seconds, log, timer)
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
    self._engine.wait_for_stop()

  def _steps_per_actor(self) -> float:
    counts = wait_unless_stopped(self._counter.future("get_counts"), self._stop)
    return counts.get("actor_steps", 0.0) / self._exp.num_actors

  def _act(self, actor, policy, writer, logger):
    exp, stop = self._exp, self._stop
    returns: List[float] = []
    last_time, last_steps = time.monotonic(), 0  # at the last report
    counted = wait_unless_stopped(self._counter.future("get_counts"), stop).get("actor_steps", 0.0)
    while not stop.is_set():
      returns += actor.step().returns
      self._faults.check_actor(self._id, actor.env_steps)
      now = time.monotonic()
      if now - last_time >= LOG_SECONDS or \
          actor.env_steps - last_steps >= report_share(exp.steps, counted, exp.num_actors):
        counts = wait_unless_stopped(self._counter.future("increment", actor_steps=actor.env_steps - last_steps,
                                                          episodes=len(returns)), stop)
        lag = wait_unless_stopped(self._learner.future("version"), stop) - policy.version
        self._counter.future("increment", policy_lag_sum=lag, policy_lag_count=1)
        self._lags[str(lag)] = self._lags.get(str(lag), 0) + 1
        self._times.maybe_write()
        logger.write({"actor_steps": actor.env_steps, "total_actor_steps": counts["actor_steps"],
                      "episode_return": float(np.mean(returns)) if returns else float("nan"),
                      "steps_per_second": (actor.env_steps - last_steps) / (now - last_time),
                      "policy_version": policy.version, "policy_lag": lag,
                      "items_inserted": writer.items_inserted, "host": host_name()})
        last_time, last_steps, returns = now, actor.env_steps, []
        counted = counts["actor_steps"]
        if wait_unless_stopped(self._counter.future("over"), stop):  # the budget is the counter's to decide
          break
