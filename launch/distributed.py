"""The distributed topology as a Launchpad program, and how to run it.

  counter   replay (ReverbNode)   learner (variable source)
  actor x N --insert--> replay --sample--> learner
  actor --obs bytes--> inference server x M (inference=server) --params-- learner
  evaluator: evaluates, prints progress, writes summary.json, stops the program at the budget

Under local_mp each node is a process of launch/supervisor.py: actors, evaluator
and inference servers are restarted when they fail (up to max_restarts each),
any other failure stops the program; servers listen on JRL_BIND_ADDRESS
(127.0.0.1 by default, launch/loopback.py).
"""

from jrl import compat

compat.import_jax_probability()  # before anything imports TensorFlow

import dataclasses
import functools
import json
import os
import threading
from typing import Any, Dict

import launchpad as lp

from jrl.errors import ConfigError
from jrl.experiment.builder import build_agent_parts
from jrl.experiment.config import ExperimentConfig
from jrl.experiment.runner import write_json
from launch import loopback, nodes, supervisor

# Nodes that hold no state others depend on: restarted when they fail.
RESTARTABLE_GROUPS = ("actor", "evaluator", "inference")


def build_program(exp: ExperimentConfig, agent_cfg, run_dir: str) -> lp.Program:
  program = lp.Program("jrl")
  with program.group("counter"):
    counter = program.add_node(lp.CourierNode(nodes.Counter))
  with program.group("replay"):
    replay = program.add_node(lp.ReverbNode(functools.partial(nodes.make_replay_tables, exp, agent_cfg)))
  with program.group("learner"):
    learner = program.add_node(lp.CourierNode(nodes.LearnerNode, exp, agent_cfg, replay, counter, run_dir))
  servers = []
  if exp.inference == "server":
    with program.group("inference"):
      for server_id in range(exp.num_inference_servers):
        assigned = len(range(server_id, exp.num_actors, exp.num_inference_servers))
        servers.append(program.add_node(lp.CourierNode(nodes.InferenceNode, exp, agent_cfg, learner, assigned,
                                                       server_id, counter)))
  with program.group("actor"):
    for actor_id in range(exp.num_actors):
      server = servers[actor_id % len(servers)] if servers else None
      program.add_node(lp.CourierNode(nodes.ActorNode, actor_id, exp, agent_cfg, replay, learner, counter,
                                      server, run_dir))
  with program.group("evaluator"):
    program.add_node(lp.CourierNode(nodes.EvaluatorNode, exp, agent_cfg, learner, counter, servers, run_dir,
                                    replay))
  return program


class _ProgressEcho(threading.Thread):
  """Echoes the evaluator's progress lines from its log file to this terminal."""

  def __init__(self, path: str):
    super().__init__(daemon=True)
    self._path, self._stop = path, threading.Event()

  def run(self):
    position = 0
    while not self._stop.wait(0.5):
      if not os.path.exists(self._path):
        continue
      with open(self._path, errors="replace") as f:
        f.seek(position)
        text = f.read()
        position = f.tell()
      for line in text.splitlines():
        if line.startswith("[") and "] steps " in line:
          print(line, flush=True)

  def stop(self):
    self._stop.set()


def run_distributed(exp: ExperimentConfig, agent_cfg) -> Dict[str, Any]:
  """Launches the program and waits for it; raises RuntimeError naming the node that failed."""
  build_agent_parts(exp.agent, exp.env, agent_cfg)  # config errors surface here, before any process starts
  if exp.inference == "server" and exp.num_inference_servers > exp.num_actors:
    raise ConfigError("num_inference_servers", f"must be <= num_actors ({exp.num_actors})")
  node_env = loopback.node_env(loopback.bind_address()) if exp.lp_launch_type == "local_mp" else {}
  run_dir = os.path.abspath(exp.run_dir or exp.default_run_dir())
  log_dir = os.path.join(run_dir, "logs")
  os.makedirs(log_dir, exist_ok=True)
  write_json(os.path.join(run_dir, "config.json"),
             {"experiment": dataclasses.asdict(exp), "agent": dataclasses.asdict(agent_cfg)})
  program = build_program(exp, agent_cfg, run_dir)
  if exp.lp_launch_type == "local_mp":
    policy = supervisor.RestartPolicy(RESTARTABLE_GROUPS, exp.max_restarts, exp.restart_backoff_seconds)
    manager = supervisor.launch(program, run_dir, policy, node_env)
    echo = _ProgressEcho(os.path.join(log_dir, "evaluator", "0"))
    echo.start()
  else:
    manager = lp.launch(program, launch_type=lp.LaunchType.LOCAL_MULTI_THREADING, serialize_py_nodes=False)
    echo = None
  try:
    manager.wait()  # local_mp: until every process has ended; raises NodeFailure (a RuntimeError) with the report
  finally:
    if echo:
      echo.stop()
  restarts = dict(getattr(manager, "restarts", {}))
  summary_path = os.path.join(run_dir, "summary.json")
  if not os.path.exists(summary_path):
    raise RuntimeError("the program stopped before the evaluator wrote summary.json")
  with open(summary_path) as f:
    summary = json.load(f)
  summary.update(restarts=restarts, restarts_total=sum(restarts.values()))
  write_json(summary_path, summary)
  summary["run_dir"] = run_dir
  return summary
