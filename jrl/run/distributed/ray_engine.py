"""The Ray engine (either stack): each node of the program in a Ray actor of its own (`RayNode`).

A `RayNode` builds its node in its own process from the node's class and arguments, serves the
node's public methods to the other nodes (`call`, on a pool of threads: an inference server's
`infer` waits for the other actors' requests), runs its `run()`, and stops at `stop()`. It keeps
the layout of a Launchpad node: its output in RUN_DIR/logs/<group>/<index> (appended to on
restart), its pid in RUN_DIR/logs/pids/<group>-<index>, a row in metrics/restarts.csv for each
restart. Ray restarts a restartable node's process when it dies (`max_restarts`) and runs its
`run()` again; the node learns from its incarnation (`node_io.incarnation`) that it continues.

Nodes reach each other through `RayHandle`s (by the actors' names) and the replay through
`ServedReplayClient` (jrl's `ReplayServer` in a RayNode). Ray 2.60 needs protobuf>=3.20.3, which the
full stack's TensorFlow 2.8 refuses, so Ray and Reverb are never installed together: on Ray the replay is
always jrl's own.
"""

import csv
import os
import sys
import threading
import time
import traceback
from typing import Any, Callable, Dict, Sequence, Tuple

import cloudpickle
import ray

# Nothing that imports JAX: a RayNode's process confines JAX (its environment) before it unpickles its node.
from jrl.run.distributed.node_env import INCARNATION_ENV, RESTARTS_FILE, RUN_DIR_ENV

_STOP = threading.Event()  # this process's node: set once the program stops


class RayHandle:
  """A node in a Ray actor as a `jrl.run.distributed.engine.Handle`, by the actor's name: what a node is
  built with is its peers' names, not their actor handles, so Ray can restart a node however long after
  the launcher made it (an actor's arguments in Ray's object store may be gone by then)."""

  def __init__(self, actor_name: str, namespace: str, name: str):
    self.actor_name, self.namespace, self.name = actor_name, namespace, name
    self._actor = None

  def __getstate__(self):
    return {"actor_name": self.actor_name, "namespace": self.namespace, "name": self.name, "_actor": None}

  @property
  def actor(self):
    if self._actor is None:
      self._actor = ray.get_actor(self.actor_name, namespace=self.namespace)
    return self._actor

  @property
  def address(self) -> str:
    return f"ray actor {self.name}"

  def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
    return ray.get(self.actor.call.remote(method, args, kwargs))

  def future(self, method: str, *args: Any, **kwargs: Any):
    return self.actor.call.remote(method, args, kwargs).future()


class RayEngine:
  """The engine's services to nodes that Ray runs (`jrl.run.distributed.engine.Engine`)."""

  name = "ray"

  def handle(self, raw) -> RayHandle:
    return raw

  def replay(self, raw: RayHandle):
    from jrl.replay.service import ServedReplayClient
    return ServedReplayClient(raw)

  def stop_event(self) -> threading.Event:
    return _STOP

  def stop(self) -> None:
    _STOP.set()  # the launcher sees the driver's run() return and stops the other nodes

  def wait_for_stop(self) -> None:
    _STOP.wait()


RAY = RayEngine()


def _count_restart(run_dir: str, name: str) -> int:
  """Adds this restart of node `name` to metrics/restarts.csv (launch.supervisor's columns); its
  incarnation: the restarts the file holds for the node."""
  path = os.path.join(run_dir, RESTARTS_FILE)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  rows = []
  if os.path.exists(path):
    with open(path, newline="") as f:
      rows = [row for row in csv.DictReader(f) if row["node"] == name]
  with open(path, "a", newline="") as f:
    writer = csv.writer(f)
    if f.tell() == 0:
      writer.writerow(["time", "node", "exit_code", "signal", "restart", "delay_seconds"])
    writer.writerow([f"{time.time():.3f}", name, "", "lost (ray restarted it)", len(rows) + 1, "0"])
  return len(rows) + 1


def node_payload(factory: Callable, args: Sequence[Any], kwargs: Dict[str, Any]) -> bytes:
  """What a RayNode builds its node from, pickled here and unpickled in its process once its
  environment is set (unpickling the node's class imports JAX)."""
  return cloudpickle.dumps((factory, tuple(args), dict(kwargs)))


class RayNode:
  """One node of a program, in the Ray actor process this is: see the module docstring. `env` is
  set before the node is unpickled from `payload` (`node_payload`): JAX confined to the CPU for the
  roles without accelerators; Ray has set CUDA_VISIBLE_DEVICES for those with."""

  def __init__(self, name: str, payload: bytes, run_dir: str, env: Dict[str, str]):
    self.name = name
    os.environ.update(env)
    os.environ[RUN_DIR_ENV] = run_dir
    os.environ.setdefault("JRL_HOST", ray.util.get_node_ip_address())  # the host column of its metrics
    restarted = ray.get_runtime_context().was_current_actor_reconstructed
    incarnation = _count_restart(run_dir, name) if restarted else 0
    os.environ[INCARNATION_ENV] = str(incarnation)
    group, index = name.split("/")
    log_path = os.path.join(run_dir, "logs", group, index)
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    out = open(log_path, "a", buffering=1)
    if restarted:
      out.write(f"\n===== {name} restarted (incarnation {incarnation}) =====\n")
    os.dup2(out.fileno(), 1)
    os.dup2(out.fileno(), 2)
    sys.stdout = sys.stderr = out
    pids = os.path.join(run_dir, "logs", "pids")
    os.makedirs(pids, exist_ok=True)
    with open(os.path.join(pids, f"{group}-{index}"), "w") as f:
      f.write(f"{os.getpid()}\n")
    factory, args, kwargs = cloudpickle.loads(payload)
    self._node = factory(*args, **kwargs)

  def devices(self) -> str:
    """This process's devices, as `jrl.accelerators.describe` names them: 'cuda:0' where Ray gave it a GPU
    (its CUDA_VISIBLE_DEVICES), else 'cpu'."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return f"cuda:{visible}" if visible else "cpu"

  def call(self, method: str, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    return getattr(self._node, method)(*args, **kwargs)

  def run(self) -> None:
    """Runs the node. An error ends its process, as a node's error ends its process under Launchpad:
    Ray then restarts a restartable node and runs it again, and names any other (the launcher reads
    the traceback in its log)."""
    try:
      self._node.run()
    except BaseException:  # noqa: BLE001 - the process ends with it
      traceback.print_exc()
      sys.stdout.flush()
      os._exit(1)

  def stop(self) -> None:
    _STOP.set()

  def pid(self) -> int:
    return os.getpid()

  def where(self) -> Tuple[str, str]:
    """(this process's Ray node id, that node's address): the host it runs on."""
    return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()
