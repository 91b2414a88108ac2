"""Launching the distributed program (`jrl.run.distributed.program`): on this host, or placed on several.

  make_program(exp, agent_cfg)  -> BuiltProgram: the Launchpad program (add nodes of your own), its
                                   nodes' handles, the session; nothing launched yet
  launch_program(built)         -> the run's summary, after the program ended and its report was written

Under local_mp each node is a process of launch/supervisor.py: actors, the driver
and inference servers are restarted when they fail (up to max_restarts each),
any other failure stops the program; servers listen on JRL_BIND_ADDRESS
(127.0.0.1 by default, launch/loopback.py). `--launcher slurm` / `template` place it on several
hosts (launch/cluster.py).
"""

from jrl import compat

compat.import_jax_probability()  # before anything imports TensorFlow

import dataclasses
import functools
import json
import os
import sys
import threading
from typing import Any, Dict, Mapping, Optional

import launchpad as lp

from jrl import accelerators
from jrl.errors import ConfigError
from jrl.experiment.builder import build_agent_parts
from jrl.experiment.checkpoint import RunWritesFailed
from jrl.experiment.config import ExperimentConfig
from jrl.experiment.files import REPORT_FILE, SUMMARY_FILE, resolve_paths
from jrl.run.core import add_to_summary
from jrl.run.distributed import liveness, multihost
from jrl.run.distributed.node_io import Session
from jrl.run.distributed.program import ProgramNodes, build_program
from jrl.run.distributed.program_report import run_report
from jrl.run.distributed.sessions import ProgramStopped, prepare_session, restart_counts
from launch import cluster, loopback, supervisor
from launch.progress import ProgressEcho

# Nodes that hold no state others depend on: restarted when they fail (the driver node keeps its
# books in the counter).
RESTARTABLE_GROUPS = ("actor", "evaluator", "inference")


STOP_CHECKPOINT_SECONDS = 60.0  # the most a stop from outside waits for the learner's checkpoint


def checkpoint_before_stop(built: "BuiltProgram") -> None:
  """At Ctrl-C or SIGTERM to the launcher (local_mp), before the nodes are stopped: the lead
  learner writes a checkpoint (learner, counters, replay), as the periodic ones, waited for at most
  STOP_CHECKPOINT_SECONDS. Not when the run has ended (its driver node wrote the summary after the
  final checkpoint and stopped the program)."""
  if os.path.exists(os.path.join(built.run_dir, SUMMARY_FILE)):
    return
  print(f"[launcher] stopping: the learner writes a checkpoint first (at most {STOP_CHECKPOINT_SECONDS:.0f} s; "
        "the same signal again stops at once)", flush=True)
  written = []
  call = threading.Thread(target=lambda: written.append(built.nodes.learner.dereference().checkpoint()),
                          name="checkpoint-before-stop", daemon=True)
  call.start()
  call.join(STOP_CHECKPOINT_SECONDS)
  if not written:
    raise TimeoutError(f"the learner wrote no checkpoint within {STOP_CHECKPOINT_SECONDS:.0f} s")
  path, failed_policy = written[0]
  print(f"[launcher] checkpoint {os.path.relpath(path, built.run_dir)} written; stopping the program", flush=True)
  if failed_policy is not None:
    print(f"[checkpoint] {failed_policy}", file=sys.stderr, flush=True)


@dataclasses.dataclass
class BuiltProgram:
  """A distributed run ready to launch: its Launchpad program (add nodes of your own to it), the
  handles of jrl's nodes, and what `launch_program` needs to run it as `launch.train
  --distributed` does."""
  program: lp.Program
  nodes: ProgramNodes
  exp: ExperimentConfig
  agent_cfg: Any
  session: Session
  placement: Optional[Any]                # jrl.run.distributed.placement.Placement; None for a launch on this host
  node_env: Dict[str, str]                # added to each node's environment (local_mp)
  # role -> its processes' devices and environments (jrl.accelerators.place_roles; local_mp on this host)
  roles: Optional[Mapping[str, Any]] = None

  @property
  def node_envs(self) -> Dict[str, Dict[str, str]]:
    """node name ("learner/0") -> what its role's placement adds to its environment."""
    return {f"{role}/{p.index}": dict(p.env) for role, processes in (self.roles or {}).items() for p in processes}

  @property
  def run_dir(self) -> str:
    return self.session.run_dir


