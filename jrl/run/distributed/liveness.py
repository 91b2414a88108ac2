"""Host liveness of a multi-host program: heartbeats, the watch that notices a lost host, and what
follows from it.

Every host agent (`launch.host`) rewrites `RUN_DIR/launch/alive/HOST` every `HEARTBEAT_SECONDS`
(the run directory is shared by every host). The launcher's `HostWatch` judges each heartbeat by
when *it* last saw the file change, on its own monotonic clock, so the hosts' clocks need not
agree. A host silent for `deadline` seconds (`--host_deadline_seconds`) is lost; so is one that has
not reported `max(deadline, FIRST_HEARTBEAT_SECONDS)` after the hosts started (`HostWatch.start`:
the Slurm job runs, or the template's commands were started; a job waiting in the queue loses no
host); and so is, when the job ends, a host whose agent ended without its last word
(`HostWatch.settle`: killed before its silence reached the deadline):

- its nodes are recorded in `RUN_DIR/launch/lost_hosts.json` (the evaluator's progress lines and
  metric rows, and the run's summary, read it);
- if every node on it is one the run can do without (actors), the run goes on;
- if it ran a node the run cannot do without (learner, replay, counter, evaluator, inference
  server), the watch writes the host's failure report, naming the host, its nodes and the
  command that resumes the run on the other hosts, and stops the program (the stop file).

A node process also dies with its host agent (`die_with_parent`, set by the supervisor), so a
host agent that is killed takes its nodes with it, as a crashed machine would.
"""

import ctypes
import json
import os
import signal
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from jrl.experiment.files import write_json
from jrl.run.distributed import multihost

HEARTBEAT_SECONDS = 2.0
# An agent's first heartbeat follows its start by Python's and the stack's imports, which on a
# cluster's cold shared filesystem can take a minute; a later silence has only the deadline.
FIRST_HEARTBEAT_SECONDS = 120.0
ALIVE_DIR, LOST_FILE = multihost.ALIVE_DIR, multihost.LOST_FILE
# Groups whose nodes the run can do without: an actor's loss costs throughput, not the run.
EXPENDABLE_GROUPS = ("actor",)
_PR_SET_PDEATHSIG = 1


try:  # resolved here, in the parent: the child between fork and exec only calls it
  _prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: the stop file remains the way nodes end
  _prctl = None


def die_with_parent() -> None:
  """In a child before exec (`preexec_fn`): the kernel kills it when its parent dies (Linux)."""
  if _prctl is not None:
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def alive_path(run_dir: str, host: str) -> str:
  return os.path.join(multihost.launch_dir(run_dir), ALIVE_DIR, host)


def lost_path(run_dir: str) -> str:
  return os.path.join(multihost.launch_dir(run_dir), LOST_FILE)


class Heartbeat(threading.Thread):
  """A host agent's heartbeat: its file rewritten every `HEARTBEAT_SECONDS` until `stop()`."""

  def __init__(self, run_dir: str, host: str, every: float = HEARTBEAT_SECONDS):
    super().__init__(name=f"heartbeat-{host}", daemon=True)
    self._path, self._every, self._halt = alive_path(run_dir, host), every, threading.Event()
    os.makedirs(os.path.dirname(self._path), exist_ok=True)

  def run(self) -> None:
    beat = 0
    while True:
      beat += 1
      write_json(self._path, {"beat": beat, "pid": os.getpid(), "time": time.time()})
      if self._halt.wait(self._every):
        return

  def stop(self) -> None:
    """The agent ends: its last word says so, and a watch does not take the silence for a loss."""
    self._halt.set()
    self.join(timeout=2 * self._every)
    write_json(self._path, {"ended": True, "pid": os.getpid(), "time": time.time()})


def read_lost(run_dir: str) -> Dict[str, Dict]:
  """{host: {"nodes": [...], "expendable": bool, "silent_seconds": s}} of the hosts lost so far."""
  try:
    with open(lost_path(run_dir)) as f:
      return json.load(f)
  except (OSError, ValueError):
    return {}


def lost_nodes(lost: Dict[str, Dict]) -> List[str]:
  return sorted(node for record in lost.values() for node in record["nodes"])


def describe_lost(lost: Dict[str, Dict]) -> str:
  """'node3 (actor/1, actor/3)' for every lost host; '' when none is."""
  return ", ".join(f"{host} ({', '.join(record['nodes'])})" for host, record in sorted(lost.items()))


def placement_without(hosts: Sequence[str], groups: Dict[str, Sequence[str]], lost: Sequence[str]) -> Tuple[str, str]:
  """(--hosts, --placement) that avoid the lost hosts: each group keeps its other hosts, and a
  group left with none goes to the first remaining host."""
  remaining = [h for h in hosts if h not in lost]
  placed = {group: [h for h in names if h not in lost] or remaining[:1] for group, names in groups.items()}
  return ",".join(remaining), " ".join(f"{group}={','.join(names)}" for group, names in placed.items())


