"""Where the nodes of a distributed program run: a host list and a placement of node groups.

  --hosts "node1,node2,node3"                       (Slurm resolves the addresses)
  --hosts "node1=10.200.0.1,node2=10.200.0.2"       (explicit addresses)
  --placement "replay,learner,counter,evaluator=node1 learner,inference=node2 actor=node2,node3"

A placement is a list of `groups=hosts` terms separated by spaces or
semicolons. A group listed under several hosts, or given several hosts, spreads
its nodes over them in order: learner process i goes to the i-th learner host,
actor i and inference server i round-robin over theirs. Every group of the
program must be placed; the learner needs a host per process.
"""

import dataclasses
import re
from typing import Dict, List, Sequence, Tuple

from jrl.errors import ConfigError

# "device": the processes of a device run over several hosts (`launch.device_hosts`), one per host.
GROUPS = ("counter", "replay", "learner", "inference", "actor", "evaluator", "device")
_HOST_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclasses.dataclass(frozen=True)
class Host:
  name: str
  address: str  # "" until resolved (Slurm: scontrol; the template launcher: given)


@dataclasses.dataclass(frozen=True)
class Placement:
  hosts: Tuple[Host, ...]
  groups: Dict[str, Tuple[str, ...]]  # group -> host names its nodes cycle over

  def host_of(self, group: str, index: int) -> Host:
    names = self.groups[group]
    return self.host(names[index % len(names)])

  def host(self, name: str) -> Host:
    return next(h for h in self.hosts if h.name == name)

  def nodes_on(self, host: str, counts: Dict[str, int]) -> List[Tuple[str, int]]:
    """(group, index) of every node placed on `host`, given how many nodes each group has."""
    return [(g, i) for g in GROUPS for i in range(counts.get(g, 0)) if self.host_of(g, i).name == host]


def parse_hosts(text: str) -> Tuple[Host, ...]:
  hosts: List[Host] = []
  for term in filter(None, (t.strip() for t in text.replace(";", ",").split(","))):
    name, _, address = term.partition("=")
    name, address = name.strip(), address.strip()
    if not _HOST_NAME.match(name):
      raise ConfigError("hosts", f"'{name}' is not a host name")
    if any(h.name == name for h in hosts):
      raise ConfigError("hosts", f"host '{name}' is listed twice")
    hosts.append(Host(name, address))
  if not hosts:
    raise ConfigError("hosts", "is empty: list the hosts, e.g. --hosts node1,node2,node3")
  return tuple(hosts)


def default_placement(hosts: Sequence[Host]) -> str:
  """Services on the first host, learner processes and inference servers spread from the
  first, actors over every host but the first (all hosts when there is one)."""
  names = [h.name for h in hosts]
  actors = names[1:] or names
  return (f"replay,counter,evaluator={names[0]} learner={','.join(names)} inference={','.join(actors)} "
          f"actor={','.join(actors)}")


def parse_placement(text: str, hosts: Sequence[Host], counts: Dict[str, int]) -> Placement:
  """Validates the placement against the hosts and the program's node counts
  (`counts`: group -> number of nodes; groups with 0 nodes need no host)."""
  known = {h.name for h in hosts}
  groups: Dict[str, List[str]] = {}
  for term in filter(None, re.split(r"[\s;]+", text.strip())):
    if "=" not in term:
      raise ConfigError("placement", f"'{term}' is not GROUPS=HOSTS (e.g. actor=node2,node3)")
    left, right = term.split("=", 1)
    names = [h for h in right.split(",") if h]
    for name in names:
      if name not in known:
        raise ConfigError("placement", f"host '{name}' is not in --hosts ({', '.join(sorted(known))})")
    if not names:
      raise ConfigError("placement", f"'{term}' names no host")
    for group in filter(None, left.split(",")):
      if group not in GROUPS:
        raise ConfigError("placement", f"unknown group '{group}' (groups: {', '.join(GROUPS)})")
      groups.setdefault(group, []).extend(names)
  for group in GROUPS:
    if counts.get(group, 0) and group not in groups:
      raise ConfigError("placement", f"group '{group}' is not placed on any host")
  learners = counts.get("learner", 0)
  if learners > len(groups.get("learner", [])):
    raise ConfigError("placement", f"{learners} learner processes (num_processes) but "
                                   f"{len(groups.get('learner', []))} learner host(s) placed")
  return Placement(tuple(hosts), {g: tuple(h) for g, h in groups.items()})
