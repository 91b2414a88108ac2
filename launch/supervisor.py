"""Runs the node processes of a local_mp program and restarts those that may be restarted.

Launchpad's local_mp launch turns each node into a command (its process entry
with `--lp_task_id`) and hands them to the launcher registered for `terminal`
in `run_locally`. `launch()` registers `Supervisor` there: a WorkerManager, so
Launchpad's stopping is kept (`lp.stop()` in a node SIGTERMs this process, as
does Ctrl-C; the nodes get SIGTERM, then SIGKILL after
`lp_termination_notice_secs`), that also keeps each node's command,
environment and log. A node of a restartable group that exits with an error
or a signal is started again after a backoff (doubling with each restart of
that node) up to `max_restarts` times; it reruns the same command, so its
servers bind the same ports and clients reconnect, and `JRL_INCARNATION` tells
it how many times it has been restarted (JRL_RUN_DIR, which run it belongs to). Any other failure, or one past the
limit, stops the program; `wait()` raises NodeFailure, naming the node, once
every process has ended. A node that exits cleanly (status 0) is not restarted.

A stop from outside (Ctrl-C or SIGTERM to the launcher) first runs `before_stop` when one is set
(the learner's checkpoint: `launch.distributed.launch_program` sets it), then stops the nodes as
above; the same signal again stops them at once. The nodes run in a process group of their own,
so a terminal's Ctrl-C reaches the launcher alone and the nodes stay up for that checkpoint.
`stop_signal` is the signal that stopped the program (None when it ended by itself).

Files: node output in RUN_DIR/logs/<group>/<index> (appended to on restart,
after a marker line), the current pid of each node in
RUN_DIR/logs/pids/<group>-<index>, one row per restart in
RUN_DIR/metrics/restarts.csv.
"""

import contextlib
import csv
import dataclasses
import io
import os
import signal
import subprocess
import sys
import time
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from absl import flags
import launchpad as lp
from launchpad.launch import worker_manager
from launchpad.launch.run_locally import run_locally

from jrl.run.distributed.liveness import die_with_parent
from jrl.run.distributed.node_env import INCARNATION_ENV, RESTARTS_FILE, RUN_DIR_ENV
from launch.failures import BLAME_ORDER, NodeFailure, describe_exit, last_traceback  # noqa: F401 (used by launchers)

TERMINAL = "jrl_supervised"
POLL_SECONDS = 0.1


@dataclasses.dataclass(frozen=True)
class RestartPolicy:
  groups: Tuple[str, ...] = ()  # groups whose nodes are restarted when they fail
  max_restarts: int = 0         # per node
  backoff_seconds: float = 1.0  # before the first restart of a node; doubles with each one

  def delay(self, restart: int) -> float:
    return self.backoff_seconds * 2 ** (restart - 1)


@dataclasses.dataclass
class _Node:
  name: str                  # "<group>/<index>"
  command: List[str]
  env: Dict[str, str]
  log_path: str
  incarnation: int = 0       # restarts so far
  log_start: int = 0         # where this incarnation's output begins in the log

  @property
  def group(self) -> str:
    return self.name.split("/")[0]


def _blame_rank(group: str) -> int:
  return BLAME_ORDER.index(group) if group in BLAME_ORDER else len(BLAME_ORDER)