def _ended(heartbeat: str) -> bool:
  """Whether a heartbeat is its agent's last word (`Heartbeat.stop`); a torn read is not."""
  try:
    return bool(json.loads(heartbeat).get("ended"))
  except ValueError:
    return False


class HostWatch:
  """The launcher's watch over the host agents' heartbeats (see the module docstring). `poll()`
  often; it returns the hosts newly found lost."""

  def __init__(self, run_dir: str, plan: Dict, deadline: float, resume_hint: Callable[[Sequence[str]], str],
               log: Callable[[str], None] = print, clock: Callable[[], float] = time.monotonic,
               first_heartbeat: float = FIRST_HEARTBEAT_SECONDS):
    self._run_dir, self._deadline, self._hint, self._log, self._clock = run_dir, deadline, resume_hint, log, clock
    self._first_deadline = max(deadline, first_heartbeat)
    self._nodes = {host: [node["title"] for node in entry["nodes"]] for host, entry in plan["hosts"].items()}
    # Per host: the heartbeat text last seen and when the watch saw it change (None: not yet).
    self._last: Dict[str, Tuple[Optional[str], Optional[float]]] = {host: (None, None) for host in self._nodes}
    self._started: Optional[float] = None
    self.lost: Dict[str, Dict] = {}

  def start(self) -> None:
    """The hosts' agents are starting: from now on a host that has not reported is counted silent."""
    if self._started is None:
      self._started = self._clock()

  @property
  def essential_lost(self) -> bool:
    return any(not record["expendable"] for record in self.lost.values())

  def poll(self) -> List[str]:
    if os.path.exists(multihost.stop_path(self._run_dir)):
      return []  # the program is stopping: its agents end, and their silence is no loss
    if self._started is None:
      return []  # the job waits in the queue: no agent could have reported
    now, newly = self._clock(), []
    for host, (seen, since) in self._last.items():
      if host in self.lost:
        continue
      text = self._heartbeat(host)
      if text is not None and _ended(text):
        continue  # its agent ended cleanly
      if text != seen:
        self._last[host] = (text, now)
      elif since is not None and now - since >= self._deadline:
        newly.append(host)
        self._lose(host, now - since)
      elif since is None and now - self._started >= self._first_deadline:
        newly.append(host)
        waited = now - self._started
        self._lose(host, waited, how=f"no heartbeat in the {waited:.0f}s since the hosts started")
    return newly

  def settle(self) -> List[str]:
    """The job has ended, so every host agent has: one whose last heartbeat is not its last word
    was killed, whether or not the deadline had passed (a run can finish sooner than that). Those
    hosts are lost now; returns them."""
    now, newly = self._clock(), []
    for host, (_, since) in self._last.items():
      if host in self.lost or self._ended_cleanly(host):
        continue
      newly.append(host)  # killed, or never reported (silent since the hosts started, if they did)
      quiet_since = since if since is not None else self._started
      self._lose(host, now - quiet_since if quiet_since is not None else 0.0,
                 how="its agent ended without its last heartbeat")
    return newly

  def others_ended(self) -> bool:
    """Whether every host not lost has ended cleanly (its agent's last word)."""
    return all(host in self.lost or self._ended_cleanly(host) for host in self._nodes)

  def _ended_cleanly(self, host: str) -> bool:
    text = self._heartbeat(host)
    return text is not None and _ended(text)

  def _heartbeat(self, host: str) -> Optional[str]:
    """The host's heartbeat file as it is now; None if it has none."""
    try:
      with open(alive_path(self._run_dir, host)) as f:
        return f.read()
    except OSError:
      return None

  def _lose(self, host: str, silent: float, how: str = "") -> None:
    nodes = self._nodes[host]
    expendable = all(node.split("/")[0] in EXPENDABLE_GROUPS for node in nodes)
    self.lost[host] = {"nodes": nodes, "expendable": expendable, "silent_seconds": round(silent, 1)}
    write_json(lost_path(self._run_dir), self.lost)
    how = how or f"no heartbeat for {silent:.0f}s"
    what = f"host {host} lost ({how}): it ran {', '.join(nodes) or 'no node'}"
    if expendable:
      self._log(f"[launch] {what}; the run {'finished' if how.startswith('its agent') else 'goes on'} without them")
      return
    report = f"{what}, which the run cannot do without; the program stopped. {self._hint(sorted(self.lost))}"
    self._log(f"[launch] {report}")
    with open(multihost.failure_path(self._run_dir, host), "w") as f:
      f.write(report + "\n")
    multihost.RequestStop(multihost.stop_path(self._run_dir))()
