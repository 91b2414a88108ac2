"""Replay served to other processes: what a distributed program's actors and learners see of it
(`ReplayClient`), and jrl's own server for where Reverb is not installed (`ReplayServer`).

A program's replay is one of two services, both behind `ReplayClient`:
- a Reverb server (the full stack): `jrl.replay.reverb_replay.ReverbReplayClient`;
- `ReplayServer` (any stack): the seeded buffer (`jrl.replay.buffer.SeededReplayBuffer`: FIFO
  eviction, uniform or prioritized sampling, a queue for on-policy trajectories, frames stored once)
  behind Reverb's rate limiter as jrl's tables set it (`RateLimiter`), in a process an engine serves
  (a Ray actor); `ServedReplayClient` is its client.

Reverb's semantics that jrl uses and `ReplayServer` keeps:
- samples per insert with an error buffer, and a minimum size (`SampleToInsertRatio`): a sample
  waits while it would put the samples more than the error buffer ahead of
  `samples_per_insert` x inserts, an insert while it would put them more than the buffer behind;
  inserts are free below the minimum size, samples wait for it;
- a queue table for trajectories sampled once (`Table.queue`): a sample takes the oldest items and
  removes them; an insert waits while the queue is full;
- priorities per item, updated by key (an evicted key is ignored); the sample's probabilities and
  the table's size for importance weights;
- frame sharing: an actor's writer sends each frame once (`add_frames`), items name them;
- counts of items inserted and sampled (the summary's replay_items_*), and a checkpoint of it all.
What it does not: Reverb's sampling is not seeded and runs many requests in flight in C++;
here each learner call's items are one request, drawn by the buffer's seeded generator in arrival
order of the calls.
"""

import concurrent.futures
import os
import threading
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Protocol, Sequence, Tuple

import numpy as np

from jrl.errors import Stopped
from jrl.outage import Outage, ServiceLost
from jrl.replay.batches import PrefetchIterator, PreparedBatch, SampledItems, items_per_fetch, make_assembler
from jrl.replay.buffer import SeededReplayBuffer
from jrl.replay.checkpoint_names import SERVED_REPLAY
from jrl.replay.spec import ReplaySpec
from jrl.timing import ASSEMBLE, NULL_TIMER, PLACE, RATE_LIMIT_WAIT, SAMPLE

WAIT_SLICE_S = 0.2  # a server-side wait returns this often, so that a stopping client is not held


def table_error_buffer(items_per_call: int, prefetch: int, samplers: int = 1) -> int:
  """The rate limiter's error buffer, in items, of a table that `samplers` learner processes
  sample through `prefetched_batches`, each `items_per_call` items per learner call with
  `prefetch` calls prepared ahead. One rule for embedded runs and distributed programs:

      samplers x (samples_ahead(items_per_call, prefetch) + 2 x items_per_call)

  (`rate_limited_table` raises it to 2 x max(1, samples_per_insert), the least Reverb takes).

  The limiter counts an item as sampled when a sampler takes it, not when the learner trains on
  it, and each sampler holds up to `samples_ahead` items its learner has not trained on yet. The
  buffer has room for all of them and two learner calls more, so the limiter never holds back a
  sampler from a call its learner is owed, even when a resumed run's (or a restarted learner
  node's) new samplers start while the restored limiter still counts what the old ones held; the
  two calls are the schedule's (`calls_due`): its first call comes as replay reaches its minimum
  size, a call ahead of the ratio, and calls are whole. An embedded run needs all of it: one
  thread inserts and waits for the learner's batches, so a sampler held by the limiter would hold
  the run. A distributed program's actors insert on their own, so there the rule sets the pace
  instead: with less room a restarted learner waits until the actors have inserted again what its
  predecessor had taken, with more the actors and the learner drift further from
  samples_per_insert before either waits on the other."""
  return samplers * (samples_ahead(items_per_call, prefetch) + 2 * items_per_call)


def samples_in_flight(num_items: int) -> int:
  """Sample requests the sampler's dataset keeps in flight, for calls of `num_items` items."""
  return max(2 * num_items, 16)


def samples_ahead(num_items: int, depth: int) -> int:
  """Items `prefetched_batches` can have sampled beyond the calls the learner has made: `depth`
  prepared calls, the one being prepared, the dataset's batch and its requests in flight (what
  `table_error_buffer` leaves room for)."""
  return (depth + 2) * num_items + samples_in_flight(num_items)


