"""Central batched inference (SEED RL style), independent of the RPC layer.

One request per actor step carries that actor's whole vector of observations.
Requests from different actors are gathered and answered by one jitted call of
the agent's pure `select_action`, vmapped over actors. Each actor's policy state
(RNG key, exploration schedule, and for a recurrent policy the core state of each
of its envs) lives here, one slot per actor; the actor sends which of its envs
start an episode (`is_first`), the policy resets their core state, and the extras
it reports (a recurrent policy's state at each step) go back with the actions.

Batching takes what is in flight: after the first request, the server waits for
every actor that asked recently (within a few timeouts), up to `timeout_ms`; an
actor held up elsewhere (a full replay queue) therefore stops costing each batch
the whole timeout. Requests that arrive while a batch is computed open the next.

Per request, the RPC thread only queues the payload and waits: decoding, the
policy, and encoding the replies run in the serving thread, so the GIL changes
hands once per request, not three times. Parameters stay on the device and are
replaced only when their version changes (`VariableClient`).

Observations travel as msgpack bytes: courier on the pinned stack drops numpy
arguments (the call ends in Deadline Exceeded), while bytes arrive. Courier's own
batched handler (`BuildBatchedHandlerWrapper`) never answers a call that has
arguments on this stack (tested: ints, bytes, lists), so batching happens here.
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
from jrl.cpu_jit import jit_per_step
from jrl.timing import COLLECT, IDLE, INFERENCE_WAIT, NULL_TIMER, PARAM_FETCH, POLICY, REPLY, PhaseTimer
from jrl.types import PolicyFns, PRNGKey


def encode(tree: Any) -> bytes:
  return serialization.msgpack_serialize(tree)


def decode(data: bytes) -> Any:
  return serialization.msgpack_restore(data)


class _Request:
  __slots__ = ("actor_id", "payload", "done", "reply", "error")

  def __init__(self, actor_id: int, payload: bytes):
    self.actor_id, self.payload = actor_id, payload
    self.done = threading.Event()
    self.reply: Optional[bytes] = None
    self.error: Optional[BaseException] = None


def _select_and_keep(select_action):
  """The policy vmapped over actor slots; slots not in the batch keep their state."""
  select = jax.vmap(select_action, in_axes=(None, 0, 0, 0))

  def step(params, obs, is_first, states, present):
    actions, extras, new_states = select(params, obs, is_first, states)
    keep = lambda new, old: jnp.where(present.reshape((-1,) + (1,) * (new.ndim - 1)), new, old)
    return actions, extras, jax.tree_util.tree_map(keep, new_states, states)

  return jit_per_step(step)


class BatchedInference:
  """Serves `infer` calls from many threads; `serve` runs the batching loop.

  `timer` (a `PhaseTimer`, made here by default) times the serving thread: `idle` (no
  request), `collect` (waiting for more actors to fill the batch), `param_fetch`, `policy`
  (decode and the jitted call) and `reply` (encode and wake the callers).
  """

  def __init__(self, policy: PolicyFns, variables: VariableClient, key: PRNGKey, num_actors: int,
               num_envs: int, obs_shape, timeout_ms: float = 2.0, reply_timeout_s: float = 60.0,
               timer: Optional[PhaseTimer] = None, obs_dtype=np.float32):
    self._select = _select_and_keep(policy.select_action)
    init = lambda k: policy.init(k, num_envs)
    self._states = jax.vmap(init)(jax.random.split(key, num_actors))  # one slot per actor
    self._variables = variables
    self._num_actors = num_actors
    self._obs_buffer = np.zeros((num_actors, num_envs) + tuple(obs_shape), obs_dtype)  # uint8 frames stay uint8
    self._is_first_buffer = np.zeros((num_actors, num_envs), bool)
    self._timeout_s = timeout_ms / 1000.0
    # An actor counts as active while its last request is this recent.
    self._activity_window_s = 5 * self._timeout_s
    self._last_seen = np.full(num_actors, -np.inf)
    self._reply_timeout_s = reply_timeout_s
    self._requests: "queue.Queue[_Request]" = queue.Queue()
    self.batch_size_counts: Dict[int, int] = {}
    self.version = variables.version
    self.timer = timer if timer is not None else PhaseTimer(base=IDLE)

  # Called by RPC threads.
  def infer(self, actor_id: int, payload: bytes) -> bytes:
    """`payload`: msgpack of {"obs": [E, ...] in the env spec's dtype (float32, uint8 frames, bool
    planes), "is_first": [E] bool}; the reply: msgpack
    of {"action", "extras", "version"}."""
    request = _Request(int(actor_id), payload)
    self._requests.put(request)
    if not request.done.wait(self._reply_timeout_s):
      raise TimeoutError(f"inference server gave no action within {self._reply_timeout_s}s")
    if request.error is not None:
      raise RuntimeError(f"inference failed: {request.error}")
    return request.reply

  def state(self) -> Any:
    """The policy state of every actor's slot (leading axis: actor)."""
    return jax.device_get(self._states)

  def restore(self, state: Any) -> None:
    """Replaces the slots' policy state; call before `serve`."""
    self._states = jax.device_put(state)

  def stats(self) -> Dict[str, Any]:
    """Batches answered, their mean size, and the histogram {size: count}."""
    counts = dict(self.batch_size_counts)
    total = sum(counts.values())
    mean = sum(k * v for k, v in counts.items()) / total if total else 0.0
    return {"batches": float(total), "batch_mean": mean,
            **{f"batch_size_{k}": float(v) for k, v in sorted(counts.items())}}

  # The serving loop.
  def serve(self, stop: threading.Event) -> None:
    timer = self.timer
    if isinstance(timer, PhaseTimer):
      timer.start()
    try:
      while not stop.is_set():
        batch = self._collect()
        if batch:
          self._answer(batch)
    finally:
      if isinstance(timer, PhaseTimer):
        timer.stop()

  def _collect(self) -> List[_Request]:
    """The first request, then more until every recently active actor has asked or the
    timeout passes."""
    try:
      first = self._requests.get(timeout=0.1)  # the timer's base phase: idle
    except queue.Empty:
      return []
    self.timer.enter(COLLECT)
    try:
      batch = [first]
      now = time.monotonic()
      self._last_seen[first.actor_id] = now
      expected = int(np.sum(now - self._last_seen <= self._activity_window_s))
      deadline = now + self._timeout_s
      while len(batch) < expected:
        try:  # what is already queued, without waiting
          request = self._requests.get_nowait()
        except queue.Empty:
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
    finally:
      self.timer.exit()

  def _answer(self, batch: List[_Request]) -> None:
    timer = self.timer
    timer.enter(PARAM_FETCH)
    try:
      self._variables.maybe_update()  # a device copy only when the version changed
      self.version = version = self._variables.version
      timer.switch(POLICY)
      present = np.zeros(self._num_actors, bool)
      for request in batch:
        message = decode(request.payload)
        self._obs_buffer[request.actor_id] = message["obs"]
        self._is_first_buffer[request.actor_id] = message["is_first"]
        present[request.actor_id] = True
      actions, extras, self._states = self._select(self._variables.params, self._obs_buffer,
                                                   self._is_first_buffer, self._states, present)
      actions, extras = jax.device_get((actions, extras))
      timer.switch(REPLY)
      self.batch_size_counts[len(batch)] = self.batch_size_counts.get(len(batch), 0) + 1
      for request in batch:
        i = request.actor_id
        request.reply = encode({"action": actions[i], "extras": {k: v[i] for k, v in extras.items()},
                                "version": version})
    except BaseException as e:  # every waiting actor hears of it
      for request in batch:
        request.error = e
      raise
    finally:
      timer.exit()
      for request in batch:
        request.done.set()


class InferenceClient:
  """An actor's policy that asks a central server through `infer(actor_id, payload) -> bytes`
  (a courier call in distributed runs, `BatchedInference.infer` in one process). `timer`
  gets the wait for the reply as `inference_wait` (encoding and decoding stay in the
  caller's phase)."""

  def __init__(self, infer: Callable[[int, bytes], bytes], actor_id: int, timer=None):
    self._infer = infer
    self._actor_id = actor_id
    self.version = 0
    self.extras: Dict[str, np.ndarray] = {}
    self.timer = timer if timer is not None else NULL_TIMER

  def __call__(self, obs: np.ndarray, is_first: np.ndarray) -> np.ndarray:
    payload = encode({"obs": np.asarray(obs), "is_first": np.asarray(is_first, bool)})
    self.timer.enter(INFERENCE_WAIT)
    try:
      reply = self._infer(self._actor_id, payload)
    finally:
      self.timer.exit()
    reply = decode(reply)
    self.version = int(reply["version"])
    self.extras = {k: np.asarray(v) for k, v in (reply.get("extras") or {}).items()}
    return np.asarray(reply["action"])
