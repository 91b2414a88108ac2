"""Central batched inference (SEED RL style), independent of the RPC layer.

One request per actor step carries that actor's whole vector of observations.
Requests from different actors are gathered for up to `timeout_ms` (or until
every actor has asked) and answered by one jitted call of the agent's pure
`select_action`, vmapped over actors. Each actor's policy state (RNG key,
exploration schedule, and for a recurrent policy the core state of each of its envs)
lives here, one slot per actor; the actor sends which of its envs start an episode
(`is_first`), the policy resets their core state, and the extras it reports (a
recurrent policy's state at each step) go back with the actions.

Observations travel as msgpack bytes: courier on the pinned stack drops numpy
arguments (the call ends in Deadline Exceeded), while bytes arrive.
"""

import queue
import threading
import time
from typing import Any, Callable, Dict, List, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization

from jrl.actors.variables import VariableClient
from jrl.types import PolicyFns, PRNGKey


def encode(tree: Any) -> bytes:
  return serialization.msgpack_serialize(tree)


def decode(data: bytes) -> Any:
  return serialization.msgpack_restore(data)


class _Request:
  __slots__ = ("actor_id", "obs", "is_first", "done", "action", "extras", "error")

  def __init__(self, actor_id: int, obs: np.ndarray, is_first: np.ndarray):
    self.actor_id, self.obs, self.is_first = actor_id, obs, is_first
    self.done = threading.Event()
    self.action: Optional[np.ndarray] = None
    self.extras: Dict[str, np.ndarray] = {}
    self.error: Optional[BaseException] = None


class BatchedInference:
  """Serves `infer` calls from many threads; `serve` runs the batching loop."""

  def __init__(self, policy: PolicyFns, variables: VariableClient, key: PRNGKey, num_actors: int,
               num_envs: int, obs_shape, timeout_ms: float = 2.0, reply_timeout_s: float = 60.0):
    self._select = jax.jit(jax.vmap(policy.select_action, in_axes=(None, 0, 0, 0)))
    init = lambda k: policy.init(k, num_envs)
    self._states = jax.vmap(init)(jax.random.split(key, num_actors))  # one slot per actor
    self._variables = variables
    self._num_actors = num_actors
    self._obs_buffer = np.zeros((num_actors, num_envs) + tuple(obs_shape), np.float32)
    self._is_first_buffer = np.zeros((num_actors, num_envs), bool)
    self._timeout_s = timeout_ms / 1000.0
    # An actor counts as active while its last request is this recent.
    self._activity_window_s = 5 * self._timeout_s
    self._last_seen = np.full(num_actors, -np.inf)
    self._reply_timeout_s = reply_timeout_s
    self._requests: "queue.Queue[_Request]" = queue.Queue()
    self.batch_size_counts: Dict[int, int] = {}
    self.version = variables.version

  # Called by RPC threads.
  def infer(self, actor_id: int, obs_bytes: bytes) -> bytes:
    message = decode(obs_bytes)
    obs = np.asarray(message["obs"], np.float32)
    request = _Request(int(actor_id), obs, np.asarray(message["is_first"], bool))
    self._requests.put(request)
    if not request.done.wait(self._reply_timeout_s):
      raise TimeoutError(f"inference server gave no action within {self._reply_timeout_s}s")
    if request.error is not None:
      raise RuntimeError(f"inference failed: {request.error}")
    return encode({"action": request.action, "extras": request.extras, "version": self.version})

  def state(self) -> Any:
    """The policy state of every actor's slot (leading axis: actor)."""
    return jax.device_get(self._states)

  def restore(self, state: Any) -> None:
    """Replaces the slots' policy state; call before `serve`."""
    self._states = jax.device_put(state)

  def stats(self) -> Dict[str, float]:
    total = sum(self.batch_size_counts.values())
    mean = sum(k * v for k, v in self.batch_size_counts.items()) / total if total else 0.0
    return {"batches": float(total), "batch_mean": mean,
            **{f"batch_size_{k}": float(v) for k, v in sorted(self.batch_size_counts.items())}}

  # The serving loop.
  def serve(self, stop: threading.Event) -> None:
    while not stop.is_set():
      batch = self._collect()
      if batch:
        self._answer(batch)

  def _collect(self) -> List[_Request]:
    """The first request, then more until every recently active actor has asked or the
    timeout passes. Waiting only for actors seen lately (not all of them) keeps an actor
    that is blocked elsewhere (e.g. on a full replay queue) from costing every batch the
    whole timeout."""
    try:
      first = self._requests.get(timeout=0.1)
    except queue.Empty:
      return []
    batch = [first]
    now = time.monotonic()
    self._last_seen[first.actor_id] = now
    expected = int(np.sum(now - self._last_seen <= self._activity_window_s))
    deadline = now + self._timeout_s
    while len(batch) < expected:
      remaining = deadline - time.monotonic()
      if remaining <= 0:
        break
      try:
        request = self._requests.get(timeout=remaining)
      except queue.Empty:
        break
      self._last_seen[request.actor_id] = time.monotonic()
      batch.append(request)
    return batch

  def _answer(self, batch: List[_Request]) -> None:
    try:
      self._variables.maybe_update()
      self.version = self._variables.version
      present = np.zeros(self._num_actors, bool)
      for request in batch:
        self._obs_buffer[request.actor_id] = request.obs
        self._is_first_buffer[request.actor_id] = request.is_first
        present[request.actor_id] = True
      actions, extras, new_states = self._select(self._variables.params, self._obs_buffer, self._is_first_buffer,
                                                 self._states)
      keep = jnp.asarray(present)
      self._states = jax.tree_util.tree_map(
          lambda new, old: jnp.where(keep.reshape((-1,) + (1,) * (new.ndim - 1)), new, old), new_states, self._states)
      actions = np.asarray(actions)
      extras = {k: np.asarray(v) for k, v in extras.items()}
      self.batch_size_counts[len(batch)] = self.batch_size_counts.get(len(batch), 0) + 1
      for request in batch:
        request.action = actions[request.actor_id]
        request.extras = {k: v[request.actor_id] for k, v in extras.items()}
    except BaseException as e:  # every waiting actor hears of it
      for request in batch:
        request.error = e
      raise
    finally:
      for request in batch:
        request.done.set()


class InferenceClient:
  """An actor's policy that asks a central server through `infer(actor_id, obs_bytes) -> bytes`
  (a courier call in distributed runs, `BatchedInference.infer` in one process)."""

  def __init__(self, infer: Callable[[int, bytes], bytes], actor_id: int):
    self._infer = infer
    self._actor_id = actor_id
    self.version = 0
    self.extras: Dict[str, np.ndarray] = {}

  def __call__(self, obs: np.ndarray, is_first: np.ndarray) -> np.ndarray:
    message = {"obs": np.asarray(obs, np.float32), "is_first": np.asarray(is_first, bool)}
    reply = decode(self._infer(self._actor_id, encode(message)))
    self.version = int(reply["version"])
    self.extras = {k: np.asarray(v) for k, v in (reply.get("extras") or {}).items()}
    return np.asarray(reply["action"])