class ReplayInfo(NamedTuple):
  """A replay's counts, for a run's summary."""
  size: int            # items held
  items_inserted: int  # items inserted since the table began (a resumed one: its checkpoint's count on)
  items_sampled: int


class ItemWriter(Protocol):
  """What an actor's block writer writes to (`jrl.replay.adders`)."""
  items_inserted: int

  def insert(self, block: Any, priority: float) -> None: ...
  def add_frames(self, ids: np.ndarray, frames: np.ndarray) -> None: ...
  def flush(self) -> None: ...
  def close(self) -> None: ...


class ReplayClient(Protocol):
  """A program's replay as its nodes use it."""
  address: str
  kind: str  # 'reverb' or 'served': the summary's `replay`

  def writer(self, spec: ReplaySpec, num_envs: int, stop: threading.Event, deadline_s: float,
             log: Callable[[str], None], timer=NULL_TIMER) -> ItemWriter:
    """An actor's writer; `timer` gets its waits on the rate limiter as `rate_limit_wait`."""

  def batches(self, spec: ReplaySpec, example_item: Any, updates_per_call: int, batch_size: int, seed: int,
              place: Callable, depth: int, stop: Optional[threading.Event] = None, timer=None) -> PrefetchIterator:
    """A learner's batches, prepared `depth` calls ahead on a thread (`timer` is that thread's)."""

  def update_priorities(self, priorities: Dict[int, float]) -> None: ...

  def checkpoint(self, folder: str) -> None:
    """Writes the replay's contents into a checkpoint's replay folder (`checkpoint_names` says under
    which name)."""

  def info(self) -> ReplayInfo: ...


class RateLimiter:
  """Reverb's rate limiter as `reverb.rate_limiters.SampleToInsertRatio` (or `Queue`) sets it,
  counting items: the same arithmetic as Reverb's `RateLimiter::CanInsert` / `CanSample`."""

  def __init__(self, samples_per_insert: float, min_size: int, min_diff: float, max_diff: float):
    self.samples_per_insert, self.min_size = float(samples_per_insert), int(min_size)
    self.min_diff, self.max_diff = float(min_diff), float(max_diff)
    self.inserts = self.samples = self.deletes = 0

  @classmethod
  def sample_to_insert_ratio(cls, samples_per_insert: float, min_size: int, error_buffer: float) -> "RateLimiter":
    offset = samples_per_insert * min_size
    return cls(samples_per_insert, min_size, offset - error_buffer, offset + error_buffer)

  @classmethod
  def queue(cls, size: int) -> "RateLimiter":
    return cls(1.0, 1, 0.0, float(size))

  def can_insert(self, n: int) -> bool:
    if self.inserts + n - self.deletes <= self.min_size:
      return True
    return (self.inserts + n) * self.samples_per_insert - self.samples <= self.max_diff

  def can_sample(self, n: int) -> bool:
    if self.inserts - self.deletes < self.min_size:
      return False
    return self.inserts * self.samples_per_insert - self.samples - n >= self.min_diff

  def state(self) -> Dict[str, int]:
    return {"inserts": self.inserts, "samples": self.samples, "deletes": self.deletes}

  def restore(self, state: Dict[str, int]) -> None:
    self.inserts, self.samples, self.deletes = state["inserts"], state["samples"], state["deletes"]


def table_limiter(spec: ReplaySpec, error_buffer_items: float) -> RateLimiter:
  """The limiter of the spec's table, as `reverb_replay.make_table` builds it."""
  if spec.kind.sampled_once:
    return RateLimiter.queue(spec.max_items)
  return RateLimiter.sample_to_insert_ratio(spec.samples_per_insert, spec.min_items,
                                            max(float(error_buffer_items), 2.0 * max(1.0, spec.samples_per_insert)))