class Supervisor(worker_manager.WorkerManager):
  """Starts the commands, each node's output in its log; restarts per `policy`."""

  before_stop: Optional[Callable[[], None]] = None  # run first at a stop from outside (its own time limit)
  stop_signal: Optional[int] = None  # SIGINT or SIGTERM, when the program was stopped from outside
  _stop_pending = False              # a stop from outside that waits for `before_stop` (in `wait`)

  def __init__(self, commands: Sequence, run_dir: str, policy: RestartPolicy, env: Dict[str, str],
               node_envs: Optional[Mapping[str, Mapping[str, str]]] = None):
    if not flags.FLAGS.is_parsed():  # WorkerManager reads lp_termination_notice_secs (lp.launch parses them too)
      flags.FLAGS(sys.argv, known_only=True)
    super().__init__(kill_main_thread=False)  # the launcher outlives its nodes to report on them
    self._policy, self._run_dir = policy, run_dir
    self._log_dir = os.path.join(run_dir, "logs")
    self._pid_dir = os.path.join(self._log_dir, "pids")
    self._restart_log = os.path.join(run_dir, RESTARTS_FILE)
    self._nodes: Dict[int, _Node] = {}  # by pid of the running process
    self._pending: Dict[str, Tuple[float, _Node]] = {}  # restarts waiting out their backoff
    self.restarts: Dict[str, int] = {}
    self.failure: Optional[NodeFailure] = None
    os.makedirs(self._pid_dir, exist_ok=True)
    try:
      for command in commands:
        name = command.title
        # node_envs: a node's own additions by name ("learner/0"), e.g. its accelerators (jrl.accelerators).
        self._spawn(_Node(name, list(command.command_as_list),
                          {**command.env_overrides, **env, **(node_envs or {}).get(name, {})},
                          os.path.join(self._log_dir, name)))
    except BaseException:
      self._kill()
      raise

  def _spawn(self, node: _Node) -> None:
    os.makedirs(os.path.dirname(node.log_path), exist_ok=True)
    with open(node.log_path, "a" if node.incarnation else "w") as log:
      if node.incarnation:
        log.write(f"\n[supervisor] {time.strftime('%Y-%m-%d %H:%M:%S')} restart {node.incarnation} of {node.name}\n")
        log.flush()
      node.log_start = log.tell()
      env = {**os.environ, **node.env, INCARNATION_ENV: str(node.incarnation), RUN_DIR_ENV: self._run_dir}
      # Launchpad's entry script puts only its own folder first on sys.path: the working
      # directory goes first, so that nodes import what `python -m launch.train` could
      # (a custom agent `--agent pkg.module`, an env factory `--env pkg.module:function`).
      env["PYTHONPATH"] = os.pathsep.join(p for p in (os.getcwd(), env.get("PYTHONPATH")) if p)
      # A node dies with this process (its host agent, or the launcher): none outlives its host's agent.
      process = subprocess.Popen(node.command, env=env, stdout=log, stderr=log, preexec_fn=_node_preexec)
    self._nodes[process.pid] = node
    self._active_workers[node.name].append(process)
    self._workers_count[node.name] += 1
    pid_file = os.path.join(self._pid_dir, node.name.replace("/", "-"))
    with open(pid_file + ".tmp", "w") as f:
      f.write(f"{process.pid}\n")
    os.replace(pid_file + ".tmp", pid_file)
    if self._stop_event.is_set():  # a stop came in while it was starting
      process.send_signal(signal.SIGTERM)

  def _record_restart(self, node: _Node, returncode: int, restart: int, delay: float) -> None:
    os.makedirs(os.path.dirname(self._restart_log), exist_ok=True)
    new = not os.path.exists(self._restart_log)
    with open(self._restart_log, "a", newline="") as f:
      writer = csv.writer(f)
      if new:
        writer.writerow(["time", "node", "exit_code", "signal", "restart", "delay_seconds"])
      writer.writerow([f"{time.time():.3f}", node.name, returncode if returncode >= 0 else "",
                       signal.Signals(-returncode).name if returncode < 0 else "", restart, f"{delay:g}"])

  def _failed(self, node: _Node, returncode: int) -> None:
    cause = describe_exit(returncode)
    restartable = node.group in self._policy.groups
    done = self.restarts.get(node.name, 0)
    if restartable and done < self._policy.max_restarts:
      restart = done + 1
      self.restarts[node.name] = restart
      delay = self._policy.delay(restart)
      self._pending[node.name] = (time.monotonic() + delay,
                                  dataclasses.replace(node, incarnation=restart))
      self._record_restart(node, returncode, restart, delay)
      print(f"[supervisor] {node.name} {cause}; restart {restart}/{self._policy.max_restarts} in {delay:g}s",
            flush=True)
      return
    self.failure = NodeFailure(node.name, cause, node.log_path, last_traceback(node.log_path, node.log_start),
                               restarts=done if restartable else None)
    self._pending.clear()

  def _check_workers(self):
    """Reaps exited nodes, restarts or fails them, starts restarts that are due. Holds self._mutex."""
    stopping = self._stop_event.is_set()
    exited = []
    for label, workers in self._active_workers.items():
      running = []
      for process in workers:
        returncode = process.poll()
        if returncode is None:
          running.append(process)
        else:
          exited.append((self._nodes.pop(process.pid), returncode))
      self._active_workers[label] = running
    if stopping:
      self._pending.clear()  # never restart once the program is stopping
    else:
      for node, returncode in sorted(exited, key=lambda e: _blame_rank(e[0].group)):
        if returncode != 0 and self.failure is None:
          self._failed(node, returncode)
      now = time.monotonic()
      for name, (due, node) in list(self._pending.items()):
        if due <= now:
          del self._pending[name]
          self._spawn(node)
    running = any(self._active_workers.values())
    if self.failure is not None and running and not stopping:
      self._stop()
    elif not running and not self._pending:
      self._disable_alarm()

  def _sigterm(self):
    self._stop_from_outside(signal.SIGTERM)

  def _stop_by_user(self):
    self._stop_from_outside(signal.SIGINT)

  def _stop_from_outside(self, signum: int) -> None:
    """A signal handler (main thread; it may have interrupted `wait` holding the mutex, so it
    only takes note): the first SIGINT or SIGTERM leaves the stop to `wait`, after `before_stop`;
    the same signal again (or any, without `before_stop`) stops the nodes now, as Launchpad does."""
    first = self.stop_signal is None
    if first:
      self.stop_signal = signum
    if first and self.before_stop is not None and not self._stop_event.is_set():
      self._stop_pending = True
      return
    if not first and signum != self.stop_signal and self._stop_pending:
      return  # Ctrl-C and a parent's SIGTERM both reached the launcher: one stop
    self._stop_pending = False
    if signum == signal.SIGINT:
      super()._stop_by_user()
    else:
      super()._sigterm()

  def _checkpoint_then_stop(self) -> None:
    """Runs `before_stop` (a failure is one line: the program stops all the same), then stops
    the nodes, unless a second signal has stopped them meanwhile."""
    try:
      self.before_stop()
    except Exception as e:  # noqa: BLE001 - the stop goes on; the line says what was not kept
      print(f"[supervisor] no checkpoint before the stop: {type(e).__name__}: {e}", flush=True)
    if self._stop_pending:
      self._stop_pending = False
      with self._mutex:
        if self.stop_signal == signal.SIGINT:
          super()._stop_by_user()
        else:
          super()._sigterm()

  def _stop_or_kill(self):
    """Launchpad's, without its countdown: "Waiting for workers to stop for Ns." is printed each
    second with a carriage return, which runs the lines together outside a terminal while nodes
    stop within their grace time. Its other lines (workers that did not stop in time) are kept."""
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
      super()._stop_or_kill()
    for line in said.getvalue().replace("\r", "\n").splitlines():
      if line.strip() and "Waiting for workers to stop" not in line:
        print(line, flush=True)

  def wait(self, labels_to_wait_for=None, raise_error=True, return_on_first_completed=False):
    """Until every node has ended and no restart is pending; then raises the failure, if any."""
    del labels_to_wait_for, return_on_first_completed
    while True:
      if self._stop_pending:
        self._checkpoint_then_stop()
      with self._mutex:
        self._check_workers()
        if not any(self._active_workers.values()) and not self._pending:
          break
      time.sleep(POLL_SECONDS)
    if self.failure is not None and raise_error:
      raise self.failure


def _node_preexec() -> None:
  """In a node's process before exec: a process group of its own (a terminal's Ctrl-C goes to
  the launcher, which stops the nodes), and death with its parent."""
  os.setpgrp()
  die_with_parent()


def launch(program: lp.Program, run_dir: str, policy: RestartPolicy, env: Dict[str, str],
           node_envs: Optional[Mapping[str, Mapping[str, str]]] = None) -> Supervisor:
  """Launches `program` with local_mp, one supervised process per node; `env` is added to each, and
  `node_envs[name]` to node `name` ("group/index")."""
  run_locally._LOCAL_LAUNCHER_MAP[TERMINAL] = lambda commands: Supervisor(commands, run_dir, policy, env, node_envs)
  if TERMINAL not in run_locally.SEPARATE_TERMINAL_MODES:
    run_locally.SEPARATE_TERMINAL_MODES += (TERMINAL,)
  try:
    return lp.launch(program, launch_type=lp.LaunchType.LOCAL_MULTI_PROCESSING, terminal=TERMINAL)
  finally:
    del run_locally._LOCAL_LAUNCHER_MAP[TERMINAL]
