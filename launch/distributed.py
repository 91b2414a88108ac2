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

import csv
import dataclasses
import functools
import glob
import json
import os
import threading
from typing import Any, Dict, Optional, Tuple

import launchpad as lp
import portpicker

from jrl.errors import ConfigError
from jrl.experiment.builder import build_agent_parts
from jrl.experiment.checkpoint import Checkpointer, checkpoint_to_resume
from jrl.experiment.config import ExperimentConfig
from jrl.experiment.files import CONFIG_FILE, SUMMARY_FILE, check_run_dir_target, config_payload, write_json
from jrl.experiment.logging import cut_rows
from jrl.experiment.runner import REVERB_REPLAY_DIR
from launch import cluster, loopback, nodes, supervisor

# Nodes that hold no state others depend on: restarted when they fail.
RESTARTABLE_GROUPS = ("actor", "evaluator", "inference")


def build_program(exp: ExperimentConfig, agent_cfg, session: nodes.Session,
                  counter_state: Optional[Dict[str, Any]] = None) -> lp.Program:
  """The topology; a resumed session starts the counter, learner and replay from its checkpoint."""
  replay_restore = (os.path.join(session.checkpoint, "replay", REVERB_REPLAY_DIR) if session.checkpoint else None)
  program = lp.Program("jrl")
  with program.group("counter"):
    counter = program.add_node(lp.CourierNode(nodes.Counter, counter_state))
  with program.group("replay"):
    replay = program.add_node(lp.ReverbNode(functools.partial(nodes.make_replay_tables, exp, agent_cfg),
                                            functools.partial(nodes.reverb_checkpointer, session.run_dir,
                                                              replay_restore)))
  with program.group("learner"):
    learners = [program.add_node(lp.CourierNode(nodes.LearnerNode, exp, agent_cfg, replay, counter, session, i))
                for i in range(exp.num_processes)]
  learner = learners[0]  # serves the parameters
  servers = []
  if exp.inference == "server":
    with program.group("inference"):
      for server_id in range(exp.num_inference_servers):
        assigned = len(range(server_id, exp.num_actors, exp.num_inference_servers))
        servers.append(program.add_node(lp.CourierNode(nodes.InferenceNode, exp, agent_cfg, learner, assigned,
                                                       server_id, counter, session)))
  with program.group("actor"):
    for actor_id in range(exp.num_actors):
      server = servers[actor_id % len(servers)] if servers else None
      program.add_node(lp.CourierNode(nodes.ActorNode, actor_id, exp, agent_cfg, replay, learner, counter,
                                      server, session))
  with program.group("evaluator"):
    program.add_node(lp.CourierNode(nodes.EvaluatorNode, exp, agent_cfg, learner, counter, servers, session,
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


def prepare_session(exp: ExperimentConfig, agent_cfg) -> Tuple[nodes.Session, Optional[Dict[str, Any]]]:
  """The run directory of a new run (created, config.json written), or the checkpoint a
  resumed one continues from (its metrics cut back to it); ConfigError for bad input."""
  if not exp.resume:
    run_dir = os.path.abspath(exp.run_dir or exp.default_run_dir())
    check_run_dir_target(run_dir)
    os.makedirs(os.path.join(run_dir, "logs"), exist_ok=True)
    write_json(os.path.join(run_dir, CONFIG_FILE), config_payload(exp, agent_cfg))
    return nodes.Session(run_dir), None
  run_dir = os.path.abspath(exp.resume)
  info = checkpoint_to_resume(run_dir, exp.steps)
  if info is None:
    return nodes.Session(run_dir), None
  saved = Checkpointer.read_run_state(info)
  counts = saved["counter"]["counts"]
  Checkpointer(run_dir).clean_partial()
  metrics = os.path.join(run_dir, "metrics")
  for path in glob.glob(os.path.join(metrics, "actor*.csv")):
    cut_rows(path, "total_actor_steps", counts.get("actor_steps", 0))
  for path in glob.glob(os.path.join(metrics, "learner*.csv")):
    cut_rows(path, "learner_steps", saved["learner_steps"])
  cut_rows(os.path.join(metrics, "evaluator.csv"), "actor_steps", counts.get("actor_steps", 0))
  return nodes.Session(run_dir, saved.get("sessions", 0) + 1, info.path), saved["counter"]


def restart_counts(run_dir: str) -> Dict[str, int]:
  """Restarts per node over the whole run, from metrics/restarts.csv (written by every host's supervisor)."""
  path = os.path.join(run_dir, "metrics", "restarts.csv")
  counts: Dict[str, int] = {}
  if os.path.exists(path):
    with open(path, newline="") as f:
      for row in csv.DictReader(f):
        counts[row["node"]] = counts.get(row["node"], 0) + 1
  return counts


def run_distributed(exp: ExperimentConfig, agent_cfg) -> Dict[str, Any]:
  """Launches the program (this host, or placed on several) and waits for it; RuntimeError naming
  the node that failed."""
  build_agent_parts(exp.agent, exp.env, agent_cfg)  # config errors surface here, before any process starts
  if exp.inference == "server" and exp.num_inference_servers > exp.num_actors:
    raise ConfigError("num_inference_servers", f"must be <= num_actors ({exp.num_actors})")
  placement = cluster.resolve_placement(exp) if exp.launcher != "local" else None
  node_env = loopback.node_env(loopback.bind_address()) if exp.launcher == "local" and exp.lp_launch_type == "local_mp" else {}
  session, counter_state = prepare_session(exp, agent_cfg)
  run_dir, log_dir = session.run_dir, os.path.join(session.run_dir, "logs")
  if exp.num_processes > 1 and not exp.coordinator_address:
    host = placement.host_of("learner", 0).address if placement else "127.0.0.1"
    exp = dataclasses.replace(exp, coordinator_address=f"{host}:{portpicker.pick_unused_port()}")
  program = build_program(exp, agent_cfg, session, counter_state)
  policy = supervisor.RestartPolicy(RESTARTABLE_GROUPS, exp.max_restarts, exp.restart_backoff_seconds)
  echo = _ProgressEcho(os.path.join(log_dir, "evaluator", "0"))
  if placement is not None:
    echo.start()
    try:
      cluster.launch_on_hosts(exp, program, run_dir, placement, dataclasses.asdict(policy))
    finally:
      echo.stop()
  elif exp.lp_launch_type == "local_mp":
    manager = supervisor.launch(program, run_dir, policy, node_env)
    echo.start()
    try:
      manager.wait()  # until every process has ended; raises NodeFailure (a RuntimeError) with the report
    finally:
      echo.stop()
  else:
    lp.launch(program, launch_type=lp.LaunchType.LOCAL_MULTI_THREADING, serialize_py_nodes=False).wait()
  summary_path = os.path.join(run_dir, SUMMARY_FILE)
  if not os.path.exists(summary_path):
    raise RuntimeError("the program stopped before the evaluator wrote summary.json")
  with open(summary_path) as f:
    summary = json.load(f)
  restarts = restart_counts(run_dir)
  summary.update(restarts=restarts, restarts_total=sum(restarts.values()))
  write_json(summary_path, summary)
  summary["run_dir"] = run_dir
  return summary