class ReplayServer:
  """The replay of a program without Reverb: a seeded buffer behind a rate limiter, thread-safe,
  its methods served to the actors and learners by an engine (each call on a thread of its own).

  Calls that the limiter holds wait at most WAIT_SLICE_S and then answer None (the client asks
  again, unless its program is stopping), so no call outlives a stop by more than that. Each writer's
  inserts are applied in the order it sent them (`sequence`), whatever the order the engine's
  threads deliver them in: a frame must arrive before the items that name it."""

  def __init__(self, spec: ReplaySpec, error_buffer_items: float, seed: int, write: Callable[[str, str, Any], None],
               read: Callable[[str, str], Any], restore_from: Optional[str] = None):
    """`write(folder, name, data)` and `read(folder, name)` keep the checkpoint's data (the run's
    format, `jrl.experiment.checkpoint_formats`); `restore_from`: a checkpoint's replay folder."""
    self._spec, self._write = spec, write
    self._buffer = SeededReplayBuffer(spec, seed=seed)
    self._limiter = table_limiter(spec, error_buffer_items)
    self._cond = threading.Condition()
    self._next: Dict[str, int] = {}  # writer -> the sequence number of its next insert
    if restore_from is not None:
      saved = read(restore_from, SERVED_REPLAY)
      self._buffer.restore(saved["buffer"])
      self._limiter.restore(saved["limiter"])

  def insert(self, writer: str, sequence: int, blocks: Sequence[Any], priorities: Sequence[float],
             frames: Optional[Tuple[np.ndarray, np.ndarray]] = None) -> Optional[int]:
    """Inserts `blocks` (with `frames` first, when the spec shares frames) as `writer`'s insert number
    `sequence`; None if the limiter (or an earlier insert of the writer) held it past WAIT_SLICE_S,
    else the items held."""
    deadline = time.monotonic() + WAIT_SLICE_S
    with self._cond:
      while self._next.get(writer, 0) != sequence or not self._limiter.can_insert(len(blocks)):
        if sequence < self._next.get(writer, 0):
          return self._buffer.size  # a repeat of one applied already (its answer was lost): done
        left = deadline - time.monotonic()
        if left <= 0:
          return None
        self._cond.wait(left)
      if frames is not None:
        self._buffer.add_frames(*frames)
      evicts = not self._spec.kind.sampled_once
      for block, priority in zip(blocks, priorities):
        full = evicts and self._buffer.size == self._spec.max_items
        self._buffer.insert(block, float(priority))
        self._limiter.inserts += 1
        self._limiter.deletes += full  # the oldest item made room (FIFO), as Reverb's remover deletes it
      self._next[writer] = sequence + 1
      self._cond.notify_all()
      return self._buffer.size

  def sample(self, num_items: int) -> Optional[SampledItems]:
    """`num_items` items (the oldest, removed, for a queue); None if the limiter held them past WAIT_SLICE_S."""
    deadline = time.monotonic() + WAIT_SLICE_S
    with self._cond:
      while not self._limiter.can_sample(num_items):
        left = deadline - time.monotonic()
        if left <= 0:
          return None
        self._cond.wait(left)
      sampled = self._buffer.sample(num_items)
      self._limiter.samples += num_items
      if self._spec.kind.sampled_once:
        self._limiter.deletes += num_items
      self._cond.notify_all()
      return sampled

  def update_priorities(self, priorities: Dict[int, float]) -> None:
    with self._cond:
      self._buffer.update_priorities(priorities)

  def checkpoint(self, folder: str) -> None:
    """Writes the contents, the limiter's counts and the sampling generator into `folder`."""
    with self._cond:
      os.makedirs(folder, exist_ok=True)
      self._write(folder, SERVED_REPLAY, {"buffer": self._buffer.state(), "limiter": self._limiter.state()})

  def info(self) -> ReplayInfo:
    with self._cond:
      return ReplayInfo(self._buffer.size, self._limiter.inserts, self._limiter.samples)


