"""One Launchpad program placed on several hosts: the plan, the host agent's inputs, the stop file.

The launching host builds the program as for local_mp, then binds every
node's server address to its host's cluster address (`placement`) and turns
each node into its process command (Launchpad's own local_mp executables).
The commands, the pickled node functions and the plan (`RUN_DIR/launch/`)
live in the run directory, which every host must see (a shared filesystem).
On each host `python -m launch.host RUN_DIR HOST` runs that host's nodes under
the supervisor, with their servers bound to the host's address.

Stopping: `lp.stop()` in a node (the evaluator at the budget) creates
`RUN_DIR/launch/STOP`; every host agent watches for it and stops its nodes.
A host whose node fails past its restarts writes its report next to it and
creates the stop file too, so the whole program ends.
"""

import dataclasses
import json
import os
import random
import shutil
import sys
from typing import Any, Dict, List, Optional, Set, Tuple

import portpicker

from jrl import accelerators
from jrl.experiment.files import write_json
from jrl.run.distributed.placement import Placement

LAUNCH_DIR = "launch"
PLAN_FILE = "plan.json"
STOP_FILE = "STOP"
# Written during a launch (jrl.run.distributed.liveness, launch.cluster), cleared at the next one.
ALIVE_DIR = "alive"
LOST_FILE = "lost_hosts.json"
EXIT_STATUS_FILE = "exit_status"


def launch_dir(run_dir: str) -> str:
  return os.path.join(run_dir, LAUNCH_DIR)


def stop_path(run_dir: str) -> str:
  return os.path.join(launch_dir(run_dir), STOP_FILE)


def failure_path(run_dir: str, host: str) -> str:
  return os.path.join(launch_dir(run_dir), f"failure-{host}.txt")


def clear_launch_state(run_dir: str) -> None:
  """Removes what an earlier launch of the run left that would end or mislead this one (a resumed
  run after a stop, a failure or a lost host): the stop file, failure reports, heartbeats, the
  lost-host record and the job's exit status."""
  folder = launch_dir(run_dir)
  for name in os.listdir(folder):
    if name in (STOP_FILE, LOST_FILE, EXIT_STATUS_FILE) or (name.startswith("failure-") and name.endswith(".txt")):
      os.remove(os.path.join(folder, name))
  shutil.rmtree(os.path.join(folder, ALIVE_DIR), ignore_errors=True)


class RequestStop:
  """The program stopper of a multi-host program: creates the stop file (picklable)."""

  def __init__(self, path: str):
    self.path = path

  def __call__(self):
    with open(self.path, "a"):
      pass


def fixed_address(address: str):
  """A Launchpad address builder that gives `address` (imported here: the rest of this module is
  also the launch state's, which engines without Launchpad read)."""
  from launchpad import address as lp_address

  class FixedAddress(lp_address.AbstractAddressBuilder):
    def build(self) -> str:
      return address

  return FixedAddress()


# Server ports are picked on the launching host for servers on other hosts. There, every socket the
# host opens itself (Slurm's step daemons, outgoing connections) takes a port from its ephemeral range,
# which the launching host cannot see: a port picked from that range can already be taken when the
# node binds it (a Slurm test-cluster run lost its evaluator this way). Ports below the range are
# only ever taken by a server that asks for one by number.
PORTS_FROM = 20_000
EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
_picked: Set[int] = set()


def ephemeral_range(path: str = EPHEMERAL_RANGE_FILE) -> Tuple[int, int]:
  """The kernel's ephemeral port range [first, last] (Linux's default where it cannot be read)."""
  try:
    with open(path) as f:
      first, last = map(int, f.read().split())
    return first, last
  except (OSError, ValueError):
    return 32768, 60999


def pick_port() -> int:
  """A port for a server on a host of the program: below the ephemeral range (the launching
  host's, which a cluster's hosts share), free here, and not picked before by this process."""
  rng = random.SystemRandom()
  below = ephemeral_range()[0]
  if below - PORTS_FROM < 1_000:  # an unusual range leaves too few ports below it
    return portpicker.pick_unused_port()
  for _ in range(1_000):
    port = rng.randrange(PORTS_FROM, below)
    if port not in _picked and portpicker.is_port_free(port):
      _picked.add(port)
      return port
  raise RuntimeError(f"no free port in [{PORTS_FROM}, {below}) after 1,000 tries")


