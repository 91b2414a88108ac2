"""Launching the distributed program on Ray (`--engine ray`, the core stack's engine).

  run_on_ray(exp, agent_cfg) -> the run's summary, after the program ended and its report was written

The same nodes as the Launchpad program (`jrl.run.distributed`: counter, replay, learner processes,
inference servers, actors, the driver node on the run core), each in a Ray actor of its own
(`jrl.run.distributed.ray_engine.RayNode`). Replay is jrl's `ReplayServer` (`jrl.replay.service`:
Reverb's semantics as jrl uses them); Ray does not install beside the full stack's Reverb.

- Placement by role with Ray's resources: each actor asks for a CPU (on whichever host has one); the
  learner processes and inference servers ask for GPUs where the cluster has them
  (`jrl.accelerators.ray_gpus`; Ray sets their CUDA_VISIBLE_DEVICES); every other node asks for none,
  runs on the launcher's host and starts with JAX confined to the CPU (CPU_ONLY_ENV).
- `--ray_address` joins a running cluster (`ray start --head` on one host, `ray start --address` on
  the others); else this run starts a Ray of its own on this host, bound to loopback, with its
  dashboard off and its logs (and its nodes') in the run directory.
- Faults: a restartable node (actors, the driver, inference servers) whose process dies is restarted
  by Ray, up to --max_restarts, and its run() runs again (the summary's `restarts`); any other
  node lost, or one past its restarts, stops the program, naming it (the run resumes from its last
  checkpoint). Ctrl-C or SIGTERM: the learner checkpoints first, as on Launchpad; the same signal
  again stops at once.
"""

import dataclasses
import json
import os
import shutil
import signal
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from jrl import accelerators, compat, seeding
from jrl.errors import ConfigError
from jrl.experiment import checkpoint_formats
from jrl.experiment.builder import build_agent_parts
from jrl.experiment.checkpoint import RunWritesFailed
from jrl.experiment.config import ExperimentConfig
from jrl.experiment.files import REPORT_FILE, SUMMARY_FILE, resolve_paths, write_json
from jrl.replay.batches import items_per_fetch
from jrl.replay.service import ReplayServer, table_error_buffer
from jrl.run.core import add_to_summary
from jrl.run.distributed import liveness, multihost
from jrl.run.distributed.actor_node import ActorNode
from jrl.run.distributed.counter import Counter
from jrl.run.distributed.driver_node import DriverNode
from jrl.run.distributed.inference_node import InferenceNode
from jrl.run.distributed.learner_node import LearnerNode
from jrl.run.distributed.node_io import Session
from jrl.run.distributed.program_report import run_report
from jrl.run.distributed.sessions import ProgramStopped, prepare_session, restart_counts
from launch.failures import BLAME_ORDER, NodeFailure, last_traceback
from launch.progress import ProgressEcho

# Nodes that hold no state others depend on: restarted when they fail (as on Launchpad).
RESTARTABLE_GROUPS = ("actor", "evaluator", "inference")
STOP_CHECKPOINT_SECONDS = 60.0  # the most a stop from outside waits for the learner's checkpoint
STOP_GRACE_SECONDS = 10.0       # how long nodes get to end their run() after the stop, before they are killed
POLL_SECONDS = 0.2
HOST_WATCH_SECONDS = 1.0  # how often the launcher asks Ray which of its nodes (hosts) are alive


def default_engine() -> str:
  """The engine a distributed run takes without --engine: Launchpad where the full stack is, else Ray."""
  return "launchpad" if not compat.missing_distributed_stack() else "ray"


def check_ray_installed() -> None:
  import importlib.util
  if importlib.util.find_spec("ray") is None:
    raise ConfigError("engine", "'ray' needs Ray (ray==2.60.0, in the core stack's lock: 'make setup STACK=core'); "
                                "this install has none")