def make_program(exp: ExperimentConfig, agent_cfg) -> BuiltProgram:
  """The Launchpad program `launch.train --distributed` runs for `exp` (a new run directory is
  created and its config written; `exp.resume` continues one). ConfigError for bad input,
  before anything is written or launched.

  Launch it with `launch_program` (jrl's launchers: supervised local_mp with restarts,
  local_mt, --launcher slurm / template; the run report), or with Launchpad's own
  `lp.launch(built.program, launch_type="local_mp")` (no restarts, no report)."""
  exp = resolve_paths(exp)
  build_agent_parts(exp.agent, exp.env, agent_cfg)  # config errors surface here, before any process starts
  if exp.inference == "server" and exp.num_inference_servers > exp.num_actors:
    raise ConfigError("num_inference_servers", f"must be <= num_actors ({exp.num_actors})")
  placement = cluster.resolve_placement(exp) if exp.launcher != "local" else None
  node_env = loopback.node_env(loopback.bind_address()) if exp.launcher == "local" and exp.lp_launch_type == "local_mp" else {}
  roles = place_on_this_host(exp) if exp.launcher == "local" and exp.lp_launch_type == "local_mp" else None
  session, counter_state = prepare_session(exp, agent_cfg)
  if exp.num_processes > 1 and not exp.coordinator_address:
    host = placement.host_of("learner", 0).address if placement else "127.0.0.1"
    exp = dataclasses.replace(exp, coordinator_address=f"{host}:{multihost.pick_port()}")
  program, handles = build_program(exp, agent_cfg, session, counter_state)
  return BuiltProgram(program, handles, exp, agent_cfg, session, placement, node_env, roles)


def place_on_this_host(exp: ExperimentConfig) -> Dict[str, Any]:
  """Each role's devices and environment on this host (jrl.accelerators): the learner and inference
  servers on its GPUs, the rest on the CPU; nothing changes on a host without GPUs. ConfigError
  (before anything is written): more --learner_devices than the host's GPUs, JAX_PLATFORMS asking
  for a GPU JAX does not see."""
  servers = exp.num_inference_servers if exp.inference == "server" else 0
  return accelerators.place_roles(accelerators.host_accelerators(), exp.learner_devices, servers, exp.num_actors,
                                  learners=exp.num_processes, jax_platforms=os.environ.get("JAX_PLATFORMS", ""))


def run_distributed(exp: ExperimentConfig, agent_cfg) -> Dict[str, Any]:
  """Launches the program (this host, or placed on several) and waits for it; RuntimeError naming
  the node that failed."""
  return launch_program(make_program(exp, agent_cfg))


def launch_program(built: BuiltProgram) -> Dict[str, Any]:
  """Launches a built program with jrl's launcher for its experiment (`exp.launcher`,
  `exp.lp_launch_type`), waits for it, writes the run report; the run's summary. RuntimeError
  naming the node that failed; RunWritesFailed (after the report) when a checkpoint or policy
  snapshot was not written."""
  program, exp, agent_cfg, session = built.program, built.exp, built.agent_cfg, built.session
  placement, node_env = built.placement, built.node_env
  run_dir, log_dir = session.run_dir, os.path.join(session.run_dir, "logs")
  policy = supervisor.RestartPolicy(RESTARTABLE_GROUPS, exp.max_restarts, exp.restart_backoff_seconds)
  echo = ProgressEcho(os.path.join(log_dir, "evaluator", "0"))
  lost: Dict[str, Any] = {}
  if placement is not None:
    echo.start()
    try:
      lost = cluster.launch_on_hosts(exp, program, run_dir, placement, dataclasses.asdict(policy))
    finally:
      echo.stop()
  elif exp.lp_launch_type == "local_mp":
    manager = supervisor.launch(program, run_dir, policy, node_env, built.node_envs)
    echo.start()
    try:
      manager.before_stop = functools.partial(checkpoint_before_stop, built)
      manager.wait()  # until every process has ended; raises NodeFailure (a RuntimeError) with the report
    finally:
      echo.stop()
  else:
    lp.launch(program, launch_type=lp.LaunchType.LOCAL_MULTI_THREADING, serialize_py_nodes=False).wait()
  summary_path = os.path.join(run_dir, SUMMARY_FILE)
  if not os.path.exists(summary_path):  # no node failed (that raises above): stopped from outside (Ctrl-C)
    raise ProgramStopped(run_dir, manager.stop_signal if exp.lp_launch_type == "local_mp" and placement is None
                         else None)
  with open(summary_path) as f:
    summary = json.load(f)
  restarts = restart_counts(run_dir)
  # One machine's cores are the budget of a local launch; hosts of a cluster each have theirs.
  result, fields, details = run_report(run_dir, session, exp, agent_cfg, summary,
                                       os.cpu_count() if placement is None else None, restarts=restarts,
                                       restarts_total=sum(restarts.values()), lost_hosts=sorted(lost),
                                       lost_nodes=liveness.lost_nodes(lost),
                                       **({"devices": accelerators.describe(built.roles)} if built.roles else {}))
  summary = add_to_summary(run_dir, fields, **details)
  print(f"report: {result.advice} ({os.path.join(run_dir, REPORT_FILE)})", flush=True)
  if summary["failed_writes"]:  # the driver node recorded them; the run is whole but for them
    raise RunWritesFailed(run_dir, summary["failed_writes"])
  summary["run_dir"] = run_dir
  return summary
