"""A device run over several hosts: one `--backend device` process per host, joined by
`jax.distributed` into one loop over the devices of all (data-parallel: each process steps its
part of the envs and computes on its part of the batch).

  python -m launch.train --backend device --env gymnax:CartPole-v1 --launcher slurm \
      --hosts node1,node2 [--placement device=node1,node2] --run_dir DIR
  python -m launch.train --resume DIR [--launcher slurm --hosts node1,node2]

The launcher writes the run's config.json (the run as a whole: its hosts, `num_processes` P
= the hosts placed), then starts the processes through the same host agents, Slurm job or
command template, and heartbeat watch as a distributed Reverb program (`launch.cluster`).
Process k is `launch.train --resume DIR --process_id k --coordinator_address HOST0:PORT`:
every process continues the run directory (a new run has no checkpoint and starts over), and
a run with a coordinator address is one of the processes, not their launcher. Process 0 writes
the run (metrics, evaluations, checkpoints, policies, summary); process k > 0 keeps its own
record in DIR/processes/p<k> (`jrl.run.device.runner.follower_dir`).

Every process is needed: when one fails or its host is lost, the host agents stop the others,
and the launcher's error names it, the run's last checkpoint and the command that continues it.
"""

import dataclasses
import json
import os
import sys
from typing import Any, Dict, List

from jrl.errors import ConfigError
from jrl.experiment import files
from jrl.experiment.files import SUMMARY_FILE
from launch import cluster
from jrl.run.distributed import liveness, multihost
from launch.cluster import hosts_flag, last_checkpoint_line
from launch.progress import ProgressEcho
from jrl.run.distributed.placement import Placement, parse_placement

GROUP = "device"


def device_placement(exp) -> Placement:
  """The hosts that run a process (`--placement device=...`, default every host of `--hosts`),
  with their addresses; ConfigError naming the field."""
  hosts = cluster.resolve_hosts(exp)
  text = exp.placement or f"{GROUP}={','.join(h.name for h in hosts)}"
  placed = parse_placement(text, hosts, {GROUP: 1})
  others = sorted(set(placed.groups) - {GROUP})
  if others:
    raise ConfigError("placement", f"a device run places only its processes (device=HOST,...), not {', '.join(others)}")
  names = list(dict.fromkeys(placed.groups[GROUP]))
  if len(names) != len(placed.groups[GROUP]):
    raise ConfigError("placement", "a device run takes one process per host: name each host once")
  return Placement(tuple(placed.host(n) for n in names), {GROUP: tuple(names)})


def process_command(run_dir: str, exp, index: int, coordinator: str) -> List[str]:
  """Process `index`'s command: it continues the run directory with the fields a launch may set."""
  command = [sys.executable, "-m", "launch.train", "--resume", run_dir, "--process_id", str(index),
             "--coordinator_address", coordinator, "--steps", str(exp.steps),
             "--progress_seconds", str(exp.progress_seconds),
             "--checkpoint_every_steps", str(exp.checkpoint_every_steps),
             "--checkpoint_every_seconds", str(exp.checkpoint_every_seconds),
             "--keep_checkpoints", str(exp.keep_checkpoints)]
  return command + (["--stop_at_threshold"] if exp.stop_at_threshold else []) + (
      ["--resume_strict"] if exp.resume_strict else [])


def resume_hint(exp, placement: Placement, run_dir: str):
  """The line that ends a failure report: the last checkpoint, and the command that continues the
  run (on the hosts not lost)."""
  def hint(lost) -> str:
    remaining = [h for h in placement.hosts if h.name not in lost]
    hosts = hosts_flag(exp, remaining) if remaining else "HOSTS"
    return f"{last_checkpoint_line(run_dir)}; continue it with: python -m launch.train --resume {run_dir} --hosts {hosts}"
  return hint


def run_device_on_hosts(exp, agent_cfg) -> Dict[str, Any]:
  """Launches the processes of a device run on their hosts and waits for them; returns the
  summary (process 0's, with every process's final parameter digest). ConfigError for bad
  input (nothing written); RuntimeError with the report when a process or host failed."""
  placement = device_placement(exp)
  processes = len(placement.hosts)
  if exp.num_processes not in (1, processes):
    raise ConfigError("num_processes", f"a device run over hosts has one process per host ({processes} placed), "
                                       f"got {exp.num_processes}")
  exp = dataclasses.replace(exp, num_processes=processes, process_id=0, coordinator_address="")
  if exp.num_envs % processes:
    raise ConfigError("num_envs", f"must be divisible by the {processes} processes, got {exp.num_envs}")
  run_dir = files.prepare_run_dir(exp, agent_cfg)  # config.json: the run as a whole
  os.makedirs(multihost.launch_dir(run_dir), exist_ok=True)
  multihost.clear_launch_state(run_dir)
  coordinator = f"{placement.hosts[0].address}:{multihost.pick_port()}"
  hosts = {h.name: {"address": h.address,
                    "nodes": [{"title": f"{GROUP}/{k}", "command": process_command(run_dir, exp, k, coordinator),
                               "env": {}}]}
           for k, h in enumerate(placement.hosts)}
  plan = multihost.write_plan(run_dir, hosts, {"groups": [], "max_restarts": 0, "backoff_seconds": 0.0})
  print(f"[device] {processes} processes on {', '.join(h.name for h in placement.hosts)} "
        f"(coordinator {coordinator}): {run_dir}", flush=True)
  hint = resume_hint(exp, placement, run_dir)
  echo = ProgressEcho(os.path.join(run_dir, "logs", GROUP, "0"))  # the first process's progress lines
  echo.start()
  try:
    cluster.run_plan(exp, plan, run_dir, placement, hint)
  except RuntimeError as e:
    if liveness.read_lost(run_dir):  # the lost host's report ends with the hint already
      raise
    raise RuntimeError(f"{e}\n{hint([])}") from None
  finally:
    echo.stop()
  with open(os.path.join(run_dir, SUMMARY_FILE)) as f:
    summary = json.load(f)
  summary["process_digests"] = process_digests(run_dir, processes)
  summary["run_dir"] = run_dir
  return summary


def process_digests(run_dir: str, processes: int) -> List[str]:
  """The final parameter digest each process reported (process 0's summary, then each
  follower's record); '' for one that wrote none."""
  from jrl.run.device.runner import process_record_dir
  paths = [os.path.join(process_record_dir(run_dir, k), SUMMARY_FILE) for k in range(processes)]
  digests = []
  for path in paths:
    try:
      with open(path) as f:
        digests.append(json.load(f).get("params_digest", ""))
    except (OSError, ValueError):
      digests.append("")
  return digests
