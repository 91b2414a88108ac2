"""The program's central batched inference server: the agent's pure policy over the actors' requests
(SEED RL's), its recurrent state kept here per actor and env."""

import threading
from typing import Dict

from jrl.actors.inference import BatchedInference
from jrl.actors.variables import VariableClient
from jrl.experiment import report
from jrl.experiment.builder import build_agent_parts
from jrl.experiment.config import ExperimentConfig
from jrl.run.distributed.node_io import (Session, TimesFile, continued_exploration, continues, exit_soon_after_stop,
                                         incarnation, log, node_seeds)
from jrl.run.distributed.rpc import AsyncRemoteVariables, wait_unless_stopped


class InferenceNode:
  """Central batched inference over the agent's pure policy; `infer(actor_id, obs_bytes) -> bytes`."""

  def __init__(self, exp: ExperimentConfig, agent_cfg, learner, num_actors: int, server_id: int = 0,
               counter=None, session: Session = Session(""), *, engine):
    self._exp, self._cfg, self._engine = exp, agent_cfg, engine
    self._learner = engine.handle(learner)
    self._counter = engine.handle(counter) if counter is not None else None
    self._num_actors, self._id, self._session = num_actors, server_id, session
    self._ready = threading.Event()

  def infer(self, actor_id: int, obs_bytes: bytes) -> bytes:
    self._ready.wait()
    return self._core.infer(actor_id, obs_bytes)

  def stats(self) -> Dict[str, float]:
    self._ready.wait()
    return self._core.stats()

  def run(self):
    stop = self._engine.stop_event()
    exit_soon_after_stop(stop)
    exp, cfg = self._exp, self._cfg
    parts = build_agent_parts(exp.agent, exp.env, cfg)
    # Refreshed every `variable_update_period` batches, like an actor's every so many steps: each
    # refresh is an RPC to the learner, and a device copy when the version changed.
    variables = VariableClient(AsyncRemoteVariables(self._learner, stop), exp.variable_update_period)
    _, key = node_seeds(exp.seed, "inference", self._id, self._session.number)
    self._core = BatchedInference(parts.agent.make_policy(parts.networks, cfg), variables, key, self._num_actors,
                                  exp.num_envs, parts.env_spec.observation_shape, exp.inference_timeout_ms,
                                  obs_dtype=parts.env_spec.observation_dtype)
    if continues(self._session) and self._counter is not None:
      counts = wait_unless_stopped(self._counter.future("get_counts"), stop)
      self._core.restore(continued_exploration(self._core.state(), counts.get("actor_steps", 0.0) / exp.num_actors))
    self._ready.set()
    log(f"inference server {self._id} serving (incarnation {incarnation()})")
    name, core = f"inference/{self._id}", self._core
    times = TimesFile(self._session, name, lambda: {
        "nodes": [core.timer.node(name, "inference").as_dict()],
        "batch_sizes": {str(k): v for k, v in sorted(core.batch_size_counts.items())}})
    times.write_every(stop)
    report.watch_compiles(core.timer)
    try:
      core.serve(stop)
    finally:
      report.unwatch_compiles()
      times.write()