def _token_auth_as_ray_start_does() -> None:
  """Joining a cluster: token authentication on where a token is at hand and RAY_AUTH_MODE says
  nothing, as `ray start` decides it (Ray 2.60's `ray start --head` turns it on and writes
  ~/.ray/auth_token; ray.init joining a cluster would otherwise present no token)."""
  if "RAY_AUTH_MODE" in os.environ:
    return
  path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.join(os.path.expanduser("~"), ".ray", "auth_token")
  if os.environ.get("RAY_AUTH_TOKEN") or os.path.isfile(path):
    os.environ["RAY_AUTH_MODE"] = "token"


@dataclasses.dataclass
class _Started:
  """A node the launcher started: its name ('actor/3'), its RayNode handle, its run() (None: a service),
  and the Ray node (host) it runs on, once it has said (`where`)."""
  name: str
  actor: Any
  run: Any = None
  where: Any = None       # the pending answer of RayNode.where
  host: Optional[Tuple[str, str]] = None  # (Ray node id, its address)

  @property
  def group(self) -> str:
    return self.name.split("/")[0]


class HostLost(RuntimeError):
  """A Ray node (host) died with nodes the program cannot go on without; the message names them and
  the command that continues the run from its last checkpoint."""

  def __init__(self, host: str, nodes: List[str], run_dir: str):
    self.host, self.nodes = host, nodes
    super().__init__(f"host {host} lost (its Ray node died) with nodes {', '.join(nodes)}; the program stopped. "
                     f"The last checkpoint is kept; continue it with: python -m launch.train --resume {run_dir}")