def node_devices(placement: Placement, counts: Dict[str, int], gpus: Dict[str, int],
                 learner_devices: int = 0) -> Dict[Tuple[str, int], Dict[str, str]]:
  """(group, index) -> what to add to that node's environment: on a host given GPUs (`gpus`: host ->
  count, launch.cluster.gpu_requests), jrl.accelerators.place_roles over that host's nodes (the learner
  and servers on its GPUs, the others confined to the CPU); nothing on the other hosts."""
  envs: Dict[Tuple[str, int], Dict[str, str]] = {}
  for host in placement.hosts:
    if not gpus.get(host.name):
      continue
    on_host = placement.nodes_on(host.name, counts)
    local = {role: [i for g, i in on_host if g == role] for role in accelerators.ROLES}
    roles = accelerators.place_roles(
        accelerators.Accelerators("cuda", gpus[host.name]), min(learner_devices, gpus[host.name]),
        len(local["inference"]), len(local["actor"]), len(local["evaluator"]), len(local["replay"]),
        len(local["counter"]), len(local["learner"]))
    for role, indices in local.items():
      for process, index in zip(roles[role], indices):
        envs[(role, index)] = dict(process.env)
  return envs


def visible_through(env: Dict[str, str], visible: str) -> Dict[str, str]:
  """A node's environment with its CUDA_VISIBLE_DEVICES indices read through the host agent's own
  `visible` list: Slurm gives a step GPUs by their host numbers ('2,3'), and a node's device 0 is then
  GPU 2 ('' or no list: the node's indices are the host's)."""
  granted = [d for d in visible.split(",") if d.strip()]
  mine = env.get("CUDA_VISIBLE_DEVICES")
  if not granted or not mine:
    return env
  return {**env, "CUDA_VISIBLE_DEVICES": ",".join(granted[int(d)] for d in mine.split(","))}


def build_plan(program, placement: Placement, run_dir: str, restart: Dict[str, Any],
               gpus: Optional[Dict[str, int]] = None, learner_devices: int = 0) -> Dict[str, Any]:
  """Binds addresses, writes the node commands and returns the plan (also written to plan.json).
  `gpus` (host -> GPUs given to it) adds each node's devices to its environment (`node_devices`)."""
  from launchpad import context as lp_context
  folder = launch_dir(run_dir)
  os.makedirs(folder, exist_ok=True)
  clear_launch_state(run_dir)
  stopper = RequestStop(stop_path(run_dir))
  for label, nodes in program.groups.items():
    for node in nodes:
      node._initialize_context(lp_context.LaunchType.LOCAL_MULTI_PROCESSING, launch_config=None)
      node._launch_context._program_stopper = stopper  # not the launcher's pid: it is on another host
  for label, nodes in program.groups.items():
    for node in nodes:
      for handle in node.input_handles:
        handle.connect(node, label)
  for label, nodes in program.groups.items():
    for index, node in enumerate(nodes):
      host = placement.host_of(label, index)
      for address in node.addresses:
        address.bind(fixed_address(f"{host.address}:{pick_port()}"))

  hosts: Dict[str, Dict[str, Any]] = {h.name: {"address": h.address, "nodes": []} for h in placement.hosts}
  devices = node_devices(placement, {label: len(nodes) for label, nodes in program.groups.items()}, gpus or {},
                         learner_devices)
  for label, nodes in program.groups.items():
    commands = nodes[0].to_executables(nodes, label, nodes[0].launch_context)
    for index, command in enumerate(commands):
      args = list(command.command_as_list)
      data = args.index("--data_file") + 1
      shared = os.path.join(folder, f"{label}.pkl")  # Launchpad wrote it to a local temp folder
      if index == 0:  # one file per group; a resumed run's replaces its last session's (other addresses)
        shutil.copyfile(args[data], shared)
      args[data] = shared
      hosts[placement.host_of(label, index).name]["nodes"].append(
          {"title": f"{label}/{index}", "command": args,
           "env": {**command.env_overrides, **devices.get((label, index), {})}})
  return write_plan(run_dir, hosts, restart)


def write_plan(run_dir: str, hosts: Dict[str, Dict[str, Any]], restart: Dict[str, Any]) -> Dict[str, Any]:
  """The plan of `hosts` ({host: {"address", "nodes": [{"title", "command", "env"}]}}), written
  to RUN_DIR/launch/plan.json for the host agents; returned."""
  plan = {"hosts": hosts, "restart": restart, "python": sys.executable, "cwd": os.getcwd()}
  write_json(os.path.join(launch_dir(run_dir), PLAN_FILE), plan)
  return plan


@dataclasses.dataclass(frozen=True)
class PlannedCommand:
  """A node's process, as the supervisor takes it (Launchpad's CommandToLaunch shape)."""
  title: str
  command_as_list: List[str]
  env_overrides: Dict[str, str]


def read_plan(run_dir: str) -> Dict[str, Any]:
  with open(os.path.join(launch_dir(run_dir), PLAN_FILE)) as f:
    return json.load(f)


def host_commands(plan: Dict[str, Any], host: str, visible: str = "") -> List[PlannedCommand]:
  """The nodes `host` runs; `visible`: the host agent's own CUDA_VISIBLE_DEVICES (`visible_through`)."""
  return [PlannedCommand(n["title"], n["command"], visible_through(n["env"], visible))
          for n in plan["hosts"][host]["nodes"]]
