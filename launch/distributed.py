"""The distributed topology as a Launchpad program, and how to run it.

  counter   replay (ReverbNode)   learner (variable source)
  actor x N --insert--> replay --sample--> learner
  actor --obs bytes--> inference server x M (inference=server) --params-- learner
  evaluator: evaluates, prints progress, writes summary.json, stops the program at the budget
"""

from jrl import compat

compat.import_jax_probability()  # before anything imports TensorFlow

import dataclasses
import functools
import glob
import json
import os
import threading
from typing import Any, Dict

import launchpad as lp
from launchpad.launch.run_locally import launch_local_output_to_files as output_to_files

from jrl.errors import ConfigError
from jrl.experiment.builder import build_agent_parts
from jrl.experiment.config import ExperimentConfig
from jrl.experiment.runner import write_json
from launch import nodes


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
                                                       server_id)))
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


# When a node dies its peers often fail next (their calls to it break); report the
# node whose failure explains the others: services before their clients.
FAILURE_BLAME_ORDER = ("learner", "replay", "inference", "counter", "evaluator", "actor")


def failed_node_report(log_dir: str, max_lines: int = 25) -> str:
  """The traceback of the failed node that explains the others: which node, and its error."""
  def blame(path):
    group = os.path.relpath(path, log_dir).split(os.sep)[0]
    return (FAILURE_BLAME_ORDER.index(group) if group in FAILURE_BLAME_ORDER else len(FAILURE_BLAME_ORDER),
            os.path.getmtime(path))

  logs = [p for p in glob.glob(os.path.join(log_dir, "**", "*"), recursive=True) if os.path.isfile(p)]
  for path in sorted(logs, key=blame):
    with open(path, errors="replace") as f:
      lines = f.read().splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback")]
    if starts:
      node = os.path.relpath(path, log_dir)
      return f"node {node} failed:\n" + "\n".join(lines[starts[-1]:][-max_lines:])
  return "a node exited with an error but left no traceback in " + log_dir


def run_distributed(exp: ExperimentConfig, agent_cfg) -> Dict[str, Any]:
  """Launches the program and waits for it; raises RuntimeError naming the node that failed."""
  build_agent_parts(exp.agent, exp.env, agent_cfg)  # config errors surface here, before any process starts
  if exp.inference == "server" and exp.num_inference_servers > exp.num_actors:
    raise ConfigError("num_inference_servers", f"must be <= num_actors ({exp.num_actors})")
  run_dir = os.path.abspath(exp.run_dir or exp.default_run_dir())
  log_dir = os.path.join(run_dir, "logs")
  os.makedirs(log_dir, exist_ok=True)
  write_json(os.path.join(run_dir, "config.json"),
             {"experiment": dataclasses.asdict(exp), "agent": dataclasses.asdict(agent_cfg)})
  program = build_program(exp, agent_cfg, run_dir)
  if exp.lp_launch_type == "local_mp":
    # One process per node, each node's output in logs/<group>/<index>; exit codes are watched.
    output_to_files._LOGGING_DIR = log_dir  # read at import time from LAUNCHPAD_LOGGING_DIR otherwise
    manager = lp.launch(program, launch_type=lp.LaunchType.LOCAL_MULTI_PROCESSING, terminal="output_to_files")
    echo = _ProgressEcho(os.path.join(log_dir, "evaluator", "0"))
  else:
    manager = lp.launch(program, launch_type=lp.LaunchType.LOCAL_MULTI_THREADING, serialize_py_nodes=False)
    echo = None
  if echo:
    echo.start()
  try:
    manager.wait()  # raises on the first node failure, after stopping the others
  except RuntimeError as e:
    report = failed_node_report(log_dir) if exp.lp_launch_type == "local_mp" else str(e)
    raise RuntimeError(report) from e
  finally:
    if echo:
      echo.stop()
  summary_path = os.path.join(run_dir, "summary.json")
  if not os.path.exists(summary_path):
    raise RuntimeError("the program stopped before the evaluator wrote summary.json")
  with open(summary_path) as f:
    summary = json.load(f)
  summary["run_dir"] = run_dir
  return summary