class ServedReplayClient:
  """`ReplayClient` of a `ReplayServer` that an engine serves: `handle` is the engine's handle of it
  (`jrl.run.distributed.engine.Handle`)."""

  kind = "served"

  def __init__(self, handle):
    self._handle = handle
    self.address = handle.address

  def writer(self, spec: ReplaySpec, num_envs: int, stop: threading.Event, deadline_s: float,
             log: Callable[[str], None], timer=NULL_TIMER) -> "ServedItemWriter":
    return ServedItemWriter(self._handle, stop, deadline_s, log, timer)

  def batches(self, spec: ReplaySpec, example_item: Any, updates_per_call: int, batch_size: int, seed: int,
              place: Callable, depth: int, stop: Optional[threading.Event] = None, timer=None) -> PrefetchIterator:
    stop = stop if stop is not None else threading.Event()
    num_items = items_per_fetch(spec, updates_per_call, batch_size)
    assemble_batch = make_assembler(spec, updates_per_call, batch_size, np.random.default_rng(seed))
    clock = timer if timer is not None else NULL_TIMER

    def produce() -> PreparedBatch:
      clock.enter(SAMPLE)
      sampled = None
      while sampled is None:
        if stop.is_set():
          clock.exit()
          raise Stopped("program stopping")
        sampled = self._handle.call("sample", num_items)
      clock.switch(ASSEMBLE)
      prepared = assemble_batch(sampled)
      clock.switch(PLACE)
      prepared = prepared._replace(batch=place(prepared.batch))
      clock.exit()
      return prepared

    return PrefetchIterator(produce, depth=depth, stop=stop, timer=timer)

  def update_priorities(self, priorities: Dict[int, float]) -> None:
    if priorities:
      self._handle.future("update_priorities", priorities)  # the learner does not wait for it

  def checkpoint(self, folder: str) -> None:
    self._handle.call("checkpoint", folder)

  def info(self) -> ReplayInfo:
    return ReplayInfo(*self._handle.call("info"))


class ServedItemWriter:
  """An actor's writer to a `ReplayServer`: each `insert` is one call, sent at once, with up to
  `max_in_flight` unanswered; frames ride with the next insert. A call the server's limiter holds
  is sent again until it is taken; `flush` waits for all. While the server does not answer (lost,
  or its limiter holds every insert) the outage is logged once per interval and ends in
  ServiceLost after `deadline_s`, as Reverb's writer does."""

  def __init__(self, handle, stop: threading.Event, deadline_s: float, log: Callable[[str], None],
               timer=NULL_TIMER, max_in_flight: int = 8):
    self._handle, self._stop, self._timer = handle, stop, timer
    self._name = f"{os.getpid()}-{id(self)}"
    self._sequence = 0
    self._in_flight: List[Tuple[Any, tuple]] = []  # (future, its arguments) in the order sent
    self._frames: List[Tuple[np.ndarray, np.ndarray]] = []
    self._max_in_flight = max_in_flight
    self._outage = Outage(f"replay server {handle.address}", deadline_s, log)
    self._deadline_s = deadline_s
    self.items_inserted = 0

  def add_frames(self, ids: np.ndarray, frames: np.ndarray) -> None:
    self._frames.append((np.asarray(ids), np.asarray(frames)))

  def insert(self, block: Any, priority: float) -> None:
    frames = None
    if self._frames:
      frames = (np.concatenate([i for i, _ in self._frames]), np.concatenate([f for _, f in self._frames]))
      self._frames = []
    args = (self._name, self._sequence, [block], [float(priority)], frames)
    self._sequence += 1
    self._in_flight.append((self._handle.future("insert", *args), args))
    self._wait(self._max_in_flight)
    self.items_inserted += 1

  def _wait(self, max_in_flight: int) -> None:
    """Until at most `max_in_flight` inserts are unanswered; one held by the limiter is sent again."""
    self._timer.enter(RATE_LIMIT_WAIT)
    try:
      while len(self._in_flight) > max_in_flight:
        future, args = self._in_flight[0]
        since = time.monotonic()
        while True:
          if self._stop.is_set():
            raise Stopped("stop requested while waiting on replay inserts")
          try:
            answer = future.result(timeout=0.2)
          except concurrent.futures.TimeoutError:
            answer = None
          except Exception as e:  # the server is gone or failing: wait it out until the deadline
            self._outage.failing(f"{type(e).__name__}: {e}", since=since)
            time.sleep(0.2)
            future = self._handle.future("insert", *args)
            continue
          if answer is not None:
            break
          if time.monotonic() - since >= self._deadline_s:
            raise ServiceLost(f"{self._outage.service} accepted no insert for {time.monotonic() - since:.0f}s "
                              "though it answers: its rate limiter holds inserts (is the learner sampling?)")
          future = self._handle.future("insert", *args)  # held by the limiter: ask again
        self._outage.ok()
        self._in_flight.pop(0)
    finally:
      self._timer.exit()

  def flush(self) -> None:
    self._wait(0)

  def close(self) -> None:
    self._in_flight = []