class RayProgram:
  """A distributed run on Ray: its session, its nodes once started, and its stop."""

  def __init__(self, exp: ExperimentConfig, agent_cfg):
    self.exp, self.agent_cfg = exp, agent_cfg
    self.nodes: List[_Started] = []
    self.stop_signal: Optional[int] = None
    self.devices: Dict[str, List[str]] = {}
    self._errors: List[str] = []  # what Ray's raylets reported (see _quiet_errors)
    self._stop_now = threading.Event()
    self._own_ray: Optional[str] = None  # the temporary folder of a Ray this run started
    # The nodes' actors are named in a namespace of this launch: "learner/0" in "jrl-<run>-<pid>".
    self.namespace = f"jrl-{os.getpid()}-{int(time.time())}"

  # -- Ray itself --------------------------------------------------------------------------------

  def start_ray(self) -> None:
    """Joins `--ray_address`, or starts a Ray of this run's own on this host (loopback, no dashboard)."""
    import logging
    if self.exp.ray_address:
      _token_auth_as_ray_start_does()  # before Ray is imported: it reads RAY_AUTH_MODE then

    import ray
    quiet = dict(include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR, configure_logging=True)
    if self.exp.ray_address:
      host = self.exp.ray_address.rsplit(":", 1)[0]
      # Ray takes a 127.0.0.1 address for this host's outside address; a cluster on another loopback
      # address (`ray start --head --node-ip-address 127.0.0.2`) is joined as that node.
      local = dict(_node_ip_address=host) if host.startswith("127.") else {}
      try:
        ray.init(address=self.exp.ray_address, namespace=self.namespace, **local, **quiet)
      except ConnectionError as e:
        raise ConfigError("ray_address", f"no Ray cluster could be joined at {self.exp.ray_address} ({e}; is "
                                         "`ray start --head` running there, with RAY_AUTH_MODE as here?)") from None
      self._quiet_errors()
      return
    # Ray's sockets live under its temporary folder, whose path must stay short (AF_UNIX's 107 bytes): not
    # the run directory; its logs are copied there at the end.
    self._own_ray = tempfile.mkdtemp(prefix="jrl-ray-")
    # A CPU for each actor (they ask for one), and as many as the program has nodes: Ray starts that many
    # worker processes at once, and each node takes one of them instead of waiting for a new one.
    ray.init(num_cpus=self.node_count(), _temp_dir=self._own_ray, _node_ip_address="127.0.0.1",
             namespace=self.namespace, **quiet)
    self._quiet_errors()

  def node_count(self) -> int:
    exp = self.exp
    servers = exp.num_inference_servers if exp.inference == "server" else 0
    return 3 + exp.num_processes + servers + exp.num_actors  # counter, replay, driver, learners, servers, actors

  def check_cluster(self) -> None:
    """ConfigError (before any node starts) for a joined cluster that cannot hold the program: each actor
    asks Ray for a CPU."""
    import ray
    cpus = int(ray.cluster_resources().get("CPU", 0))
    if cpus < self.exp.num_actors:
      raise ConfigError("num_actors", f"{self.exp.num_actors} actors ask the Ray cluster for a CPU each; it has {cpus} "
                                      f"({self.exp.ray_address})")

  def _quiet_errors(self) -> None:
    """Ray prints the errors its raylets report (a worker died, a task is retried) on the driver's
    terminal whatever `log_to_driver` says; they are kept for logs/ray/errors.log instead: the launcher
    names the failures that matter itself (which node, its traceback, its restarts)."""
    import ray._private.worker as ray_worker

    def keep(data, ignore_prefix=False):
      del ignore_prefix
      self._errors.extend(f"({data.get('pid')}) {line}" for line in data.get("lines", []))

    ray_worker.print_to_stdstream = keep

  def stop_ray(self, run_dir: Optional[str]) -> None:
    """Ends this driver's Ray (and the Ray this run started); its logs and errors into RUN_DIR/logs/ray."""
    import ray
    ray.shutdown()
    if run_dir is not None and self._errors:
      os.makedirs(os.path.join(run_dir, "logs", "ray"), exist_ok=True)
      with open(os.path.join(run_dir, "logs", "ray", "errors.log"), "a") as f:
        f.writelines(line + "\n" for line in self._errors)
    if self._own_ray is not None and run_dir is None:
      shutil.rmtree(self._own_ray, ignore_errors=True)
    elif self._own_ray is not None:
      logs = os.path.join(self._own_ray, "session_latest", "logs")
      if os.path.isdir(logs):
        shutil.copytree(logs, os.path.join(run_dir, "logs", "ray"), dirs_exist_ok=True)
      shutil.rmtree(self._own_ray, ignore_errors=True)

  # -- the nodes ---------------------------------------------------------------------------------

  def _start(self, name: str, factory, args: Tuple, kwargs: Dict[str, Any], run_dir: str, gpus: float = 0.0,
             runs: bool = True) -> _Started:
    import ray

    from jrl.run.distributed.ray_engine import RayNode, node_payload
    restartable = name.split("/")[0] in RESTARTABLE_GROUPS
    env = {} if gpus else dict(accelerators.CPU_ONLY_ENV)
    # Placement by role: an actor asks for a CPU (it steps its envs there), the learner and the inference
    # servers for their GPUs, the services for nothing.
    actor_node = name.startswith("actor/")
    options = dict(name=name, namespace=self.namespace, num_cpus=1 if actor_node else 0, num_gpus=gpus,
                   max_concurrency=max(32, 4 * self.exp.num_actors + 8),
                   max_restarts=self.exp.max_restarts if restartable else 0,
                   max_task_retries=-1 if restartable else 0)
    if not actor_node and not gpus:
      # Asking for no resources, Ray would put it on any host; the services and the CPU roles stay on the
      # launcher's host, which the program cannot outlive anyway (not soft: Ray's soft affinity passes over
      # a host that offers no CPUs, as a head started with --num-cpus 0 does).
      from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
      options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(),
                                                                      soft=False)
    actor = ray.remote(RayNode).options(**options).remote(name, node_payload(factory, args, kwargs), run_dir, env)
    started = _Started(name, actor, actor.run.remote() if runs else None)
    self.nodes.append(started)
    return started

  def start_nodes(self, session: Session, counter_state) -> Dict[str, Any]:
    """Starts every node, services first; the handles the driver and a stop from outside use."""
    import ray

    from jrl.run.distributed.ray_engine import RAY, RayHandle
    exp, cfg, run_dir = self.exp, self.agent_cfg, session.run_dir
    parts = build_agent_parts(exp.agent, exp.env, cfg)
    gpus = accelerators.ray_gpus(ray.cluster_resources().get("GPU", 0.0), exp.learner_devices, exp.num_processes,
                                 exp.num_inference_servers if exp.inference == "server" else 0)

    def handle(started: _Started) -> RayHandle:
      return RayHandle(started.name, self.namespace, started.name)

    counter = handle(self._start("counter/0", Counter, (counter_state, exp.steps), {}, run_dir, runs=False))
    replay = self._start_replay(parts, session)
    learners = [handle(self._start(f"learner/{i}", LearnerNode, (exp, cfg, replay, counter, session, i),
                                   {"engine": RAY}, run_dir, gpus["learner"][i])) for i in range(exp.num_processes)]
    learner = learners[0]
    servers = []
    if exp.inference == "server":
      for server_id in range(exp.num_inference_servers):
        assigned = len(range(server_id, exp.num_actors, exp.num_inference_servers))
        servers.append(handle(self._start(f"inference/{server_id}", InferenceNode,
                                          (exp, cfg, learner, assigned, server_id, counter, session),
                                          {"engine": RAY}, run_dir, gpus["inference"][server_id])))
    for actor_id in range(exp.num_actors):
      server = servers[actor_id % len(servers)] if servers else None
      self._start(f"actor/{actor_id}", ActorNode, (actor_id, exp, cfg, replay, learner, counter, server, session),
                  {"engine": RAY}, run_dir)
    self._start("evaluator/0", DriverNode, (exp, cfg, learner, counter, servers, session, replay), {"engine": RAY},
                run_dir)
    return {"learner": learner, "counter": counter}

  def _start_replay(self, parts, session: Session):
    """The replay node (jrl's ReplayServer: Ray and Reverb never install together, see ray_engine);
    its handle, what the other nodes get for it."""
    from jrl.run.distributed.ray_engine import RayHandle
    exp, spec = self.exp, parts.replay_spec
    restore = os.path.join(session.checkpoint, "replay") if session.checkpoint else None
    items = items_per_fetch(spec, spec.kind.updates_per_call(exp.updates_per_call),
                            self.agent_cfg.batch_size // exp.num_processes)
    error_buffer = table_error_buffer(items, exp.prefetch, exp.num_processes)
    started = self._start("replay/0", ReplayServer,
                          (spec, error_buffer, seeding.env_seed(exp.seed, "replay", 0), checkpoint_formats.write,
                           checkpoint_formats.read, restore), {}, session.run_dir, runs=False)
    return RayHandle(started.name, self.namespace, started.name)

  # -- waiting, failures, stops ------------------------------------------------------------------

  def wait(self, handles: Dict[str, Any], run_dir: str) -> None:
    """Until the driver node ends the run (then every node is stopped), a node fails (NodeFailure), a
    host that the run cannot do without is lost (HostLost, after the learner's checkpoint where it
    lives), or a stop from outside (ProgramStopped, after the learner's checkpoint)."""
    import ray
    driver = next(n for n in self.nodes if n.group == "evaluator")
    pending = {n.run: n for n in self.nodes if n.run is not None}
    next_watch = 0.0
    while True:
      if self.stop_signal is not None:
        self._checkpoint_before_stop(handles, run_dir)
        self.stop_nodes()
        raise ProgramStopped(run_dir, self.stop_signal)
      if time.monotonic() >= next_watch:
        next_watch = time.monotonic() + HOST_WATCH_SECONDS
        lost = self._watch_hosts(run_dir)
        if lost is not None:
          self._checkpoint_before_stop(handles, run_dir, why=f"host {lost.host} lost")
          self.stop_nodes()
          raise lost
      done, _ = ray.wait(list(pending), timeout=POLL_SECONDS, num_returns=1)
      failed = []
      for ref in done:
        node = pending.pop(ref)
        try:
          ray.get(ref)
        except Exception as e:  # its process died past its restarts, or it is not restartable
          failed.append((node, e))
          continue
        if node is driver:
          self.devices = self._devices()
          self.stop_nodes()
          return
      if failed:
        node, error = min(failed, key=lambda f: BLAME_ORDER.index(f[0].group) if f[0].group in BLAME_ORDER else 99)
        self.stop_nodes()
        raise self._failure(node, error, run_dir)

  def _watch_hosts(self, run_dir: str) -> Optional["HostLost"]:
    """Which Ray node each jrl node runs on (asked once it runs), and the hosts Ray has found dead since:
    recorded as Launchpad's lost hosts are (liveness.read_lost: the driver's progress line, the summary);
    a HostLost when one held a node other than an actor, or every actor."""
    import ray
    for node in self.nodes:
      if node.host is None:
        if node.where is None:
          node.where = node.actor.where.remote()
        done, _ = ray.wait([node.where], timeout=0)
        if done:
          try:
            node.host = ray.get(node.where)
          except Exception:  # noqa: BLE001 - a node that died before it answered: asked again
            node.where = None
    dead = {n["NodeID"]: n.get("NodeManagerAddress", "?") for n in ray.nodes() if not n.get("Alive", True)}
    lost_now = [n for n in self.nodes if n.host is not None and n.host[0] in dead]
    if not lost_now:
      return None
    record = liveness.read_lost(run_dir)
    by_host: Dict[str, List[str]] = {}
    for node in lost_now:
      by_host.setdefault(node.host[1], []).append(node.name)
    for host, names in by_host.items():
      record[host] = {"nodes": sorted(set(record.get(host, {}).get("nodes", [])) | set(names)),
                      "expendable": all(name.startswith("actor/") for name in names), "silent_seconds": 0.0}
    os.makedirs(os.path.dirname(liveness.lost_path(run_dir)), exist_ok=True)
    write_json(liveness.lost_path(run_dir), record)
    actors_left = [n for n in self.nodes if n.group == "actor" and n not in lost_now]
    for node in lost_now:
      node.host, node.where = None, None  # a restarted node says where it is again
    essential = [name for names in by_host.values() for name in names if not name.startswith("actor/")]
    if essential or not actors_left:
      host = ", ".join(sorted(by_host))
      return HostLost(host, sorted(name for names in by_host.values() for name in names), run_dir)
    return None

  def _devices(self) -> Dict[str, List[str]]:
    """role -> each of its processes' devices (as `jrl.accelerators.describe`, for the summary)."""
    import ray
    named = ray.get([n.actor.devices.remote() for n in self.nodes], timeout=30)
    devices: Dict[str, List[str]] = {}
    for node, described in zip(self.nodes, named):
      devices.setdefault(node.group, []).append(described)
    return {role: devices[role] for role in accelerators.ROLES if role in devices}

  def _failure(self, node: _Started, error: Exception, run_dir: str) -> NodeFailure:
    log_path = os.path.join(run_dir, "logs", *node.name.split("/"))
    restartable = node.group in RESTARTABLE_GROUPS
    cause = "its process died" if "ActorDied" in type(error).__name__ or "ActorError" in type(error).__name__ \
        else f"{type(error).__name__}"
    return NodeFailure(node.name, cause, log_path, last_traceback(log_path),
                       restarts=restart_counts(run_dir).get(node.name, 0) if restartable else None)

  def _checkpoint_before_stop(self, handles, run_dir: str, why: str = "") -> None:
    if os.path.exists(os.path.join(run_dir, SUMMARY_FILE)):
      return
    again = "" if why else "; the same signal again stops at once"  # `why`: not a signal (a lost host)
    print(f"[launcher] {why + ': ' if why else ''}stopping: the learner writes a checkpoint first (at most "
          f"{STOP_CHECKPOINT_SECONDS:.0f} s{again})", flush=True)
    future = handles["learner"].future("checkpoint")
    deadline = time.monotonic() + STOP_CHECKPOINT_SECONDS
    while not future.done():
      if self._stop_now.is_set() or time.monotonic() > deadline:
        print("[launcher] no checkpoint before the stop: "
              + ("stopped at once" if self._stop_now.is_set() else f"none within {STOP_CHECKPOINT_SECONDS:.0f} s"),
              flush=True)
        return
      time.sleep(0.05)
    try:
      path, failed_policy = future.result()
    except Exception as e:  # noqa: BLE001 - the stop goes on; the line says what was not kept
      print(f"[launcher] no checkpoint before the stop: {type(e).__name__}: {e}", flush=True)
      return
    print(f"[launcher] checkpoint {os.path.relpath(path, run_dir)} written; stopping the program", flush=True)

  def stop_nodes(self) -> None:
    """Every node's stop event, a grace for their run() to end, then their processes killed."""
    import ray
    for node in self.nodes:
      try:
        node.actor.stop.remote()
      except Exception:  # noqa: BLE001 - a node already gone
        pass
    runs = [n.run for n in self.nodes if n.run is not None]
    if runs:
      ray.wait(runs, num_returns=len(runs), timeout=STOP_GRACE_SECONDS)
    for node in self.nodes:
      try:
        ray.kill(node.actor, no_restart=True)
      except Exception:  # noqa: BLE001
        pass

  def handle_signals(self):
    """SIGINT and SIGTERM note a stop from outside (the first waits for the learner's checkpoint; the
    same again stops at once). Returns a function that puts the previous handlers back."""
    previous = {}

    def noted(signum, frame):
      del frame
      if self.stop_signal is None:
        self.stop_signal = signum
      elif signum == self.stop_signal:
        self._stop_now.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
      previous[sig] = signal.signal(sig, noted)
    return lambda: [signal.signal(sig, handler) for sig, handler in previous.items()]


def run_on_ray(exp: ExperimentConfig, agent_cfg) -> Dict[str, Any]:
  """Runs the program on Ray and waits for it; the run's summary. RuntimeError (NodeFailure) naming a
  node that failed; ProgramStopped at Ctrl-C or SIGTERM; RunWritesFailed (after the report) when a
  checkpoint or policy snapshot was not written."""
  check_ray_installed()
  exp = resolve_paths(exp)
  build_agent_parts(exp.agent, exp.env, agent_cfg)  # config errors surface here, before anything starts
  if exp.inference == "server" and exp.num_inference_servers > exp.num_actors:
    raise ConfigError("num_inference_servers", f"must be <= num_actors ({exp.num_actors})")
  if exp.launcher != "local":
    raise ConfigError("launcher", "--engine ray places its nodes on the Ray cluster's hosts: join one with "
                                  "--ray_address (started with `ray start` on the hosts) instead of --launcher")
  if exp.num_processes > 1 and not exp.coordinator_address:
    import portpicker
    exp = dataclasses.replace(exp, coordinator_address=f"127.0.0.1:{portpicker.pick_unused_port()}")
  program = RayProgram(exp, agent_cfg)
  program.start_ray()
  restore_signals = program.handle_signals()  # after ray.init, which sets handlers of its own
  run_dir = None
  echo = None
  try:
    program.check_cluster()
    session, counter_state = prepare_session(exp, agent_cfg)  # the run directory, once the cluster can run it
    run_dir = session.run_dir
    if os.path.isdir(multihost.launch_dir(run_dir)):
      multihost.clear_launch_state(run_dir)  # an earlier session's lost hosts are not this one's
    echo = ProgressEcho(os.path.join(run_dir, "logs", "evaluator", "0"))
    echo.start()
    handles = program.start_nodes(session, counter_state)
    program.wait(handles, run_dir)
  finally:
    if echo is not None:
      echo.stop()
    restore_signals()
    program.stop_ray(run_dir)
  summary_path = os.path.join(run_dir, SUMMARY_FILE)
  if not os.path.exists(summary_path):
    raise ProgramStopped(run_dir, program.stop_signal)
  restarts = restart_counts(run_dir)
  lost = liveness.read_lost(run_dir)
  with open(summary_path) as f:
    summary = json.load(f)
  result, fields, details = run_report(run_dir, session, exp, agent_cfg, summary,
                                       os.cpu_count() if not exp.ray_address else None, restarts=restarts,
                                       restarts_total=sum(restarts.values()), lost_hosts=sorted(lost),
                                       lost_nodes=liveness.lost_nodes(lost), devices=program.devices)
  summary = add_to_summary(run_dir, fields, **details)
  print(f"report: {result.advice} ({os.path.join(run_dir, REPORT_FILE)})", flush=True)
  if summary["failed_writes"]:
    raise RunWritesFailed(run_dir, summary["failed_writes"])
  summary["run_dir"] = run_dir
  return summary
